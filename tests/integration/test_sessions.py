"""Sessions over real HTTP: history-conditioned prompts, replayable trajectories, persistence, bad input."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from stabletoolbench_mirror.core import protocol
from stabletoolbench_mirror.engine import sessions as sessions_module
from stabletoolbench_mirror.factory import build_store
from tests.helpers import paths
from tests.helpers.openai_stub import OpenAIStub, Reply
from tests.helpers.processes import ServeProcess, _clean_env

REPO = paths.REPO


class CountingModel:
    """A scripted model: every completion is a new answer (``answer #n``), and every prompt is kept."""

    def __init__(self) -> None:
        self.n = 0
        self.lock = threading.Lock()

    def __call__(self, body: dict[str, Any]) -> Reply:
        with self.lock:
            self.n += 1
            n = self.n
        return Reply(content=json.dumps({"error": "", "response": f"answer #{n}"}))


def prompt_text(request: dict[str, Any]) -> str:
    return "\n".join(str(m.get("content", "")) for m in request["messages"])


def call_payload(api: str, **inputs: Any) -> dict[str, Any]:
    return {
        "category": "Tools",
        "tool_name": "Meetings",
        "api_name": api,
        "tool_input": json.dumps(inputs),
        "strip": "",
        "toolbench_key": "",
    }


def post(url: str, payload: dict[str, Any], session: str | None = None) -> requests.Response:
    headers = {"X-STM-Session": session} if session is not None else {}
    return requests.post(url + "/virtual", json=payload, headers=headers, timeout=30)


def new_session(url: str, task: str = "") -> str:
    r = requests.post(url + "/sessions", json={"task": task}, timeout=10)
    assert r.status_code == 201, r.text
    return r.json()["id"]


def sim_settings(settings_factory, stub: OpenAIStub, style: str = "gpt-fewshot", history: int = 8, **extra: Any):
    return settings_factory(
        simulator={"enabled": True, "style": style, "api_base": stub.api_base, "max_retries": 0, "model": "stub-model", "history": history},
        **extra,
    )


@pytest.mark.parametrize("style", ["gpt-fewshot", "world-model"])
def test_history_reaches_the_prompt_of_the_same_session_only(style: str, serve, settings_factory) -> None:
    with OpenAIStub(CountingModel()) as stub:
        server = serve(sim_settings(settings_factory, stub, style))
        a = new_session(server.url, "Plan the week")
        b = new_session(server.url, "Plan the week")
        assert post(server.url, call_payload("add_meeting", name="x"), a).status_code == 200
        assert stub.count == 1

        assert post(server.url, call_payload("query_meeting"), a).json() == {"error": "", "response": "answer #2"}
        prompt_a = prompt_text(stub.requests[-1])
        assert '"x"' in prompt_a and "add_meeting" in prompt_a and "answer #1" in prompt_a and "Plan the week" in prompt_a

        assert post(server.url, call_payload("query_meeting"), b).json() == {"error": "", "response": "answer #3"}
        prompt_b = prompt_text(stub.requests[-1])
        assert '"x"' not in prompt_b and "add_meeting" not in prompt_b and "Plan the week" in prompt_b
        assert stub.count == 3

        # the trajectory, in order, with provenance
        calls = requests.get(f"{server.url}/sessions/{a}", timeout=10).json()["calls"]
        assert [c["api_name"] for c in calls] == ["add_meeting", "query_meeting"]
        assert [c["answer"]["response"] for c in calls] == ["answer #1", "answer #2"]
        assert {c["source"] for c in calls} == {"simulated"} and {c["origin"] for c in calls} == {"stub-model"}
        assert calls[0]["tool_input"] == {"name": "x"}


def test_few_shot_examples_recorded_in_sessions_show_their_input_only(serve, settings_factory) -> None:
    with OpenAIStub(CountingModel()) as stub:
        server = serve(sim_settings(settings_factory, stub, "gpt-fewshot"))
        post(server.url, call_payload("add_meeting", name="kept"), new_session(server.url, "t"))
        post(server.url, call_payload("add_meeting", name="other"))  # no session: the session's record is an example
        prompt = prompt_text(stub.requests[-1])
        assert "input: {'name': 'kept'}\n" in prompt and "#history=" not in prompt


def test_history_window_keeps_the_last_n_calls(serve, settings_factory) -> None:
    with OpenAIStub(CountingModel()) as stub:
        server = serve(sim_settings(settings_factory, stub, "world-model", history=2))
        sid = new_session(server.url, "t")
        for name in ("alpha1", "beta2", "gamma3"):
            post(server.url, call_payload("add_meeting", name=name), sid)
        post(server.url, call_payload("query_meeting"), sid)
        prompt = prompt_text(stub.requests[-1])
        assert "alpha1" not in prompt and "beta2" in prompt and "gamma3" in prompt


def test_mirrorapi_prompts_get_no_history(serve, settings_factory) -> None:
    with OpenAIStub(CountingModel()) as stub:
        server = serve(sim_settings(settings_factory, stub, "mirrorapi-sft"))
        sid = new_session(server.url, "A task text")
        post(server.url, call_payload("add_meeting", name="x"), sid)
        post(server.url, call_payload("query_meeting"), sid)
        in_session = stub.requests[-1]["messages"]
        post(server.url, call_payload("query_meeting"))  # the same call without a session
        assert stub.requests[-1]["messages"] == in_session
        assert "A task text" not in prompt_text(stub.requests[-1])


def test_replaying_a_trajectory_after_a_restart_gives_the_same_bytes_without_the_model(tmp_path: Path) -> None:
    trajectory = [
        call_payload("add_meeting", name="x", date="2025-01-02"),
        call_payload("query_meeting"),
        call_payload("delete_meeting", id=1),
        call_payload("query_meeting"),  # the same call as the second, in another state
    ]
    with OpenAIStub(CountingModel()) as stub:
        config = {
            "store": {"kind": "diskcache", "path": str(tmp_path / "store")},
            "tools_folder": str(REPO / "examples" / "meetings" / "tools"),
            "simulator": {"enabled": True, "style": "world-model", "api_base": stub.api_base, "max_retries": 0},
        }
        with ServeProcess(tmp_path, config) as server:
            sid = new_session(server.url, "Keep my calendar tidy")
            first = [post(server.url, p, sid).content for p in trajectory]
        assert stub.count == 4
        assert len(set(first)) == 4  # the repeated query was simulated again: its state differs

        with ServeProcess(tmp_path, config) as server:  # a restart: a new process on the same store
            sid2 = new_session(server.url, "Keep my calendar tidy")
            again = [post(server.url, p, sid2).content for p in trajectory]
            assert again == first
            assert stub.count == 4  # no model call at all
            calls = requests.get(f"{server.url}/sessions/{sid2}", timeout=10).json()["calls"]
            assert [c["outcome"] for c in calls] == ["hit"] * 4
            assert [c["source"] for c in calls] == ["simulated"] * 4
            # the first session survived the restart too
            assert len(requests.get(f"{server.url}/sessions/{sid}", timeout=10).json()["calls"]) == 4

            # a different history is a different state: not served the recorded answer
            sid3 = new_session(server.url, "Keep my calendar tidy")
            assert post(server.url, trajectory[1], sid3).json()["response"] == "answer #5"
            # ... and so is a different task
            sid4 = new_session(server.url, "Another task")
            assert post(server.url, trajectory[0], sid4).json()["response"] == "answer #6"


def test_calls_without_the_header_are_byte_identical_with_every_feature_configured(
    reference_dir: Path, reference_calls, serve, settings_factory, tmp_path: Path
) -> None:
    tools = tmp_path / "tools.py"
    tools.write_text("TOOLS = {'Tools/Local Thing/Run': lambda tool_input, state: 'ran'}\n")
    frozen = [str(reference_dir / "cache")]
    plain = serve(settings_factory(mode="record", frozen_caches=frozen))
    with OpenAIStub(CountingModel()) as stub:
        featured = serve(
            settings_factory(
                mode="record",
                frozen_caches=frozen,
                store={"kind": "diskcache", "path": str(tmp_path / "store2")},
                local_tools=[str(tools)],
                simulator={"enabled": True, "style": "gpt-fewshot", "api_base": stub.api_base, "history": 8},
            )
        )
        assert len(reference_calls) == 16
        for call in reference_calls:
            before, after = post(plain.url, call["payload"]), post(featured.url, call["payload"])
            assert before.status_code == after.status_code == 200
            assert after.content == before.content == protocol.encode_answer(call["observed"]).encode()
        assert stub.count == 0

        # a miss without the header: the usual key, and the prompt of before (no session block)
        miss = call_payload("query_meeting", day="monday")
        post(featured.url, miss)
        from stabletoolbench_mirror.core.call import ToolCall
        from stabletoolbench_mirror.responders.simulator.prompts import GPT_SYSTEM_PROMPT, gpt_fewshot_messages

        expected = gpt_fewshot_messages(GPT_SYSTEM_PROMPT, ToolCall.of("Tools", "Meetings", "query_meeting", {"day": "monday"}), None, [])
        assert stub.requests[-1]["messages"] == expected
    featured_settings = settings_factory(store={"kind": "diskcache", "path": str(tmp_path / "store2")})
    with build_store(featured_settings) as store:
        keys = [r.key for r in store]
    assert keys == ["{'day': 'monday'}"]
    # nobody used a session: no session folder was created
    assert not (tmp_path / "store2" / "sessions").exists()


def test_calls_of_one_session_run_one_at_a_time_and_chain_their_history(serve, settings_factory, tmp_path: Path) -> None:
    tools = tmp_path / "tools.py"
    tools.write_text(
        "import time\n"
        "def count(tool_input, state):\n"
        "    n = state.get('n', 0)\n"
        "    time.sleep(0.01)\n"
        "    state['n'] = n + 1\n"
        "    return n + 1\n"
        "TOOLS = {'Tools/Counter/Count': count}\n"
    )
    server = serve(settings_factory(local_tools=[str(tools)]))
    sid = new_session(server.url)
    payload = {"category": "Tools", "tool_name": "Counter", "api_name": "count", "tool_input": "{}"}
    answers: list[str] = []
    threads = [threading.Thread(target=lambda: answers.append(post(server.url, payload, sid).json()["response"])) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(answers, key=int) == [str(i) for i in range(1, 9)]  # no lost update
    doc = requests.get(f"{server.url}/sessions/{sid}", timeout=10).json()
    assert [c["answer"]["response"] for c in doc["calls"]] == [str(i) for i in range(1, 9)]
    assert len({c["history"] for c in doc["calls"]}) == 8 and doc["state"] == {"n": 8}


def test_sessions_are_shared_through_redis_and_expire(tmp_path: Path, serve, settings_factory) -> None:
    from tests.helpers.redis_server import RedisServer, require_redis_server

    require_redis_server()
    tools = tmp_path / "tools.py"
    tools.write_text("def add(i, s):\n    s.setdefault('items', []).append(i['item'])\n    return s['items']\nTOOLS = {'Tools/List/Add': add}\n")
    with RedisServer(tmp_path / "redis") as redis_server:
        settings = settings_factory(
            store={"kind": "redis", "url": redis_server.url, "prefix": "sess"},
            local_tools=[str(tools)],
        )
        one, two = serve(settings), serve(settings)
        sid = new_session(one.url, "shared")
        add = {"category": "Tools", "tool_name": "List", "api_name": "add"}
        assert post(one.url, {**add, "tool_input": '{"item": "a"}'}, sid).json()["response"] == '["a"]'
        assert post(two.url, {**add, "tool_input": '{"item": "b"}'}, sid).json()["response"] == '["a", "b"]'
        doc = requests.get(f"{one.url}/sessions/{sid}", timeout=10).json()
        assert doc["task"] == "shared" and [c["tool_input"]["item"] for c in doc["calls"]] == ["a", "b"]
        from stabletoolbench_mirror.commands.sessions_export import export_sessions
        from stabletoolbench_mirror.factory import build_session_store

        other = new_session(one.url, "second")
        out = tmp_path / "redis-sessions.jsonl"
        store = build_session_store(settings)
        try:
            assert export_sessions(store, str(out), progress=False) == 2
        finally:
            store.close()
        exported = {json.loads(line)["id"]: json.loads(line) for line in out.read_text().splitlines()}
        assert exported[sid]["calls"] == doc["calls"] and exported[other]["task"] == "second"
        # a server whose sessions expire after 1 s idle: Redis forgets them
        short = serve(settings_factory(store={"kind": "redis", "url": redis_server.url, "prefix": "sess"}, sessions={"idle_expiry_s": 1}))
        brief = new_session(short.url)
        deadline = time.monotonic() + 20
        while requests.get(f"{two.url}/sessions/{brief}", timeout=10).status_code != 404:
            assert time.monotonic() < deadline, "the idle session never expired"
            time.sleep(0.2)
        assert requests.get(f"{two.url}/sessions/{sid}", timeout=10).status_code == 200
        # an id no server of this Redis issued is refused by all of them
        for server in (one, two):
            r = post(server.url, {**add, "tool_input": '{"item": "c"}'}, "not-issued")
            assert r.status_code == 404 and "POST /sessions" in r.json()["error"]


def test_idle_sessions_expire_in_diskcache(serve, settings_factory) -> None:
    server = serve(settings_factory(sessions={"idle_expiry_s": 1}))
    patient = serve(settings_factory())  # the same store, the default expiry (7 days)
    kept = new_session(patient.url)
    sid = new_session(server.url)
    deadline = time.monotonic() + 20
    while requests.get(f"{server.url}/sessions/{sid}", timeout=10).status_code != 404:
        assert time.monotonic() < deadline, "the idle session never expired"
        time.sleep(0.2)
    assert requests.get(f"{server.url}/sessions/{kept}", timeout=10).status_code == 200


def test_delete_forgets_the_session(serve, settings_factory) -> None:
    server = serve(settings_factory())
    sid = new_session(server.url, "x")
    r = requests.delete(f"{server.url}/sessions/{sid}", timeout=10)
    assert r.status_code == 200 and r.json() == {"id": sid, "deleted": True}
    assert requests.get(f"{server.url}/sessions/{sid}", timeout=10).status_code == 404


# -- bad input -------------------------------------------------------------------------------------


def test_unknown_session_ids_are_404_json(serve, settings_factory) -> None:
    server = serve(settings_factory())
    for method in ("get", "delete"):
        r = getattr(requests, method)(f"{server.url}/sessions/no-such-session", timeout=10)
        assert r.status_code == 404 and r.headers["content-type"] == "application/json"
        assert "no-such-session" in r.json()["error"]


@pytest.mark.parametrize("bad", ["a" * 129, "a%01b", "%7F", "tab%09inside", "%C2%85"])
def test_bad_session_ids_in_the_path_are_422(bad: str, serve, settings_factory) -> None:
    server = serve(settings_factory())
    for method in ("get", "delete"):
        r = getattr(requests, method)(f"{server.url}/sessions/{bad}", timeout=10)
        assert r.status_code == 422 and r.headers["content-type"] == "application/json", (bad, r.text)
        assert "session id" in r.json()["error"]


def raw_request(port: int, header_value: bytes, body: bytes) -> tuple[int, bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(
            b"POST /virtual HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-STM-Session: "
            + header_value
            + b"\r\nContent-Length: "
            + str(len(body)).encode()
            + b"\r\nConnection: close\r\n\r\n"
            + body
        )
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), rest


def test_bad_session_ids_in_the_header_are_422_and_change_nothing(serve, settings_factory, tmp_path: Path) -> None:
    settings = settings_factory()
    server = serve(settings)
    payload = call_payload("query_meeting")
    for bad in ("a" * 129, "tab\tinside"):
        r = post(server.url, payload, bad)
        assert r.status_code == 422 and "x-stm-session" in r.json()["error"], r.text
    body = json.dumps(payload).encode()
    for raw in (b"a\x7fb", b"\xc2\x85", b"\xff\xfe"):
        status, answer = raw_request(server.port, raw, body)
        assert status in (400, 422), (raw, status)
        if status == 422:
            assert "x-stm-session" in json.loads(answer)["error"]
    stats = requests.get(server.url + "/stats", timeout=10).json()
    assert stats["requests"] == stats["rejected"] >= 2 and stats["hits"] == stats["misses"] == 0
    assert not (tmp_path / "store" / "sessions").exists()


def test_a_full_session_refuses_more_calls(serve, settings_factory) -> None:
    server = serve(settings_factory(sessions={"max_calls": 2}))
    sid = new_session(server.url)
    assert [post(server.url, call_payload("q", i=i), sid).status_code for i in range(2)] == [200, 200]
    r = post(server.url, call_payload("q", i=3), sid)
    assert r.status_code == 409 and "sessions.max_calls=2" in r.json()["error"]
    assert len(requests.get(f"{server.url}/sessions/{sid}", timeout=10).json()["calls"]) == 2


def test_bad_session_bodies(serve, settings_factory, monkeypatch) -> None:
    monkeypatch.setattr(sessions_module, "MAX_TASK_CHARS", 10)
    server = serve(settings_factory())
    cases = [
        (b"{not json", 400),
        (b'{"task": 3}', 422),
        (b'{"task": "ok", "other": 1}', 422),
        (b"[1]", 422),
        (b'{"task": "far longer than ten"}', 422),
        (b"x" * 2_000_000, 413),
    ]
    for body, status in cases:
        r = requests.post(server.url + "/sessions", data=body, timeout=10)
        assert r.status_code == status, (body[:30], r.text)
        assert r.json()["error"]
    assert requests.post(server.url + "/sessions", timeout=10).status_code == 201  # no body: no task


# -- export ----------------------------------------------------------------------------------------


def test_sessions_export_writes_one_line_per_session_with_a_progress_bar(serve, settings_factory, tmp_path: Path) -> None:
    tools = tmp_path / "tools.py"
    tools.write_text("TOOLS = {'Tools/Echo/Say': lambda i, s: i}\n")
    settings = settings_factory(local_tools=[str(tools)])
    server = serve(settings)
    ids = [new_session(server.url, f"task {n}") for n in range(3)]
    for n, sid in enumerate(ids):
        for k in range(n + 1):
            post(server.url, {"category": "Tools", "tool_name": "Echo", "api_name": "say", "tool_input": json.dumps({"k": k})}, sid)
    config = tmp_path / "export.yml"
    config.write_text(json.dumps({"store": {"path": str(tmp_path / "store")}}))
    out = tmp_path / "out.jsonl"
    done = subprocess.run(
        [sys.executable, "-m", "stabletoolbench_mirror", "sessions", "export", str(out), "--config", str(config)],
        cwd=REPO, env=_clean_env(), capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "exported 3 sessions" in done.stdout and "sessions:" in done.stderr and "3/3" in done.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    by_task = {line["task"]: line for line in lines}
    assert sorted(by_task) == ["task 0", "task 1", "task 2"]
    calls = by_task["task 2"]["calls"]
    assert [c["tool_input"] for c in calls] == [{"k": 0}, {"k": 1}, {"k": 2}]
    assert [c["answer"] for c in calls] == [{"error": "", "response": json.dumps({"k": k})} for k in range(3)]
    assert {(c["source"], c["origin"]) for c in calls} == {("local", "local:tools.py")}


def test_a_snapshot_replays_session_trajectories_from_a_frozen_tree(serve, settings_factory, tmp_path: Path) -> None:
    trajectory = [call_payload("add_meeting", name="x"), call_payload("query_meeting"), call_payload("query_meeting", day=1)]
    with OpenAIStub(CountingModel()) as stub:
        server = serve(sim_settings(settings_factory, stub, "world-model"))
        sid = new_session(server.url, "frozen task")
        first = [post(server.url, p, sid).content for p in trajectory]
    config = tmp_path / "snap.yml"
    config.write_text(json.dumps({"store": {"path": str(tmp_path / "store")}}))
    done = subprocess.run(
        [sys.executable, "-m", "stabletoolbench_mirror", "snapshot", str(tmp_path / "snap"), "--config", str(config)],
        cwd=REPO, env=_clean_env(), capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    replay = serve(settings_factory(mode="replay", store={"path": str(tmp_path / "empty")}, frozen_caches=[str(tmp_path / "snap")]))
    sid2 = new_session(replay.url, "frozen task")
    assert [post(replay.url, p, sid2).content for p in trajectory] == first


def test_a_toolbench_key_never_reaches_a_session_or_its_prompts(serve, settings_factory, tmp_path: Path) -> None:
    secret = "tbk-very-secret-123"
    with OpenAIStub(CountingModel()) as stub:
        server = serve(sim_settings(settings_factory, stub, "world-model"))
        sid = new_session(server.url, "t")
        payload = call_payload("add_meeting", name="x", toolbench_key=secret)
        payload["toolbench_key"] = secret
        post(server.url, payload, sid)
        post(server.url, call_payload("query_meeting"), sid)
        assert all(secret not in json.dumps(r) for r in stub.requests)
        doc = requests.get(f"{server.url}/sessions/{sid}", timeout=10)
        assert secret not in doc.text and doc.json()["calls"][0]["tool_input"] == {"name": "x"}
    out = tmp_path / "export.jsonl"
    config = tmp_path / "export.yml"
    config.write_text(json.dumps({"store": {"path": str(tmp_path / "store")}}))
    subprocess.run([sys.executable, "-m", "stabletoolbench_mirror", "sessions", "export", str(out), "--config", str(config), "-q"],
                   cwd=REPO, env=_clean_env(), check=True, capture_output=True, timeout=120)
    assert secret not in out.read_text()


# -- who owns a session ----------------------------------------------------------------------------

COUNTER_TOOLS = """\
RUNS = {"n": 0}

def runs(tool_input, state):
    RUNS["n"] += 1
    state["n"] = state.get("n", 0) + 1
    return RUNS["n"]

def note(tool_input, state):
    state["n"] = state.get("n", 0) + 1
    return tool_input.get("text", "") * int(tool_input.get("times", 1))

TOOLS = {"Tools/Counter/Runs": runs, "Tools/Counter/Note": note}
"""


def counter(api: str, **inputs: Any) -> dict[str, Any]:
    return {"category": "Tools", "tool_name": "Counter", "api_name": api, "tool_input": json.dumps(inputs)}


@pytest.fixture
def counter_tools(tmp_path: Path) -> Path:
    path = tmp_path / "counter_tools.py"
    path.write_text(COUNTER_TOOLS)
    return path


def test_post_sessions_issues_ids_of_128_random_bits(serve, settings_factory) -> None:
    import re

    server = serve(settings_factory())
    ids = [new_session(server.url) for _ in range(64)]
    assert len(set(ids)) == 64 and all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)
    varying = 0
    for other in ids[1:]:
        varying |= int(other, 16) ^ int(ids[0], 16)
    assert varying == 2**128 - 1  # every one of the 128 bits takes both values: none is fixed


def test_an_id_the_server_did_not_issue_is_refused_and_changes_nothing(serve, settings_factory, counter_tools: Path) -> None:
    settings = settings_factory(local_tools=[str(counter_tools)])
    server = serve(settings)
    for chosen in ("1", "someone-elses-session", "a" * 128):
        r = post(server.url, counter("runs"), chosen)
        assert r.status_code == 404 and r.headers["content-type"] == "application/json", r.text
        assert "POST /sessions" in r.json()["error"] and repr(chosen) in r.json()["error"]
        assert requests.get(f"{server.url}/sessions/{chosen}", timeout=10).status_code == 404  # not started
    assert post(server.url, counter("runs")).json()["response"] == "1"  # the refused calls ran no tool
    # an issued id works on every server of the store; once deleted it is refused, not started again
    sid = new_session(server.url)
    other = serve(settings)
    assert post(other.url, counter("runs"), sid).status_code == 200
    assert post(server.url, counter("runs"), sid).status_code == 200
    assert requests.get(f"{server.url}/sessions/{sid}", timeout=10).json()["state"] == {"n": 2}
    assert requests.delete(f"{other.url}/sessions/{sid}", timeout=10).status_code == 200
    r = post(server.url, counter("runs"), sid)
    assert r.status_code == 404 and "POST /sessions" in r.json()["error"]
    assert "POST /sessions" in requests.get(f"{server.url}/sessions/{sid}", timeout=10).json()["error"]


def test_allow_client_ids_lets_an_unknown_id_start_a_session(serve, settings_factory, counter_tools: Path) -> None:
    server = serve(settings_factory(local_tools=[str(counter_tools)], sessions={"allow_client_ids": True}))
    assert post(server.url, counter("runs"), "my-own-id").status_code == 200
    assert post(server.url, counter("runs"), "my-own-id").status_code == 200
    doc = requests.get(f"{server.url}/sessions/my-own-id", timeout=10).json()
    assert len(doc["calls"]) == 2 and doc["state"] == {"n": 2}


# -- a session's size ------------------------------------------------------------------------------


def test_a_call_that_would_make_a_session_too_large_is_refused_and_changes_nothing(serve, settings_factory, counter_tools: Path) -> None:
    server = serve(settings_factory(local_tools=[str(counter_tools)], sessions={"max_bytes": 60_000}))
    sid = new_session(server.url)
    for _ in range(2):  # each call keeps about 20 KB (its input and its answer)
        assert post(server.url, counter("note", text="x" * 10_000), sid).status_code == 200
    before = requests.get(f"{server.url}/sessions/{sid}", timeout=10).json()
    assert before["state"] == {"n": 2}
    # the input alone would not fit: refused before the tool runs
    r = post(server.url, counter("note", text="y" * 30_000), sid)
    assert r.status_code == 409 and "sessions.max_bytes=60000" in r.json()["error"], r.text
    # a small input whose answer would not fit: the tool ran, but nothing of it is kept
    r = post(server.url, counter("note", text="z" * 100, times=300), sid)
    assert r.status_code == 409 and "sessions.max_bytes=60000" in r.json()["error"], r.text
    assert requests.get(f"{server.url}/sessions/{sid}", timeout=10).json() == before
    # a call that fits is still kept
    assert post(server.url, counter("note", text="ok"), sid).json() == {"error": "", "response": "ok"}
    after = requests.get(f"{server.url}/sessions/{sid}", timeout=10).json()
    assert after["state"] == {"n": 3} and len(after["calls"]) == 3


def test_the_prompt_cuts_long_inputs_of_earlier_calls(serve, settings_factory) -> None:
    with OpenAIStub(CountingModel()) as stub:
        server = serve(sim_settings(settings_factory, stub, "gpt-fewshot"))
        sid = new_session(server.url, "t")
        for n in range(3):
            post(server.url, call_payload("add_meeting", name=f"m{n}" + "x" * 300_000), sid)
        post(server.url, call_payload("add_meeting", name="short"), sid)
        post(server.url, call_payload("query_meeting"), sid)
        prompt = prompt_text(stub.requests[-1])
        assert len(prompt) < 20_000
        assert '{"name": "m0' + "x" * 1000 in prompt and "x" * 1100 not in prompt
        assert 'input: {"name": "short"}\n' in prompt  # a short input is shown whole, as before


# -- the store's disk full -------------------------------------------------------------------------


def test_a_full_disk_during_a_session_call_serves_the_answer_unrecorded_then_recovers(tmp_path: Path) -> None:
    """As a plain miss: RLIMIT_FSIZE of the server lowered to 1 byte (every file write fails, as on
    a full disk), then raised again, without a restart."""
    import resource

    with OpenAIStub(CountingModel()) as stub:
        config = {
            "store": {"kind": "diskcache", "path": str(tmp_path / "store")},
            "tools_folder": str(REPO / "examples" / "meetings" / "tools"),
            "simulator": {"enabled": True, "style": "gpt-fewshot", "api_base": stub.api_base, "max_retries": 0},
        }
        with ServeProcess(tmp_path, config, workers=1) as server:
            sid = new_session(server.url, "t")
            assert post(server.url, call_payload("add_meeting", name="a"), sid).headers["x-stm-outcome"] == "recorded"
            soft, hard = resource.prlimit(server.pid, resource.RLIMIT_FSIZE)
            resource.prlimit(server.pid, resource.RLIMIT_FSIZE, (1, hard))
            try:
                r = post(server.url, call_payload("add_meeting", name="b"), sid)
                assert r.status_code == 200, r.text
                assert r.json() == {"error": "", "response": "answer #2"} and r.headers["x-stm-outcome"] == "unrecorded"
                health = requests.get(server.url + "/health", timeout=10).json()
                assert health["status"] == "degraded" and "session store write failed" in health["store_problems"]["session write"]
            finally:
                resource.prlimit(server.pid, resource.RLIMIT_FSIZE, (soft, hard))
            r = post(server.url, call_payload("add_meeting", name="c"), sid)
            assert r.status_code == 200 and r.headers["x-stm-outcome"] == "recorded"
            assert requests.get(server.url + "/health", timeout=10).json()["status"] == "ok"
            calls = requests.get(f"{server.url}/sessions/{sid}", timeout=10).json()["calls"]
            assert [c["tool_input"]["name"] for c in calls] == ["a", "c"]  # the call made on the full disk is not kept
