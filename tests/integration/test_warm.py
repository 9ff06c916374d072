"""`warm`: fill the store through the real layer and a real OpenAI-compatible stub; resumable, deduplicated."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from stabletoolbench_mirror.core.records import Record
from stabletoolbench_mirror.stores import DiskcacheStore
from stabletoolbench_mirror.upstream.queries import default_calls
from tests.helpers.answer_files import api, cot_answer, dfs_answer, param, query
from tests.helpers.openai_stub import OpenAIStub, Reply, echo_responder
from tests.helpers.processes import popen_as_from_a_terminal


def cli(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(command(*args), cwd=cwd, env=clean_env(), capture_output=True, text=True, timeout=timeout)


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "stabletoolbench_mirror", *args]


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("STM_")}


def config(tmp_path: Path, stub: OpenAIStub, **extra: Any) -> Path:
    data: dict[str, Any] = {
        "store": {"path": str(tmp_path / "store")},
        # no tool docs: warm's own start-up checks want that said explicitly
        "simulator": {"enabled": True, "api_base": stub.api_base, "max_retries": 0, "read_timeout_s": 30, "allow_without_docs": True},
    }
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key].update(value)
        else:
            data[key] = value
    path = tmp_path / "warm_config.yml"
    path.write_text(yaml.safe_dump(data))
    return path


def subset(reference_dir: Path, tmp_path: Path, count: int) -> Path:
    """The first ``count`` queries of each solvable group, as one query folder."""
    folder = tmp_path / "queries"
    folder.mkdir(exist_ok=True)
    for group in sorted((reference_dir / "solvable_queries").glob("*.json")):
        queries = json.loads(group.read_text())[:count]
        (folder / group.name).write_text(json.dumps(queries))
    return folder


def distinct_calls(folder: Path) -> dict[tuple[str, str], Any]:
    calls, problems = default_calls([folder])
    assert not problems
    return {(c.call.api, c.call.canonical): c.call for c in calls}


def records(store_path: Path) -> list[Record]:
    with DiskcacheStore(store_path) as store:
        return list(store)


def test_warm_from_reference_queries_records_each_default_call_once(reference_dir: Path, tmp_path: Path) -> None:
    folder = subset(reference_dir, tmp_path, 3)
    expected = distinct_calls(folder)
    with OpenAIStub() as stub:
        cfg = config(tmp_path, stub)
        first = cli("warm", "--queries", str(folder), "--config", str(cfg), "--concurrency", "4", "--processes", "2", cwd=tmp_path)
        assert first.returncode == 0, first.stdout + first.stderr
        assert stub.count == len(expected)
        # progress off a terminal: lines with the count and the rate (core/progress.py), a summary table by input kind
        assert f"warm: {len(expected)}/{len(expected)}" in first.stderr and "call/s" in first.stderr and "\r" not in first.stderr
        assert f"queries    {len(expected):>8} {len(expected):>8} {0:>8} {0:>8}" in first.stdout
        saved = records(tmp_path / "store")
        assert len(saved) == len(expected)
        assert {(r.api, r.key) for r in saved} == {(c.api, c.key) for c in expected.values()}
        assert {r.source for r in saved} == {"simulated"} and {r.origin for r in saved} == {"MirrorAPI [no tool docs]"}
        # each prompt carried the default call's standardised, typed input
        prompts = [m["content"] for body in stub.requests for m in body["messages"] if m["role"] == "user"]
        for call in expected.values():
            assert any(str(call.tool_input) in p for p in prompts)

        second = cli("warm", "--queries", str(folder), "--config", str(cfg), "-q", cwd=tmp_path)
        assert second.returncode == 0, second.stdout + second.stderr
        assert stub.count == len(expected)
        assert f"queries    {len(expected):>8} {0:>8} {len(expected):>8} {0:>8}" in second.stdout
        assert len(records(tmp_path / "store")) == len(expected)


def test_agents_default_call_hits_after_warming(tmp_path: Path, serve, settings_factory) -> None:
    doc = api(
        "Data",
        "Movie DB",
        "Get Title",
        required=[param("id", "STRING", "tt0111161"), param("Page-Size", "NUMBER", "5")],
        optional=[param("adult", "BOOLEAN", "false"), param("lang", "STRING", "")],
    )
    queries = tmp_path / "q.json"
    queries.write_text(json.dumps([query(1, [doc]), query(2, [doc])]))
    with OpenAIStub() as stub:
        result = cli("warm", "--queries", str(queries), "--include-optional", "--config", str(config(tmp_path, stub)), "-q", cwd=tmp_path)
        assert result.returncode == 0, result.stdout + result.stderr
        assert stub.count == 1
    server = serve(settings_factory(mode="replay", store={"path": str(tmp_path / "store")}))
    # what the agent sends when it copies the example values shown to it
    agent = {"category": "Data", "tool_name": "Movie DB", "api_name": "Get Title", "strip": "", "toolbench_key": ""}
    hit = server.post(dict(agent, tool_input='{\n  "is_id": "tt0111161",\n  "page_size": 5,\n  "adult": false\n}'))
    assert hit.headers["X-STM-Outcome"] == "hit" and hit.json()["error"] == ""
    as_text = server.post(dict(agent, tool_input='{"is_id": "tt0111161", "page_size": "5", "adult": false}'))
    assert as_text.headers["X-STM-Outcome"] == "unanswered"


def _descendants(pid: int) -> set[int]:
    """The processes below ``pid`` now (read from /proc)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue  # gone while listed
        parents[int(stat.parent.name)] = int(fields[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie has ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


@pytest.mark.parametrize("processes", [1, 2])
def test_interrupted_warm_resumes_without_duplicates(processes: int, reference_dir: Path, tmp_path: Path) -> None:
    folder = subset(reference_dir, tmp_path, 4)
    expected = distinct_calls(folder)
    slow = threading.Event()
    slow.set()

    def responder(body: dict[str, Any]) -> Reply:
        reply = echo_responder(body)
        reply.delay_s = 0.15 if slow.is_set() else 0.0
        return reply

    store_path = tmp_path / "store"
    with OpenAIStub(responder) as stub:
        cfg = config(tmp_path, stub)
        proc = subprocess.Popen(
            command("warm", "--queries", str(folder), "--config", str(cfg), "--concurrency", "4", "--processes", str(processes), "-q"),
            cwd=tmp_path,
            env=clean_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if store_path.exists() and len(records(store_path)) >= 10:
                    break
                assert proc.poll() is None, "warm ended before it could be interrupted"
                time.sleep(0.05)
            workers = _descendants(proc.pid)
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == -signal.SIGKILL
        # worker processes die with the warm process: once they are gone nothing can land after the kill
        deadline = time.monotonic() + 30
        while any(_alive(pid) for pid in workers):
            assert time.monotonic() < deadline, f"warm's workers outlived it by 30 s: {sorted(workers)}"
            time.sleep(0.02)
        after_kill = records(store_path)
        assert 10 <= len(after_kill) < len(expected)
        calls_before = stub.count

        slow.clear()
        resumed = cli("warm", "--queries", str(folder), "--config", str(cfg), "--concurrency", "4", "--processes", str(processes), "-q", cwd=tmp_path)
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        # only the calls that were not recorded are made again
        assert stub.count - calls_before == len(expected) - len(after_kill)
    final = records(store_path)
    assert len(final) == len(expected)
    assert len({(r.api, r.key) for r in final}) == len(expected)
    assert {(r.api, r.key) for r in final} == {(c.api, c.key) for c in expected.values()}
    for record in final:
        assert record.answer["error"] == "" and record.answer["response"].startswith("simulated answer")
    # entries recorded before the kill are untouched
    before = {(r.api, r.key): r for r in after_kill}
    assert all(before[(r.api, r.key)] == r for r in final if (r.api, r.key) in before)


def test_answer_files_and_payloads_failures_listed_not_recorded(tmp_path: Path) -> None:
    apis = [
        api("Data", "TheClique", "Transfermarkt search", required=[param("name", "STRING", "messi")]),
        api("Data", "TheClique", "Songkick artist", required=[param("artist_id", "STRING", "520117")]),
    ]
    queries = tmp_path / "queries.json"
    queries.write_text(json.dumps([query(588, apis)]))
    answers = tmp_path / "answers"
    answers.mkdir()
    calls = [
        ("transfermarkt_search_for_theclique", '{\n  "name": "Lionel Messi"\n}', '{"error": "", "response": "a"}'),
        ("songkick_artist_for_theclique", '{\n  "artist_id": "FAIL"\n}', '{"error": "", "response": "b"}'),
    ]
    (answers / "588_DFS_woFilter_w2.json").write_text(json.dumps(dfs_answer("q", calls)))
    odd = [
        ("transfermarkt_search_for_theclique", '{"name": "Lionel Messi"}', "same call, other text"),
        ("made_up_for_theclique", "{}", "hallucinated"),
        ("songkick_artist_for_theclique", "{not json", "parse error"),
    ]
    (answers / "588_CoT@1.json").write_text(json.dumps(cot_answer("q", odd)))
    payloads = tmp_path / "payloads.jsonl"
    payloads.write_text(
        "\n".join(
            [
                json.dumps({"category": "Data", "tool_name": "TheClique", "api_name": "Songkick artist", "tool_input": '{"artist_id": "1"}'}),
                json.dumps({"payload": {"category": "Data", "tool_name": "X", "api_name": "chat_with_user", "tool_input": "{}"}}),
                "not json",
                "",
            ]
        )
    )
    failing = threading.Event()
    failing.set()

    def responder(body: dict[str, Any]) -> Reply:
        prompt = body["messages"][-1]["content"]
        if failing.is_set() and "FAIL" in prompt:
            return Reply(status=500)
        return echo_responder(body)

    with OpenAIStub(responder) as stub:
        cfg = config(tmp_path, stub)
        failures = tmp_path / "failures.jsonl"
        result = cli(
            "warm", "--answers", str(answers), "--index", str(queries), "--payloads", str(payloads),
            "--config", str(cfg), "--failures", str(failures), "-q", cwd=tmp_path,
        )  # fmt: skip
        assert result.returncode == 1, result.stdout + result.stderr
        assert f"answers    {2:>8} {1:>8} {0:>8} {1:>8} {2:>8}" in result.stdout
        assert f"payloads   {1:>8} {1:>8} {0:>8} {0:>8} {2:>8}" in result.stdout
        assert "FAILED" in result.stdout and "FAIL" in failures.read_text()
        saved = records(tmp_path / "store")
        usable = [r for r in saved if not r.is_failure]
        assert len(usable) == 2 and not any("FAIL" in r.key for r in usable)
        assert [r.key for r in saved if r.is_failure] == ["{'artist_id': 'FAIL'}"]  # a failure record, retried later
        assert stub.count == 3
        failed_lines = [json.loads(line) for line in failures.read_text().splitlines()]
        assert len(failed_lines) == 1 and failed_lines[0]["payload"]["toolbench_key"] == ""
        # the failures file is a payloads input: retry only those
        failing.clear()
        retry = cli("warm", "--payloads", str(failures), "--config", str(cfg), "-q", cwd=tmp_path)
        assert retry.returncode == 0, retry.stdout + retry.stderr
        assert stub.count == 4 and len(records(tmp_path / "store")) == 3
        assert not any(r.is_failure for r in records(tmp_path / "store"))


def test_calls_in_a_frozen_cache_are_not_made(reference_dir: Path, tmp_path: Path) -> None:
    with OpenAIStub() as stub:
        cfg = config(tmp_path, stub, frozen_caches=[str(reference_dir / "cache")])
        result = cli("warm", "--payloads", str(reference_dir / "calls.jsonl"), "--config", str(cfg), "-q", cwd=tmp_path)
        assert result.returncode == 0, result.stdout + result.stderr
        assert stub.count == 0
        assert f"{0:>8} {16:>8} {0:>8}" in result.stdout


def test_warm_refuses_what_cannot_work(tmp_path: Path) -> None:
    queries = tmp_path / "q.json"
    queries.write_text(json.dumps([query(1, [api("Data", "T", "A")])]))
    nothing = cli("warm", "--queries", str(queries), "--store-path", str(tmp_path / "s"), cwd=tmp_path)
    assert nothing.returncode == 2 and "nothing can answer" in nothing.stderr
    assert cli("warm", "--store-path", str(tmp_path / "s"), cwd=tmp_path).returncode == 2
    missing = cli("warm", "--queries", str(tmp_path / "nope.json"), "--store-path", str(tmp_path / "s"), cwd=tmp_path)
    assert missing.returncode == 2 and "nope.json" in missing.stderr
    dry = cli("warm", "--queries", str(queries), "--store-path", str(tmp_path / "s"), "--dry-run", cwd=tmp_path)
    assert dry.returncode == 0 and "1 of 1 distinct calls would be made" in dry.stdout
    replay = cli("warm", "--queries", str(queries), "--mode", "replay", cwd=tmp_path)
    assert replay.returncode == 2 and "replay" in replay.stderr
    answers_alone = cli("warm", "--answers", str(tmp_path), "--store-path", str(tmp_path / "s"), cwd=tmp_path)
    assert answers_alone.returncode == 2 and "tools folder" in answers_alone.stderr


def test_queries_one_level_off_name_the_folder_to_give(tmp_path: Path) -> None:
    """StableToolBench's layout: ``solvable_queries/test_instruction/<group>.json`` (query lists) beside
    ``solvable_queries/test_query_ids/<group>.json`` (not query lists).  ``--queries`` given the folder above, the
    checkout above that, the ids folder beside or a path that does not exist: exit status 2, naming the folder to give
    (the rule frozen caches and tools folders are hinted by)."""
    checkout = tmp_path / "StableToolBench"
    instruction = checkout / "solvable_queries" / "test_instruction"
    ids = checkout / "solvable_queries" / "test_query_ids"
    for folder in (instruction, ids, checkout / "toolenv" / "tools" / "Data"):
        folder.mkdir(parents=True)
    for group in ("G1_instruction", "G2_category"):
        (instruction / f"{group}.json").write_text(json.dumps([query(1, [api("Data", "T", "A")])], indent=4))
        (ids / f"{group}.json").write_text(json.dumps({"1": 0}, indent=4))
    (checkout / "toolenv" / "tools" / "Data" / "t.json").write_text(json.dumps({"tool_name": "T", "api_list": []}))
    lonely = tmp_path / "lonely"
    lonely.mkdir()
    said = {"below": f"the folder below, {instruction}, holds StableToolBench query files (<group>.json): give that path",
            "beside it": f"the folder beside it, {instruction}, holds StableToolBench query files (<group>.json): give that path"}
    for given, where in ((checkout / "solvable_queries", "below"), (checkout, "below"), (ids, "beside it"),
                         (ids / "G1_instruction.json", "beside it")):
        done = cli("warm", "--queries", str(given), "--store-path", str(tmp_path / "s"), "--dry-run", cwd=tmp_path)
        assert done.returncode == 2 and said[where] in done.stderr, (given, done.stdout, done.stderr)
    # a typo: the nearest folder that exists holds none, the one below it does
    typo = cli("warm", "--queries", str(checkout / "solvable_queries" / "test_instructions"), "--store-path", str(tmp_path / "s"),
               "--dry-run", cwd=tmp_path)
    assert typo.returncode == 2, typo.stderr
    assert f"test_instructions: no such file or folder; the folder below, {instruction}, holds StableToolBench query files" in typo.stderr
    # nothing near: said plainly
    alone = cli("warm", "--queries", str(lonely), "--store-path", str(tmp_path / "s"), "--dry-run", cwd=tmp_path)
    assert alone.returncode == 2 and f"{lonely}: no query files (*.json) in it" in alone.stderr and "holds" not in alone.stderr
    right = cli("warm", "--queries", str(instruction), "--store-path", str(tmp_path / "s"), "--dry-run", cwd=tmp_path)
    assert right.returncode == 0 and "1 of 1 distinct calls would be made" in right.stdout, right.stderr


def test_warm_server_and_cli_share_the_stub_endpoint(tmp_path: Path, serve, settings_factory) -> None:
    """A warmed entry is served exactly as recorded (byte-identical replay)."""
    queries = tmp_path / "q.json"
    queries.write_text(json.dumps([query(1, [api("Data", "T", "A", required=[param("q", "STRING", "x")])])]))
    with OpenAIStub() as stub:
        assert cli("warm", "--queries", str(queries), "--config", str(config(tmp_path, stub)), "-q", cwd=tmp_path).returncode == 0
    (record,) = records(tmp_path / "store")
    server = serve(settings_factory(mode="replay", store={"path": str(tmp_path / "store")}))
    reply = requests.post(server.url + "/virtual", json={"category": "Data", "tool_name": "T", "api_name": "A", "tool_input": '{"q": "x"}'}, timeout=10)
    assert reply.text == record.body


def test_a_second_ctrl_c_quits_warm_processes_at_once(reference_dir: Path, tmp_path: Path) -> None:
    folder = subset(reference_dir, tmp_path, 2)

    def slow(body: dict[str, Any]) -> Reply:
        reply = echo_responder(body)
        reply.delay_s = 20  # the calls in hand would keep a first Ctrl-C waiting this long
        return reply

    with OpenAIStub(slow) as stub:
        cfg = config(tmp_path, stub)
        proc = popen_as_from_a_terminal(
            command("warm", "--queries", str(folder), "--config", str(cfg), "--concurrency", "4", "--processes", "2", "-q"),
            cwd=tmp_path, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while stub.count < 4 and time.monotonic() < deadline:
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.5)
        assert proc.poll() is None  # the first Ctrl-C waits for the calls in hand
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=15)
    assert proc.returncode == 130 and time.monotonic() - started < 5
    assert "stopping: the calls in hand finish (Ctrl-C again to quit now)" in err and "quitting now" in err


@pytest.mark.parametrize("processes", [1, 2])
def test_ctrl_c_stops_cleanly_with_a_summary_and_resumes(processes: int, reference_dir: Path, tmp_path: Path) -> None:
    folder = subset(reference_dir, tmp_path, 2)
    expected = distinct_calls(folder)

    def responder(body: dict[str, Any]) -> Reply:
        reply = echo_responder(body)
        reply.delay_s = 0.1
        return reply

    store_path = tmp_path / "store"
    with OpenAIStub(responder) as stub:
        cfg = config(tmp_path, stub)
        proc = popen_as_from_a_terminal(
            command("warm", "--queries", str(folder), "--config", str(cfg), "--concurrency", "2", "--processes", str(processes), "-q"),
            cwd=tmp_path, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while stub.count < 6 and time.monotonic() < deadline:
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 130, out + err
        assert "interrupted: run the same command again to resume" in out
        saved = len(records(store_path))
        assert 0 < saved < len(expected)
        resumed = cli("warm", "--queries", str(folder), "--config", str(cfg), "--concurrency", "4", "-q", cwd=tmp_path)
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        assert f"queries    {len(expected):>8} {len(expected) - saved:>8} {saved:>8}" in resumed.stdout
    assert len(records(store_path)) == len(expected)


# -- issue 18 item 7a: a dead simulator stops warm early over many APIs, not only one ---------------


def many_api_payloads(tmp_path: Path, n: int) -> Path:
    """``n`` calls spread over 8 APIs of 2 tools: no two consecutive calls share an API."""
    path = tmp_path / "many_apis.jsonl"
    lines = []
    for i in range(n):
        tool = ("Alpha Tool", "Beta Tool")[i % 2]
        body = {"category": "Data", "tool_name": tool, "api_name": f"api_{i % 8}", "tool_input": json.dumps({"q": f"x{i}"})}
        lines.append(json.dumps({**body, "strip": "", "toolbench_key": ""}))
    path.write_text("\n".join(lines) + "\n")
    return path


class _DeadEndpoint:
    """``closed``: a local port nothing listens on; ``500``: a real OpenAI-style server that answers HTTP 500."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.stub = OpenAIStub(lambda body: Reply(status=500, message="model crashed")) if kind == "500" else None

    def __enter__(self) -> str:
        if self.stub is None:
            from tests.helpers.live import free_port

            return f"http://127.0.0.1:{free_port()}/v1"
        return self.stub.__enter__().api_base

    def __exit__(self, *exc: object) -> None:
        if self.stub is not None:
            self.stub.__exit__(*exc)


@pytest.mark.parametrize("dead,processes", [("closed", 1), ("500", 1), ("closed", 2)])
def test_warm_stops_early_on_a_dead_simulator_over_many_apis(dead: str, processes: int, tmp_path: Path) -> None:
    payloads = many_api_payloads(tmp_path, 200)
    with _DeadEndpoint(dead) as api_base:
        data = {
            "store": {"path": str(tmp_path / "store")},
            "simulator": {"enabled": True, "api_base": api_base, "max_retries": 0, "connect_timeout_s": 1, "allow_without_docs": True},
        }
        cfg = tmp_path / "dead.yml"
        cfg.write_text(yaml.safe_dump(data))
        result = cli("warm", "--config", str(cfg), "--payloads", str(payloads), "--concurrency", "4",
                     "--processes", str(processes), "--quiet", cwd=tmp_path)
    out = result.stdout
    assert result.returncode == 2, out + result.stderr
    made = int(out.split(" calls made in", 1)[0].rsplit("\n", 1)[-1])
    assert 5 <= made < 40, out  # the calls in flight when it stopped finish; not 200
    assert "stopped early: the first 5 calls all failed with the same cause: failed: simulated: simulator unavailable: " in out
    stop_line = next(line for line in out.splitlines() if line.startswith("stopped early:"))
    # the cause printed is the responder's, not an answer naming one of the APIs
    assert "api_" not in stop_line and "answered:" not in stop_line, stop_line
    assert ("connection failed" in stop_line) if dead == "closed" else ("HTTP 500: model crashed" in stop_line)
    # each FAILED line still says what was served, naming its own API
    failed = [line for line in out.splitlines() if line.startswith("FAILED ")]
    assert failed and all("(answered: API not working error..." in line for line in failed)
    assert len({line.split("no recorded response for ", 1)[1].split(" ", 1)[0] for line in failed}) > 1


def test_warm_in_refresh_mode_asks_the_records_in_scope_again(tmp_path: Path) -> None:
    """docs/curation.md: run the benchmark "(or `warm`)" in refresh mode; warm replaces what it reaches, once."""
    queries = tmp_path / "q.json"
    queries.write_text(json.dumps([query(1, [api("Data", "T", "A", required=[param("q", "STRING", "x")]), api("Data", "T", "B")])]))

    def answering(version: str):
        return lambda body: Reply(content=json.dumps({"error": "", "response": f"{version} answer"}))

    with OpenAIStub(answering("v1")) as v1:
        assert cli("warm", "--queries", str(queries), "--config", str(config(tmp_path, v1)), "-q", cwd=tmp_path).returncode == 0
    before = {r.key: r for r in records(tmp_path / "store")}
    assert len(before) == 2
    with OpenAIStub(answering("v2")) as v2:
        refreshed = cli("warm", "--queries", str(queries), "--config", str(config(tmp_path, v2, mode="refresh")), "-q", cwd=tmp_path)
        assert refreshed.returncode == 0, refreshed.stdout + refreshed.stderr
        assert f"queries    {2:>8} {2:>8} {0:>8} {0:>8}" in refreshed.stdout, refreshed.stdout
        assert v2.count == 2
    after = {r.key: r for r in records(tmp_path / "store")}
    assert set(after) == set(before)
    for key, record in after.items():
        assert record.answer["response"] == "v2 answer"
        assert record.replaced is not None and record.replaced["body"] == before[key].body
