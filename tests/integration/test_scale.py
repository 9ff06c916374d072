"""Many workers, many servers, one store: nothing lost, nothing torn, faults survived.

Real processes only: ``stabletoolbench-mirror serve --workers N`` and the OpenAI stub
(``python -m tests.helpers.openai_stub --echo-prompt``, whose answer to a call is the
simulator's own prompt for it, so every stored answer can be checked against its call).
"""

from __future__ import annotations

import json
import resource
import sqlite3
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from stabletoolbench_mirror.config import load_settings
from stabletoolbench_mirror.core import protocol
from stabletoolbench_mirror.core.call import ToolCall
from stabletoolbench_mirror.core.protocol import VirtualRequest, parse_tool_input
from stabletoolbench_mirror.responders.simulator import build_simulator
from stabletoolbench_mirror.stores import DiskcacheStore, Store
from tests.helpers.loadclient import Answer, send_all
from tests.helpers.openai_stub import OpenAIStub, Reply
from tests.helpers.processes import ServeProcess, StubProcess
from tests.helpers.redis_server import RedisServer, require_redis_server


def payloads(n: int, start: int = 0, apis: int = 40) -> list[dict[str, Any]]:
    return [
        {"category": "Data", "tool_name": "Scale Tool", "api_name": f"api {i % apis}", "tool_input": json.dumps({"n": i, "q": f"item {i}"}),
         "strip": "", "toolbench_key": ""}
        for i in range(start, start + n)
    ]


class Expectations:
    """What the stub simulator answers each payload: the simulator's prompt for that call."""

    def __init__(self) -> None:
        settings = load_settings(None, overrides={"simulator": {"enabled": True}}, environ={})
        self.simulator = build_simulator(settings)

    @staticmethod
    def call(payload: dict[str, Any]) -> ToolCall:
        request = VirtualRequest.model_validate(payload)
        return ToolCall.build(request, parse_tool_input(request.tool_input))

    def body(self, payload: dict[str, Any]) -> str:
        prompt = self.simulator.messages(self.call(payload))[-1]["content"]
        return protocol.encode_answer({"error": "", "response": prompt})


@pytest.fixture(scope="module")
def expect() -> Iterator[Expectations]:
    e = Expectations()
    yield e
    e.simulator.close()


@pytest.fixture(scope="module")
def stub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StubProcess]:
    with StubProcess(tmp_path_factory.mktemp("stub")) as s:
        yield s


def record_config(store: dict[str, Any], api_base: str, **extra: Any) -> dict[str, Any]:
    # no tool docs: the expected answers are prompts made from the names alone
    return {"mode": "record", "store": store, "simulator": {"enabled": True, "api_base": api_base, "max_retries": 0, "allow_without_docs": True},
            "limits": {"max_in_flight_per_client": 512}, **extra}


def assert_all_recorded(answers: list[Answer], sent: list[dict[str, Any]], expect: Expectations, outcome: str = "recorded") -> None:
    assert len(answers) == len(sent)
    bad = [(a.index, a.status, a.outcome, a.error, a.body[:200]) for a in answers if a.status != 200 or a.outcome != outcome]
    assert not bad, f"{len(bad)} answers not recorded, e.g. {bad[:3]}"
    for a in answers:
        assert a.body.decode() == expect.body(sent[a.index])


def assert_store_holds(store: Store, sent: list[dict[str, Any]], expect: Expectations) -> None:
    assert len(store) == len(sent)
    for payload in sent:
        call = expect.call(payload)
        record = store.get(call.api, call.key)
        assert record is not None, f"lost: {call.api} {call.key}"
        assert record.body == expect.body(payload) and record.source == "simulated"
        assert store.get_canonical(call.api, call.canonical) == record


def assert_diskcache_sound(path: Path) -> None:
    con = sqlite3.connect(path / "cache.db")
    try:
        assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    finally:
        con.close()
    import diskcache

    with warnings.catch_warnings(record=True):
        with diskcache.Cache(str(path)) as cache:
            problems = [str(w.message) for w in cache.check()]
    assert problems == [], problems


# -- many workers, one diskcache folder ---------------------------------------------------------


def test_four_workers_record_8000_distinct_concurrent_misses(tmp_path: Path, stub: StubProcess, expect: Expectations) -> None:
    sent = payloads(8000)
    config = record_config({"kind": "diskcache", "path": str(tmp_path / "store")}, stub.api_base)
    with ServeProcess(tmp_path, config, workers=4) as server:
        assert len(server.worker_pids()) == 4
        answers = send_all(server.url + "/virtual", sent, concurrency=64)
    assert_all_recorded(answers, sent, expect)
    assert_diskcache_sound(tmp_path / "store")
    with DiskcacheStore(tmp_path / "store") as store:
        assert_store_holds(store, sent, expect)


# -- two servers, one Redis ----------------------------------------------------------------------


@pytest.mark.redis
def test_two_servers_sharing_redis_record_8000_distinct_concurrent_misses(tmp_path: Path, stub: StubProcess, expect: Expectations) -> None:
    require_redis_server()
    from stabletoolbench_mirror.stores.redis_store import RedisStore

    sent = payloads(8000)
    with RedisServer(tmp_path / "redis") as redis_server:
        config = record_config({"kind": "redis", "url": redis_server.url, "prefix": "scale"}, stub.api_base)
        with ServeProcess(tmp_path, config, workers=2) as a, ServeProcess(tmp_path, config, workers=2) as b:
            answers = send_all([a.url + "/virtual", b.url + "/virtual"], sent, concurrency=64)
        assert_all_recorded(answers, sent, expect)
        with RedisStore(redis_server.url, prefix="scale") as store:
            assert_store_holds(store, sent, expect)


@pytest.mark.parametrize("kind", ["diskcache", pytest.param("redis", marks=pytest.mark.redis)])
def test_two_servers_simulate_each_call_once(kind: str, tmp_path: Path, expect: Expectations) -> None:
    """The same calls sent to two server processes at once: the simulator is asked once per call."""
    redis_server = None
    if kind == "redis":
        require_redis_server()
        redis_server = RedisServer(tmp_path / "redis").start()
        store: dict[str, Any] = {"kind": "redis", "url": redis_server.url, "prefix": "once"}
    else:
        store = {"kind": "diskcache", "path": str(tmp_path / "store")}

    def slow_echo(body: dict[str, Any]) -> Reply:
        return Reply(content=json.dumps({"error": "", "response": body["messages"][-1]["content"]}), delay_s=0.3)

    try:
        with OpenAIStub(slow_echo) as sim:
            config = record_config(store, sim.api_base)
            with ServeProcess(tmp_path, config, workers=1) as a, ServeProcess(tmp_path, config, workers=1) as b:
                calls = payloads(30, start=500_000)
                # each call four times in a row: connections alternate between the servers, so twice to each, all at once
                sent = [c for c in calls for _ in range(4)]
                answers = send_all([a.url + "/virtual", b.url + "/virtual"], sent, concurrency=len(sent))
        assert all(x.status == 200 for x in answers), [x.error or x.body[:100] for x in answers if x.status != 200][:3]
        for x in answers:
            assert x.body.decode() == expect.body(sent[x.index])
        assert sim.count == len(calls), f"the simulator was asked {sim.count} times for {len(calls)} calls"
    finally:
        if redis_server is not None:
            redis_server.close()


# -- a worker killed mid-request -----------------------------------------------------------------


def wait_for(done: Callable[[], bool], what: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"no {what} within {timeout_s:.0f} s"
        time.sleep(0.05)


def test_kill_9_of_a_worker_under_load_loses_no_acknowledged_answer(tmp_path: Path, expect: Expectations) -> None:
    import os
    import signal

    sent = payloads(4000, start=1_000_000)
    with StubProcess(tmp_path, latency_ms=15) as slow_stub:
        config = record_config({"kind": "diskcache", "path": str(tmp_path / "store")}, slow_stub.api_base)
        with ServeProcess(tmp_path, config, workers=2) as server:
            victim = server.worker_pids()[0]
            results: list[Answer] = []
            seen: list[Answer] = []
            stop = threading.Event()
            loader = threading.Thread(
                target=lambda: results.extend(send_all(server.url + "/virtual", sent, concurrency=48, stop=stop, seen=seen))
            )
            loader.start()
            # the kill and the end of the load follow the answers seen, not the clock: a busy machine only slows them
            wait_for(lambda: sum(a.ok for a in seen) >= 100 or not loader.is_alive(), "100 answers before the kill")
            os.kill(victim, signal.SIGKILL)
            killed_at = time.monotonic()
            wait_for(lambda: sum(a.ok and a.finished_at > killed_at for a in seen) >= 100 or not loader.is_alive(),
                     "100 answers after the kill")
            stop.set()
            loader.join(60)
            assert not loader.is_alive()
            # the master replaces the dead worker; the server keeps answering
            deadline = time.monotonic() + 30
            while victim in server.worker_pids() or len(server.worker_pids()) < 2:
                assert time.monotonic() < deadline, "the dead worker was not replaced"
                time.sleep(0.1)
            after = send_all(server.url + "/virtual", payloads(50, start=2_000_000), concurrency=8)
            assert all(a.status == 200 for a in after)
    acknowledged = [a for a in results if a.status == 200]
    print(f"kill -9 under load: {len(acknowledged)} acknowledged, {sum(a.status == 0 for a in results)} broken by the kill")
    # the load ran across the kill: answers were acknowledged both before it and after it
    before = sum(a.finished_at < killed_at for a in acknowledged)
    assert before > 50 and len(acknowledged) - before > 50, (before, len(acknowledged) - before)
    assert {a.status for a in results} <= {200, 0}, {a.status for a in results}
    assert_diskcache_sound(tmp_path / "store")
    with DiskcacheStore(tmp_path / "store") as store:
        for a in acknowledged:
            call = expect.call(sent[a.index])
            record = store.get(call.api, call.key)
            assert record is not None, f"acknowledged answer lost: {call.key}"
            assert record.body == a.body.decode() == expect.body(sent[a.index])
        for record in store:  # whatever else is there is whole and right
            assert record.source == "simulated" and json.loads(record.body)["error"] == ""
        assert store.add(next(iter(store)), None) is False  # opens, reads, and still adds only if absent


# -- the store's disk full -----------------------------------------------------------------------


def test_store_disk_full_serves_answers_unrecorded_then_recovers(tmp_path: Path, stub: StubProcess, expect: Expectations) -> None:
    """A real write failure: RLIMIT_FSIZE of the server process lowered to 1 byte (EFBIG on every
    file write, as a full disk gives ENOSPC), then raised again, all without restarting it.
    Clients get the simulator's answers (HTTP 200, not 503), /health says degraded, nothing
    recorded before is lost."""
    first, second = payloads(20, start=3_000_000), payloads(20, start=3_100_000)
    config = record_config({"kind": "diskcache", "path": str(tmp_path / "store")}, stub.api_base)
    with ServeProcess(tmp_path, config, workers=1) as server:
        assert_all_recorded(send_all(server.url + "/virtual", first, concurrency=4), first, expect)
        soft, hard = resource.prlimit(server.pid, resource.RLIMIT_FSIZE)
        resource.prlimit(server.pid, resource.RLIMIT_FSIZE, (1, hard))
        try:
            assert_all_recorded(send_all(server.url + "/virtual", second, concurrency=4), second, expect, outcome="unrecorded")
            health = requests.get(server.url + "/health", timeout=10).json()
            assert health["status"] == "degraded" and health["unrecorded"] == len(second)
            assert "diskcache write failed" in health["store_problems"]["write"]
            hits = send_all(server.url + "/virtual", first, concurrency=4)
            assert all(a.status == 200 and a.outcome == "hit" for a in hits)
            stats = requests.get(server.url + "/stats", timeout=10).json()
            assert stats["unrecorded"] == len(second) and stats["recorded"] == len(first)
        finally:
            resource.prlimit(server.pid, resource.RLIMIT_FSIZE, (soft, hard))
        # not recorded while the disk was full: asked again now, and recorded
        assert_all_recorded(send_all(server.url + "/virtual", second, concurrency=4), second, expect)
        assert requests.get(server.url + "/health", timeout=10).json()["status"] == "ok"
    assert_diskcache_sound(tmp_path / "store")
    with DiskcacheStore(tmp_path / "store") as store:
        assert_store_holds(store, first + second, expect)


# -- the simulator down, then back -------------------------------------------------------------


def test_simulator_down_answers_at_once_records_failures_and_recovers(tmp_path: Path, expect: Expectations) -> None:
    from tests.helpers.live import free_port

    port = free_port()  # nothing listens here yet
    config = record_config({"kind": "diskcache", "path": str(tmp_path / "store")}, f"http://127.0.0.1:{port}/v1")
    sent = payloads(10, start=4_000_000)
    with ServeProcess(tmp_path, config, workers=1) as server:
        start = time.monotonic()
        down = send_all(server.url + "/virtual", sent, concurrency=10)
        assert time.monotonic() - start < 10
        for a in down:
            assert a.status == 200 and a.outcome == "failed"
            assert a.json()["error"] == protocol.API_NOT_WORKING
        # each failure was recorded as a failure record; with the simulator back, retried and replaced
        with StubProcess(tmp_path, port=port):
            assert_all_recorded(send_all(server.url + "/virtual", sent, concurrency=10), sent, expect, outcome="replaced")
    with DiskcacheStore(tmp_path / "store") as store:
        assert_store_holds(store, sent, expect)


def test_workers_that_cannot_open_the_store_stop_with_a_clear_error(tmp_path: Path) -> None:
    """Not an endless restart loop: the master checks first; a worker that still fails stops the supervisor."""
    import os
    import subprocess
    import sys

    from tests.helpers.live import free_port
    from tests.helpers.processes import REPO

    (tmp_path / "a-file").write_text("")
    bad_store = str(tmp_path / "a-file" / "store")
    config = tmp_path / "bad.yml"
    config.write_text(json.dumps({"port": free_port(), "store": {"path": bad_store}, "log_level": "warning"}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("STM_")}
    done = subprocess.run([sys.executable, "-m", "stabletoolbench_mirror", "serve", "--config", str(config), "--workers", "2"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "cannot open diskcache store" in done.stderr and "Traceback" not in done.stderr

    # the worker side alone (uvicorn's own supervisor, settings handed over as serve does)
    handed_over = tmp_path / "settings.json"
    handed_over.write_text(json.dumps({"store": {"kind": "diskcache", "path": bad_store}, "base_dir": str(tmp_path)}))
    env["STM_SERVE_SETTINGS_FILE"] = str(handed_over)
    done = subprocess.run([sys.executable, "-m", "uvicorn", "stabletoolbench_mirror.serving.server:app_from_environment", "--factory",
                           "--workers", "2", "--port", str(free_port()), "--host", "127.0.0.1"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert "failed to start, stopping the parent process" in done.stderr


def _children(pid: int) -> dict[int, bytes]:
    found = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            for child in (task / "children").read_text().split():
                found[int(child)] = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
    return found


def test_kill_9_of_a_warm_worker_loses_no_acknowledged_answer(tmp_path: Path, expect: Expectations) -> None:
    """``warm --processes 2``: one worker process killed mid-run; the other finishes its calls, and every
    call warm reports done is in a store that opens cleanly."""
    import os
    import signal
    import subprocess
    import sys

    from tests.helpers.processes import REPO

    sent = payloads(3000, start=5_000_000)
    jsonl = tmp_path / "payloads.jsonl"
    jsonl.write_text("".join(json.dumps(p) + "\n" for p in sent))
    with StubProcess(tmp_path, latency_ms=30) as slow_stub:  # about 1,000 calls/s at concurrency 32: a 3 s run
        config = tmp_path / "warm.yml"
        config.write_text(json.dumps({**record_config({"kind": "diskcache", "path": str(tmp_path / "store")}, slow_stub.api_base),
                                      "log_level": "warning"}))
        env = {k: v for k, v in os.environ.items() if not k.startswith("STM_")}
        failures = tmp_path / "failures.jsonl"
        args = [sys.executable, "-m", "stabletoolbench_mirror", "warm", "--config", str(config), "--payloads", str(jsonl),
                "--processes", "2", "--concurrency", "32", "--failures", str(failures), "--quiet"]
        warm = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            victim = None
            seen: dict[int, bytes] = {}
            first_seen = None
            deadline = time.monotonic() + 30
            while victim is None and time.monotonic() < deadline and warm.poll() is None:
                time.sleep(0.1)
                seen = _children(warm.pid)
                workers = [pid for pid, cmd in seen.items() if b"resource_tracker" not in cmd]
                if len(workers) == 2:
                    first_seen = first_seen or time.monotonic()
                    if time.monotonic() - first_seen >= 1.0:  # well into the run
                        victim = workers[0]
            if victim is None:
                warm.kill()
                pytest.fail(f"no warm worker to kill (warm exited {warm.poll()}, children {seen}): "
                            f"{warm.communicate()[0].decode(errors='replace')[-2000:]}")
            os.kill(victim, signal.SIGKILL)
            output, _ = warm.communicate(timeout=120)
        finally:
            if warm.poll() is None:
                os.killpg(warm.pid, signal.SIGKILL)
                warm.wait()
    text = output.decode(errors="replace")
    # the survivor took over the dead worker's unanswered calls; whatever failed is reported
    assert "a warm worker process exited (code -9)" in text, text
    failed_lines = {int(json.loads(line)["location"].rsplit(":", 1)[1]) for line in failures.read_text().splitlines() if line.strip()}
    assert warm.returncode == (1 if failed_lines else 0), text
    acknowledged = [p for number, p in enumerate(sent, 1) if number not in failed_lines]
    assert len(acknowledged) > 100, text
    print(f"kill -9 during warm: {len(acknowledged)} acknowledged, {len(failed_lines)} reported failed")
    assert_diskcache_sound(tmp_path / "store")
    with DiskcacheStore(tmp_path / "store") as store:
        for payload in acknowledged:
            call = expect.call(payload)
            record = store.get(call.api, call.key)
            assert record is not None, f"acknowledged by warm but lost: {call.key}"
            assert record.body == expect.body(payload)
        for record in store:
            assert record.source == "simulated" and json.loads(record.body)["error"] == ""
