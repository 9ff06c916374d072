"""Frozen caches of any size and any content: crafted files, symbolic links, a memory budget, loading off the loop.

Over real HTTP where it is about serving (the mirror in a uvicorn thread, the simulator a real
OpenAI-compatible stub server); the frozen trees are real files, one of them a named pipe so a
test can hold a file "loading" for as long as it likes without any timing.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import requests

from stabletoolbench_mirror.core.protocol import encode_answer
from stabletoolbench_mirror.stores import FrozenCache
from stabletoolbench_mirror.upstream.tooldocs import ToolDocs
from tests.helpers import paths
from tests.helpers.openai_stub import OpenAIStub

REPO = paths.REPO
SIM_ANSWER = {"error": "", "response": "simulated"}


def payload(api: str, tool_input: dict[str, Any], tool: str = "crafted") -> dict[str, Any]:
    return {"category": "Data", "tool_name": tool, "api_name": api, "tool_input": json.dumps(tool_input),
            "strip": "", "toolbench_key": ""}


def write_api(root: Path, api: str, text: str, tool: str = "crafted") -> Path:
    folder = root / "Data" / f"{tool}_for_Data"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{api}.json"
    path.write_text(text, encoding="utf-8")
    return path


DEEP = '{"{\'q\': \'x\'}": ' + "[" * 100_000 + "]" * 100_000 + "}"
SURROGATE = '{"{\'q\': \'x\'}": {"error": "", "response": "bad \\ud800 text"}}'
GOOD = json.dumps({"{'q': 'x'}": {"error": "", "response": "good answer"}})


def crafted_tree(root: Path) -> None:
    write_api(root, "deep", DEEP)
    write_api(root, "surrogate", SURROGATE)
    write_api(root, "good", GOOD)


def sim_reply(body: dict[str, Any]) -> Any:
    from tests.helpers.openai_stub import Reply

    return Reply(content=json.dumps(SIM_ANSWER))


# -- issue 10 item 4: crafted files --------------------------------------------------------------


def test_crafted_files_fall_through_to_the_simulator_with_one_warning(tmp_path: Path, settings_factory, serve, caplog) -> None:
    crafted_tree(tmp_path / "frozen")
    with OpenAIStub(sim_reply) as stub:
        settings = settings_factory(frozen_caches=[str(tmp_path / "frozen")],
                                    simulator={"enabled": True, "api_base": stub.api_base, "max_retries": 0})
        server = serve(settings)
        caplog.set_level(logging.WARNING)
        for api in ("deep", "surrogate"):
            for n in range(3):
                r = server.post(payload(api, {"q": "x"} if n == 0 else {"q": f"x{n}"}))
                assert r.status_code == 200, r.text
                assert r.json() == SIM_ANSWER
                assert r.headers["x-stm-source"] == "simulated"
        assert stub.count == 6
        # the good file of the same tool is still served from the tree
        r = server.post(payload("good", {"q": "x"}))
        assert r.status_code == 200 and r.json() == {"error": "", "response": "good answer"}
        assert r.headers["x-stm-outcome"] == "hit"
    for api in ("deep", "surrogate"):
        warnings = [rec.getMessage() for rec in caplog.records if f"{api}.json" in rec.getMessage()]
        assert len(warnings) == 1, warnings
        assert "skipped" in warnings[0]


def test_crafted_file_replay_mode_answers_the_miss_error(tmp_path: Path, settings_factory, serve) -> None:
    crafted_tree(tmp_path / "frozen")
    server = serve(settings_factory(mode="replay", frozen_caches=[str(tmp_path / "frozen")]))
    for api in ("deep", "surrogate"):
        r = server.post(payload(api, {"q": "x"}))
        assert r.status_code == 200
        assert r.json()["error"] == "API not working error..."
        assert r.headers["x-stm-outcome"] == "unanswered"


def test_cache_import_reports_crafted_files_and_goes_on(tmp_path: Path) -> None:
    crafted_tree(tmp_path / "frozen")
    env = {k: v for k, v in os.environ.items() if not k.startswith("STM_")}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run([sys.executable, "-m", "stabletoolbench_mirror", "cache", "import", str(tmp_path / "frozen"),
                           "--store-path", str(tmp_path / "store"), "-q"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 1, (proc.stdout, proc.stderr)  # something was left out: say so in the status
    assert "unreadable files: 2" in proc.stdout
    assert "deep.json" in proc.stdout and "nested too deeply" in proc.stdout
    assert "surrogate.json" in proc.stdout and "surrogate" in proc.stdout
    assert "added:            1" in proc.stdout
    from stabletoolbench_mirror.stores import DiskcacheStore

    with DiskcacheStore(tmp_path / "store") as store:
        record = store.get("Data/crafted_for_Data/good", "{'q': 'x'}")
        assert record is not None and record.answer == {"error": "", "response": "good answer"}


# -- issue 10 item 7: symbolic links ---------------------------------------------------------------


def symlinked_tree(tmp_path: Path) -> Path:
    outside = tmp_path / "outside"
    write_api(outside, "secret", GOOD, tool="elsewhere")
    write_api(outside / "single", "one", GOOD, tool="elsewhere")
    root = tmp_path / "frozen"
    write_api(root, "good", GOOD)
    (root / "Data" / "crafted_for_Data" / "linked.json").symlink_to(outside / "Data" / "elsewhere_for_Data" / "secret.json")
    (root / "Data" / "elsewhere_for_Data").symlink_to(outside / "single" / "Data" / "elsewhere_for_Data", target_is_directory=True)
    # a link that stays inside the tree is fine
    (root / "Data" / "crafted_for_Data" / "alias.json").symlink_to(root / "Data" / "crafted_for_Data" / "good.json")
    return root


def test_symlinks_out_of_a_frozen_tree_are_refused_with_a_warning(tmp_path: Path, settings_factory, serve, caplog) -> None:
    root = symlinked_tree(tmp_path)
    caplog.set_level(logging.WARNING)
    server = serve(settings_factory(mode="replay", frozen_caches=[str(root)]))
    for api, tool in (("linked", "crafted"), ("one", "elsewhere")):
        r = server.post(payload(api, {"q": "x"}, tool=tool))
        assert r.status_code == 200 and r.headers["x-stm-outcome"] == "unanswered", r.text
        assert any("symbolic link" in rec.getMessage() and f"{api}.json" in rec.getMessage() for rec in caplog.records)
    r = server.post(payload("alias", {"q": "x"}))
    assert r.headers["x-stm-outcome"] == "hit" and r.json()["response"] == "good answer"


def test_symlinks_are_followed_when_allowed(tmp_path: Path, settings_factory, serve) -> None:
    root = symlinked_tree(tmp_path)
    server = serve(settings_factory(mode="replay", frozen_caches=[str(root)], allow_symlinks=True))
    for api, tool in (("linked", "crafted"), ("one", "elsewhere")):
        r = server.post(payload(api, {"q": "x"}, tool=tool))
        assert r.headers["x-stm-outcome"] == "hit" and r.json()["response"] == "good answer"


def test_cache_import_refuses_symlinks_out_of_the_tree(tmp_path: Path) -> None:
    from stabletoolbench_mirror.snapshots.tree_import import import_tree
    from stabletoolbench_mirror.stores import DiskcacheStore

    root = symlinked_tree(tmp_path)
    with DiskcacheStore(tmp_path / "store") as store:
        summary = import_tree(store, root, progress=False, allow_symlinks=False)
        assert summary.added == 2  # good.json and the inside alias.json
        assert len(summary.bad_files) == 2 and all("symbolic link" in b for b in summary.bad_files)
        assert store.get("Data/crafted_for_Data/linked", "{'q': 'x'}") is None


def test_symlinks_out_of_the_tools_folder_are_refused(tmp_path: Path, caplog) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    doc = {"tool_name": "Secret Tool", "tool_description": "", "api_list": [{"name": "peek", "description": "d"}]}
    (outside / "secret_tool.json").write_text(json.dumps(doc))
    (outside / "Other").mkdir()
    (outside / "Other" / "other_tool.json").write_text(json.dumps({**doc, "tool_name": "Other Tool"}))
    tools = tmp_path / "tools"
    (tools / "Data").mkdir(parents=True)
    (tools / "Data" / "secret_tool.json").symlink_to(outside / "secret_tool.json")
    (tools / "Other").symlink_to(outside / "Other", target_is_directory=True)
    caplog.set_level(logging.WARNING)
    refused = ToolDocs(tools)
    assert refused.find_by_names("Data", "secret_tool", "peek") is None
    assert refused.find_by_names("Other", "other_tool", "peek") is None
    assert sum("symbolic link" in r.getMessage() for r in caplog.records) == 2
    allowed = ToolDocs(tools, allow_symlinks=True)
    assert allowed.find_by_names("Data", "secret_tool", "peek") is not None
    assert allowed.find_by_names("Other", "other_tool", "peek") is not None


# -- issue 13: a memory budget with eviction ------------------------------------------------------------


def budget_tree(root: Path, files: int = 12, entries: int = 40) -> dict[tuple[str, str], str]:
    expected = {}
    for f in range(files):
        data = {}
        for i in range(entries):
            key = str({"q": f"item {i}", "page": i % 3})
            answer = {"error": "", "response": f"file {f} answer {i} " + "é€😀" * (i % 4) + "x" * (i * 7)}
            data[key] = answer
            expected[(f"Data/crafted_for_Data/api_{f}", key)] = encode_answer(answer)
        write_api(root, f"api_{f}", json.dumps(data, indent=1, ensure_ascii=f % 2 == 0))
    return expected


def test_memory_budget_evicts_and_reloads_byte_identical(tmp_path: Path) -> None:
    expected = budget_tree(tmp_path / "frozen")
    one_file = FrozenCache(tmp_path / "frozen")
    one_file.get("Data/crafted_for_Data/api_0", next(iter(expected))[1])
    per_file = one_file.memory_used
    cache = FrozenCache(tmp_path / "frozen", memory_budget=per_file * 3)
    for _ in range(2):
        for (api, key), body in expected.items():
            record = cache.get(api, key)
            assert record is not None and record.body == body
            assert cache.memory_used <= cache.memory_budget + per_file
            kept = cache.memory()  # the answers kept besides the indexes stay within their fifth of the budget
            assert kept["bytes"] - cache.memory_used <= cache.bodies_budget
    assert 0 < kept["answers_kept"] < len(expected)
    assert cache.evictions >= 12  # every pass over 12 files with room for 3 evicts
    assert len(cache.memory()) and cache.memory()["files"] <= 4
    # canonical lookups after eviction: same bytes
    for (api, key), body in list(expected.items())[::7]:
        from stabletoolbench_mirror.core.keys import canonical_from_upstream_key

        record = cache.get_canonical(api, canonical_from_upstream_key(key))
        assert record is not None and record.body == body


def test_the_budget_evicts_the_least_recently_used_file(tmp_path: Path) -> None:
    """A hit on an indexed file makes it the most recent: the file evicted next is the one used longest ago."""
    expected = budget_tree(tmp_path / "frozen")
    first_key = {}
    for api, key in expected:
        first_key.setdefault(api, key)
    apis = list(first_key)
    sizer = FrozenCache(tmp_path / "frozen")
    sizer.get(apis[0], first_key[apis[0]])
    cache = FrozenCache(tmp_path / "frozen", memory_budget=int(sizer.memory_used * 3.5 / 0.8))  # room for 3 indexes
    for api in apis[:3]:
        assert cache.get(api, first_key[api]) is not None
    assert cache.evictions == 0 and cache.loads == 3
    assert cache.get(apis[0], first_key[apis[0]]) is not None  # the oldest used again
    assert cache.get(apis[3], first_key[apis[3]]) is not None  # a fourth file: one has to go
    assert (cache.loads, cache.evictions) == (4, 1)
    loads = cache.loads
    assert cache.get(apis[0], first_key[apis[0]]) is not None  # still indexed: no load
    assert cache.loads == loads
    assert cache.get(apis[1], first_key[apis[1]]) is not None  # the one used longest ago was evicted
    assert cache.loads == loads + 1


def test_memory_budget_over_http(tmp_path: Path, settings_factory, serve) -> None:
    expected = budget_tree(tmp_path / "frozen")
    server = serve(settings_factory(mode="replay", frozen_caches=[str(tmp_path / "frozen")], frozen_memory_mb=0.01))
    for _ in range(2):
        for (api, key), body in expected.items():
            api = api.rsplit("/", 1)[1]
            import ast

            r = server.post(payload(api, ast.literal_eval(key)))
            assert r.status_code == 200 and r.headers["x-stm-outcome"] == "hit"
            assert r.content == body.encode("utf-8")
    layer = server.server.config.app  # the FastAPI app
    frozen = layer.state.layer.frozen[0]
    assert frozen.evictions > 0 and frozen.memory_used <= frozen.memory_budget + 64 * 1024


def test_file_changed_on_disk_is_read_again(tmp_path: Path) -> None:
    path = write_api(tmp_path / "frozen", "good", GOOD)
    cache = FrozenCache(tmp_path / "frozen")
    assert cache.get("Data/crafted_for_Data/good", "{'q': 'x'}").answer["response"] == "good answer"
    replacement = tmp_path / "new.json"
    replacement.write_text(json.dumps({"{'q': 'x'}": {"error": "", "response": "a longer, different answer"}}))
    os.replace(replacement, path)
    assert cache.get("Data/crafted_for_Data/good", "{'q': 'x'}").answer["response"] == "a longer, different answer"


# -- issue 10 item 6 / issue 13: a file loading never holds up other answers ----------------------------


def test_hits_and_health_are_answered_while_a_file_loads(tmp_path: Path, settings_factory, serve) -> None:
    """The file being loaded is a named pipe: it stays "loading" until the test writes it, no timing involved."""
    root = tmp_path / "frozen"
    write_api(root, "good", GOOD)
    pipe = root / "Data" / "crafted_for_Data" / "slow.json"
    os.mkfifo(pipe)
    slow_text = json.dumps({"{'q': 'slow'}": {"error": "", "response": "loaded at last"}})
    server = serve(settings_factory(mode="replay", frozen_caches=[str(root)]))
    assert server.post(payload("good", {"q": "x"})).json()["response"] == "good answer"

    result: dict[str, Any] = {}

    def slow_call() -> None:
        result["response"] = requests.post(server.url + "/virtual", json=payload("slow", {"q": "slow"}), timeout=60)

    caller = threading.Thread(target=slow_call)
    caller.start()
    writer = None
    try:
        # the server has opened the pipe once a non-blocking writer can open it
        deadline = 600
        while writer is None:
            try:
                writer = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                deadline -= 1
                assert deadline > 0, "the server never started reading the file"
                threading.Event().wait(0.05)
        # the loading file is open and unread: the server must still answer everything else
        health = requests.get(server.url + "/health", timeout=5)
        assert health.status_code == 200
        for _ in range(20):
            hit = requests.post(server.url + "/virtual", json=payload("good", {"q": "x"}), timeout=5)
            assert hit.status_code == 200 and hit.json()["response"] == "good answer"
        miss = requests.post(server.url + "/virtual", json=payload("good", {"q": "other"}), timeout=5)
        assert miss.headers["x-stm-outcome"] == "unanswered"
        assert caller.is_alive()  # still loading
        # finish the load: a regular file takes the pipe's place, then the pipe delivers the same text
        regular = tmp_path / "slow.json"
        regular.write_text(slow_text)
        os.replace(regular, pipe)
        os.set_blocking(writer, True)
        os.write(writer, slow_text.encode())
    finally:
        if writer is not None:
            os.close(writer)
        caller.join(timeout=60)
    response = result["response"]
    assert response.status_code == 200 and response.json() == {"error": "", "response": "loaded at last"}
    assert response.headers["x-stm-outcome"] == "hit"


def test_a_file_loading_holds_up_no_other_apis_first_load(tmp_path: Path, settings_factory, serve) -> None:
    """100 other APIs, each loaded for the first time while one file stays loading (a named pipe): with
    locks shared by several APIs (the 64 stripes there were), some of them waited for that file."""
    root = tmp_path / "frozen"
    others = [f"api_{n}" for n in range(100)]
    for name in others:
        write_api(root, name, json.dumps({"{'q': 'x'}": {"error": "", "response": name}}))
    pipe = root / "Data" / "crafted_for_Data" / "slow.json"
    os.mkfifo(pipe)
    server = serve(settings_factory(mode="replay", frozen_caches=[str(root)]))
    caller = threading.Thread(target=lambda: requests.post(server.url + "/virtual", json=payload("slow", {"q": "x"}), timeout=60))
    caller.start()
    writer = None
    try:
        for _ in range(600):  # the server has opened the pipe once a non-blocking writer can open it
            try:
                writer = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
                break
            except OSError:
                threading.Event().wait(0.05)
        assert writer is not None, "the server never started reading the file"
        for name in others:
            # a miss of each: its file parsed, then its canonical index built, both while 'slow' loads
            r = requests.post(server.url + "/virtual", json=payload(name, {"q": "other"}), timeout=5)
            assert r.headers["x-stm-outcome"] == "unanswered", name
        assert caller.is_alive()
    finally:
        if writer is not None:
            os.close(writer)
        caller.join(timeout=60)


# -- issue 18 item 3d: a file over frozen_max_file_mb is refused, not parsed -------------------------


def big_tree(root: Path) -> tuple[Path, Path]:
    """``good`` (small), ``big`` (a real 1.5 MB JSON file) and ``sparse`` (300 MB of holes: nothing on disk)."""
    write_api(root, "good", GOOD)
    answer = {"error": "", "response": "x" * 1000}
    big = write_api(root, "big", json.dumps({f"{{'q': {i}}}": answer for i in range(1500)}))
    sparse = root / "Data" / "crafted_for_Data" / "sparse.json"
    with open(sparse, "wb") as fh:
        fh.truncate(300 * 1024 * 1024)
    assert os.stat(sparse).st_blocks * 512 < 1024 * 1024 and os.path.getsize(big) > 1024 * 1024
    return big, sparse


def test_a_file_over_frozen_max_file_mb_is_refused_with_one_warning(tmp_path: Path, settings_factory, serve, caplog) -> None:
    big, sparse = big_tree(tmp_path / "frozen")
    server = serve(settings_factory(mode="replay", frozen_caches=[str(tmp_path / "frozen")], frozen_max_file_mb=1))
    with caplog.at_level(logging.WARNING, logger="stabletoolbench_mirror.stores.frozen"):
        for _ in range(3):
            assert server.post(payload("good", {"q": "x"})).headers["x-stm-outcome"] == "hit"
            for api in ("big", "sparse"):
                r = server.post(payload(api, {"q": 1}))
                assert r.status_code == 200 and r.headers["x-stm-outcome"] == "unanswered", r.text
    warnings = [r.getMessage() for r in caplog.records if r.name == "stabletoolbench_mirror.stores.frozen"]
    assert warnings == [
        f"frozen cache file skipped: {big}: 1.5 MB, over frozen_max_file_mb (1 MB): not parsed; "
        "raise frozen_max_file_mb to read it (parsing takes about twice its size in memory)",
        f"frozen cache file skipped: {sparse}: 300.0 MB, over frozen_max_file_mb (1 MB): not parsed; "
        "raise frozen_max_file_mb to read it (parsing takes about twice its size in memory)",
    ]
    frozen = server.server.config.app.state.layer.frozen[0]
    assert frozen.loads == 1  # only the good file was parsed
    # raised, the big file is served
    raised = serve(settings_factory(mode="replay", frozen_caches=[str(tmp_path / "frozen")], frozen_max_file_mb=4))
    r = raised.post(payload("big", {"q": 1}))
    assert r.headers["x-stm-outcome"] == "hit" and r.json()["response"] == "x" * 1000
