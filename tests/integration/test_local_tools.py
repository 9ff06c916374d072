"""Local tools over real HTTP: state per session, only listed files imported, failures, timeouts, start-up errors."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from stabletoolbench_mirror.config import ConfigError
from stabletoolbench_mirror.engine import local_tools
from stabletoolbench_mirror.engine.local_tools import LocalTools, answer_of
from stabletoolbench_mirror.factory import build_store
from tests.helpers import paths
from tests.helpers.processes import _clean_env

REPO = paths.REPO
EXAMPLE_TOOLS = REPO / "examples" / "meetings" / "tools.py"

TOOLS_FILE = """\
import time
from tests.helpers import paths

RUNS = {"n": 0}

def remember(tool_input, state):
    state.setdefault("items", []).append(tool_input["item"])
    return state["items"]

def recall(tool_input, state):
    return {"items": state.get("items", [])}

def runs(tool_input, state):
    RUNS["n"] += 1
    return RUNS["n"]

def boom(tool_input, state):
    state["touched"] = True
    raise ValueError("the tool broke on purpose")

def slow(tool_input, state):
    state["touched"] = True
    time.sleep(float(tool_input.get("seconds", 3)))
    return "late"

def as_is(tool_input, state):
    return {"error": "Unauthorized error...", "response": {"kept": [1, 2]}}

def bad_state(tool_input, state):
    state["when"] = object()
    return "ok"

TOOLS = {
    "Tools/Notes/Remember": remember,
    "Tools/Notes/Recall": recall,
    "Tools/Notes/Runs": runs,
    "Tools/Notes/Boom": boom,
    "Tools/Notes/Slow": slow,
    "Tools/Notes/As Is": as_is,
    "Tools/Notes/Bad State": bad_state,
}
"""


def notes(api: str, **inputs: Any) -> dict[str, Any]:
    return {"category": "Tools", "tool_name": "Notes", "api_name": api, "tool_input": json.dumps(inputs), "strip": "", "toolbench_key": ""}


def post(url: str, payload: dict[str, Any], session: str | None = None, timeout: float = 30) -> requests.Response:
    return requests.post(url + "/virtual", json=payload, headers={"X-STM-Session": session} if session else {}, timeout=timeout)


@pytest.fixture
def tools_file(tmp_path: Path) -> Path:
    path = tmp_path / "notes_tools.py"
    path.write_text(TOOLS_FILE)
    return path


@pytest.fixture
def local_server(serve, settings_factory, tools_file: Path):
    settings = settings_factory(local_tools=[str(tools_file)], local_tools_timeout_s=1.0)
    return serve(settings), settings


def records(settings) -> list:
    with build_store(settings) as store:
        return list(store)


def test_state_is_isolated_between_sessions_and_empty_outside_one(local_server) -> None:
    server, _ = local_server
    a, b = (requests.post(server.url + "/sessions", json={}, timeout=10).json()["id"] for _ in range(2))
    assert post(server.url, notes("remember", item="apples"), a).json() == {"error": "", "response": '["apples"]'}
    assert post(server.url, notes("remember", item="pears"), b).json() == {"error": "", "response": '["pears"]'}
    assert post(server.url, notes("remember", item="figs"), a).json()["response"] == '["apples", "figs"]'
    assert post(server.url, notes("recall"), a).json()["response"] == '{"items": ["apples", "figs"]}'
    assert post(server.url, notes("recall"), b).json()["response"] == '{"items": ["pears"]}'
    # outside a session every call starts from an empty state
    assert post(server.url, notes("remember", item="kiwis")).json()["response"] == '["kiwis"]'
    assert post(server.url, notes("remember", item="kiwis")).json()["response"] == '["kiwis"]'
    assert post(server.url, notes("recall")).json()["response"] == '{"items": []}'
    assert requests.get(f"{server.url}/sessions/{a}", timeout=10).json()["state"] == {"items": ["apples", "figs"]}


def test_a_local_tool_always_runs_and_its_answers_are_recorded_as_local(local_server) -> None:
    server, settings = local_server
    answers = [post(server.url, notes("runs")) for _ in range(3)]
    assert [r.json()["response"] for r in answers] == ["1", "2", "3"]  # run every time, though cached
    assert {r.headers["x-stm-source"] for r in answers} == {"local"}
    kept = [r for r in records(settings) if r.api == "Tools/notes_for_Tools/runs"]
    assert [(r.key, r.source, r.origin, r.answer) for r in kept] == [("{}", "local", "local:notes_tools.py", {"error": "", "response": "1"})]
    stats = requests.get(server.url + "/stats", timeout=10).json()
    assert stats["by_source"] == {"local": 3} and stats["hits"] == 0


def test_answers_as_is_and_values_as_json_text() -> None:
    assert answer_of({"error": "E", "response": {"a": 1}}) == {"error": "E", "response": {"a": 1}}
    assert answer_of({"response": 1}) == {"error": "", "response": '{"response": 1}'}
    assert answer_of("plain text") == {"error": "", "response": "plain text"}
    assert answer_of([1, "é"]) == {"error": "", "response": '[1, "é"]'}
    assert answer_of(2.5) == {"error": "", "response": "2.5"}
    assert answer_of(True) == {"error": "", "response": "true"}
    assert answer_of(None) == {"error": "", "response": "null"}


def test_a_dict_answer_is_served_as_it_is(local_server) -> None:
    server, _ = local_server
    r = post(server.url, notes("as_is"))
    assert r.status_code == 200 and r.content == b'{"error":"Unauthorized error...","response":{"kept":[1,2]}}'


def test_a_raising_tool_gets_an_error_answer_nothing_recorded_state_unchanged(local_server, caplog: pytest.LogCaptureFixture) -> None:
    server, settings = local_server
    sid = requests.post(server.url + "/sessions", json={}, timeout=10).json()["id"]
    post(server.url, notes("remember", item="apples"), sid)
    with caplog.at_level("ERROR"):
        r = post(server.url, notes("boom"), sid)
    assert r.status_code == 200
    assert r.json()["error"] == "API not working error..."
    assert "ValueError: the tool broke on purpose" in r.json()["response"]
    assert "Traceback" in caplog.text and "the tool broke on purpose" in caplog.text
    assert not [x for x in records(settings) if x.api.endswith("/boom")]
    doc = requests.get(f"{server.url}/sessions/{sid}", timeout=10).json()
    assert doc["state"] == {"items": ["apples"]}  # the failed call's change is not kept
    assert doc["calls"][-1]["in_history"] is False and doc["calls"][-1]["source"] is None


def test_a_tool_past_its_timeout_gets_an_error_answer_in_time_and_blocks_nobody(local_server) -> None:
    server, settings = local_server
    sid = requests.post(server.url + "/sessions", json={}, timeout=10).json()["id"]
    results: dict[str, Any] = {}

    def slow_call() -> None:
        started = time.monotonic()
        results["slow"] = post(server.url, notes("slow", seconds=4), sid)
        results["slow_s"] = time.monotonic() - started

    thread = threading.Thread(target=slow_call)
    thread.start()
    # another call (another session) is answered while the slow tool sleeps
    assert post(server.url, notes("remember", item="x")).json()["response"] == '["x"]'
    thread.join()
    r = results["slow"]
    assert r.status_code == 200 and r.json()["error"] == "API not working error..."
    assert "did not answer within 1s" in r.json()["response"]
    assert results["slow_s"] < 1.0 + 1.0
    assert not [x for x in records(settings) if x.api.endswith("/slow")]
    assert requests.get(f"{server.url}/sessions/{sid}", timeout=10).json()["state"] == {}


def test_a_state_that_is_not_json_is_not_kept(local_server) -> None:
    server, _ = local_server
    sid = requests.post(server.url + "/sessions", json={}, timeout=10).json()["id"]
    r = post(server.url, notes("bad_state"), sid)
    assert r.status_code == 200 and "state that is not JSON" in r.json()["response"]
    assert requests.get(f"{server.url}/sessions/{sid}", timeout=10).json()["state"] == {}


def test_a_state_over_its_bound_is_not_kept(local_server, monkeypatch: pytest.MonkeyPatch) -> None:
    server, _ = local_server
    monkeypatch.setattr(local_tools, "MAX_STATE_BYTES", 40)  # {"items": ["apples"]} fits, one more item does not
    sid = requests.post(server.url + "/sessions", json={}, timeout=10).json()["id"]
    assert post(server.url, notes("remember", item="apples"), sid).json()["response"] == '["apples"]'
    r = post(server.url, notes("remember", item="a longer item than the bound leaves room for"), sid)
    assert r.status_code == 200 and "left a state over 40 bytes" in r.json()["response"], r.text
    assert requests.get(f"{server.url}/sessions/{sid}", timeout=10).json()["state"] == {"items": ["apples"]}


def test_only_listed_files_are_ever_imported(serve, settings_factory, tmp_path: Path) -> None:
    marker = tmp_path / "imported.marker"
    folder = tmp_path / "tools"
    folder.mkdir()
    (folder / "listed.py").write_text("TOOLS = {'Tools/Listed/Ping': lambda i, s: 'pong'}\n")
    (folder / "unlisted.py").write_text(
        f"open({str(marker)!r}, 'w').write('imported')\nTOOLS = {{'Tools/Unlisted/Ping': lambda i, s: 'hacked'}}\n"
    )
    # client-chosen session ids (sessions.allow_client_ids) that name the module too
    server = serve(settings_factory(local_tools=[str(folder / "listed.py")], sessions={"allow_client_ids": True}))
    assert post(server.url, {"category": "Tools", "tool_name": "Listed", "api_name": "ping", "tool_input": "{}"}).json()["response"] == "pong"
    # requests naming the unlisted module in every field, inside and outside a session
    for name in ("unlisted", "Unlisted", "unlisted.py", "../tools/unlisted", str(folder / "unlisted.py")):
        for session in (None, name[:100]):
            payload = {"category": name, "tool_name": name, "api_name": name, "tool_input": json.dumps({"module": name})}
            r = post(server.url, payload, session)
            assert r.status_code == 200 and r.json()["response"] != "hacked"
    assert not marker.exists()
    assert "unlisted" not in " ".join(m for m in sys.modules if m.startswith("stm_local_tools"))


def run_serve(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stabletoolbench_mirror", "serve", "--config", str(config), "--port", "1"],
        cwd=REPO, env=_clean_env(), capture_output=True, text=True, timeout=120,
    )


@pytest.mark.parametrize(
    "content, message",
    [
        ("import no_such_module_anywhere\n", "No module named 'no_such_module_anywhere'"),
        ("raise SystemExit(3)\n", "SystemExit"),
        ("def broken(:\n", "SyntaxError"),
        ("TOOLS = 3\n", "defines no TOOLS dict"),
        ("TOOLS = {'just/two': print}\n", "is not \"Category/tool_name/api_name\""),
        ("TOOLS = {'A/b/c': 'not a function'}\n", "is not a function"),
    ],
)
def test_a_local_tools_file_that_cannot_be_used_stops_the_start_naming_it(content: str, message: str, tmp_path: Path) -> None:
    bad = tmp_path / "broken_tools.py"
    bad.write_text(content)
    config = tmp_path / "server.yml"
    config.write_text(json.dumps({"store": {"path": str(tmp_path / "store")}, "local_tools": ["broken_tools.py"]}))
    done = run_serve(config)
    assert done.returncode == 2, done.stdout + done.stderr
    assert str(bad) in done.stderr and "local_tools" in done.stderr and message in done.stderr
    assert "Traceback" not in done.stderr


def test_a_missing_local_tools_file_stops_the_start(tmp_path: Path) -> None:
    config = tmp_path / "server.yml"
    config.write_text(json.dumps({"store": {"path": str(tmp_path / "store")}, "local_tools": ["nowhere.py"]}))
    done = run_serve(config)
    assert done.returncode == 2 and str(tmp_path / "nowhere.py") in done.stderr and "no such file" in done.stderr


def test_two_files_defining_one_api_are_refused(tmp_path: Path) -> None:
    one, two = tmp_path / "one.py", tmp_path / "two.py"
    one.write_text("TOOLS = {'Tools/Same Tool/Do It': print}\n")
    two.write_text("TOOLS = {'Tools/same_tool/do_it': print}\n")
    with pytest.raises(ConfigError, match="both define Tools/same_tool_for_Tools/do_it"):
        LocalTools.load([str(one), str(two)])


def test_a_tools_key_is_split_as_an_api_path_its_tool_name_may_hold_a_slash(tmp_path: Path) -> None:
    """A TOOLS key is read under the API path's one rule (core.naming.ApiPath): four parts are a tool name with a
    slash, found by a client sending that tool name (a three-way split refused the key)."""
    from stabletoolbench_mirror.core.call import ToolCall

    tools_file = tmp_path / "slash_tools.py"
    tools_file.write_text("TOOLS = {'Tools/Group/Tool/do': print}\n")
    tools = LocalTools.load([str(tools_file)])
    assert tools.find(ToolCall.of("Tools", "Group/Tool", "do", {})) is not None
    assert tools.find(ToolCall.of("Tools", "Tool", "do", {})) is None


def test_the_example_tools_load_and_match_client_spellings() -> None:
    tools = LocalTools.load([str(EXAMPLE_TOOLS)])
    from stabletoolbench_mirror.core.call import ToolCall

    for api in ("add_meeting", "Add Meeting", "add meeting"):
        assert tools.find(ToolCall.of("Tools", "Example Meetings", api, {})) is not None
    assert tools.find(ToolCall.of("Tools", "example_meetings_for_Tools", "add_meeting", {})) is not None
    assert tools.find(ToolCall.of("Tools", "Example Meetings", "rename_meeting", {})) is None


def test_in_replay_mode_local_tools_run_and_record_nothing(serve, settings_factory, tools_file: Path) -> None:
    settings = settings_factory(mode="replay", local_tools=[str(tools_file)])
    server = serve(settings)
    sid = requests.post(server.url + "/sessions", json={}, timeout=10).json()["id"]
    assert post(server.url, notes("remember", item="a"), sid).json()["response"] == '["a"]'
    assert post(server.url, notes("remember", item="b"), sid).json()["response"] == '["a", "b"]'
    assert records(settings) == []


def test_one_session_through_two_worker_processes_loses_no_update(tmp_path: Path, tools_file: Path) -> None:
    from tests.helpers.processes import ServeProcess

    config = {"store": {"kind": "diskcache", "path": str(tmp_path / "store")}, "local_tools": [str(tools_file)]}
    with ServeProcess(tmp_path, config, workers=2) as server:
        sid = requests.post(server.url + "/sessions", json={"task": "t"}, timeout=10).json()["id"]
        items = [f"i{n}" for n in range(12)]
        threads = [threading.Thread(target=post, args=(server.url, notes("remember", item=i), sid)) for i in items]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        doc = requests.get(f"{server.url}/sessions/{sid}", timeout=10).json()
        # an id neither worker issued is refused by both
        for _ in range(4):
            r = post(server.url, notes("remember", item="z"), "not-issued")
            assert r.status_code == 404 and "POST /sessions" in r.json()["error"]
    assert sorted(doc["state"]["items"]) == sorted(items)
    # each call saw the state the one before it left: the answers grow one item at a time
    lengths = [len(json.loads(c["answer"]["response"])) for c in doc["calls"]]
    assert lengths == list(range(1, 13))


def test_doctor_lists_the_local_tools_files(tmp_path: Path) -> None:
    config = tmp_path / "server.yml"
    config.write_text(json.dumps({"store": {"path": str(tmp_path / "store")}, "local_tools": [str(EXAMPLE_TOOLS)], "local_tools_timeout_s": 3}))
    done = subprocess.run(
        [sys.executable, "-m", "stabletoolbench_mirror", "doctor", "--config", str(config), "--no-probe"],
        cwd=REPO, env=_clean_env(), capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "local tools:" in done.stdout + done.stderr and f"{EXAMPLE_TOOLS} (timeout 3 s; their code runs in this process" in done.stdout + done.stderr


DEEP_INPUT = "[" * 600 + "]" * 600  # valid JSON, too deep for copy.deepcopy


def test_deep_inputs_get_an_error_answer_and_never_switch_local_tools_off(local_server) -> None:
    server, _ = local_server
    sid = requests.post(server.url + "/sessions", json={}, timeout=10).json()["id"]
    payload = {**notes("recall"), "tool_input": DEEP_INPUT}
    for n in range(40):  # more than local_tools.MAX_RUNNING
        r = post(server.url, payload, sid if n % 2 else None)
        assert r.status_code == 200, r.text
        assert r.json()["error"] == "API not working error..."
        assert "nested too deeply" in r.json()["response"]
    assert post(server.url, notes("remember", item="a")).json() == {"error": "", "response": '["a"]'}
    assert post(server.url, notes("remember", item="b"), sid).json() == {"error": "", "response": '["b"]'}


def _running(tools: LocalTools) -> int:
    """Local tool threads running (or stuck) now: the slots taken of MAX_RUNNING."""
    from stabletoolbench_mirror.engine.local_tools import MAX_RUNNING

    return MAX_RUNNING - tools._slots._value  # noqa: SLF001 - the semaphore's own count


def _wait_until_idle(tools: LocalTools, timeout_s: float = 5.0) -> int:
    # a tool thread gives its slot back just after it returns
    deadline = time.monotonic() + timeout_s
    while _running(tools) and time.monotonic() < deadline:
        time.sleep(0.01)
    return _running(tools)


def test_every_path_of_a_run_gives_its_slot_back(monkeypatch: pytest.MonkeyPatch) -> None:
    from stabletoolbench_mirror.core.call import ToolCall
    from stabletoolbench_mirror.engine.local_tools import MAX_RUNNING, LocalTool

    release = threading.Event()

    def boom(tool_input: Any, state: dict) -> Any:
        raise ValueError("broken on purpose")

    def stuck(tool_input: Any, state: dict) -> Any:
        release.wait(10)
        return "late"

    def not_json(tool_input: Any, state: dict) -> Any:
        return {"when": object()}

    def bad_state(tool_input: Any, state: dict) -> Any:
        state["when"] = object()
        return "ok"

    def fine(tool_input: Any, state: dict) -> Any:
        return "ok"

    tools = LocalTools({}, timeout_s=0.1)

    def run(fn: Any, tool_input: Any = None) -> str:
        call = ToolCall.of("Tools", "Notes", fn.__name__, {} if tool_input is None else tool_input)
        result = tools.run(LocalTool(call.api, fn, "local:test"), call, {})
        return result.detail

    assert "nested too deeply" in run(fine, json.loads(DEEP_INPUT))  # deepcopy raises
    assert _running(tools) == 0
    assert "raised ValueError: broken on purpose" in run(boom)
    assert _wait_until_idle(tools) == 0
    assert "returned a value that is not JSON" in run(not_json)
    assert _wait_until_idle(tools) == 0
    assert "left a state that is not JSON" in run(bad_state)
    assert _wait_until_idle(tools) == 0
    # a tool past its timeout keeps its slot while it runs, and gives it back when it returns
    assert "did not answer within 0.1s" in run(stuck)
    assert _running(tools) == 1
    release.set()
    assert _wait_until_idle(tools) == 0

    def no_thread(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", no_thread)
    assert "can't start new thread" in run(fine)
    assert _running(tools) == 0
    monkeypatch.undo()
    # after all that, every slot is free: MAX_RUNNING stuck tools still fit, one more is refused
    release.clear()
    for _ in range(MAX_RUNNING):
        assert "did not answer" in run(stuck)
    assert "local tools still running" in run(fine)
    release.set()
    assert _wait_until_idle(tools) == 0
    assert run(fine) == ""
