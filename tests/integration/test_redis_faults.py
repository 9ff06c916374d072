"""A Redis store through the real HTTP server: restarts, memory full and read-only still answer (HTTP 200, the
answer unrecorded, /health degraded), then recover."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
import requests

from stabletoolbench_mirror.engine.layer import MirrorLayer
from stabletoolbench_mirror.stores.redis_store import RedisStore
from tests.helpers.redis_server import RedisServer, require_redis_server
from tests.helpers.responders import KeyedResponder, expected_answer

pytestmark = pytest.mark.redis


def payload(i: int) -> dict[str, Any]:
    return {"category": "Data", "tool_name": "Fault Tool", "api_name": f"api {i % 5}", "tool_input": f'{{"n": {i}}}',
            "strip": "", "toolbench_key": ""}


def api(i: int) -> str:
    return f"Data/fault_tool_for_Data/api_{i % 5}"


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    require_redis_server()
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.close()


@pytest.fixture
def redis_app(own_redis: RedisServer, serve, settings_factory):
    settings = settings_factory(store={"kind": "redis", "url": own_redis.url, "prefix": "faults"})
    layer = MirrorLayer(RedisStore(own_redis.url, prefix="faults", timeout_s=1.0), responders=[KeyedResponder()])
    server = serve(settings, layer)
    return server, layer


def assert_store_unavailable(r: requests.Response) -> None:
    assert r.status_code == 503, r.text
    data = r.json()
    assert set(data) == {"error", "response"}
    assert "response store is unavailable" in data["error"] and "redis" in data["error"]
    assert r.headers["x-stm-outcome"] == "store_error"


def is_outage_answer(r: requests.Response) -> bool:
    """Whether ``r`` is what a call that needs the store gets while Redis is down: the responder's answer,
    HTTP 200 (not an error the client would turn into a tool failure), served but not recorded."""
    assert r.status_code == 200, r.text
    return r.headers["x-stm-outcome"] == "unrecorded"


def assert_served_unrecorded(r: requests.Response, i: int) -> None:
    assert is_outage_answer(r), r.headers
    assert r.json() == expected_answer(api(i), f"{{'n': {i}}}")


def health(server) -> dict[str, Any]:
    return requests.get(server.url + "/health", timeout=10).json()


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    """Wait until ``condition()`` holds (polling); fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:.0f}s waiting for: {what}")
        time.sleep(0.02)


@dataclass(frozen=True)
class Sent:
    i: int
    fresh: bool
    """Whether this server had never seen the call (so Redis must be asked)."""
    phases: tuple[str, str]
    """Redis's phase (``up``, ``down``, ``back``) when the request was sent and when it was answered."""
    outage: bool


class LoadClient(threading.Thread):
    """A client sending, in turn, a call this server has answered before and a call it has never seen."""

    def __init__(self, url: str, offset: int, phase: Callable[[], str]) -> None:
        super().__init__(daemon=True)
        self.url, self.offset, self.phase = url, offset, phase
        self.sent: list[Sent] = []
        self.error: BaseException | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        session = requests.Session()
        n = 0
        try:
            while not self.stop.is_set():
                fresh = n % 2 == 1
                i = self.offset + n if fresh else (n // 2) % 20
                before = self.phase()
                r = session.post(self.url + "/virtual", json=payload(i), timeout=30)
                outage = is_outage_answer(r)
                assert r.json() == expected_answer(api(i), f"{{'n': {i}}}")
                self.sent.append(Sent(i, fresh, (before, self.phase()), outage))
                n += 1
        except BaseException as exc:  # reported by the test, not lost with the thread
            self.error = exc


def test_redis_restart_mid_run_answers_while_down_then_records(own_redis: RedisServer, redis_app, caplog) -> None:
    server, layer = redis_app
    layer.health.log_interval_s = 3600.0  # one message for the whole outage, however slow the machine
    caplog.set_level("WARNING", logger="stabletoolbench_mirror.engine.store_health")
    session = requests.Session()
    for i in range(20):
        r = session.post(server.url + "/virtual", json=payload(i), timeout=10)
        assert r.status_code == 200 and r.json() == expected_answer(api(i), f"{{'n': {i}}}")
    for i in range(20):  # read back (a hit): the server now remembers these answers
        r = session.post(server.url + "/virtual", json=payload(i), timeout=10)
        assert r.headers["x-stm-outcome"] == "hit"

    # steady load from other clients while Redis goes away and comes back; each step waits for
    # what it needs to have happened (no fixed sleeps), so the test holds however slow the machine
    phase = ["up"]
    clients = [LoadClient(server.url, (k + 1) * 100_000, lambda: phase[0]) for k in range(3)]

    def seen(what: Callable[[Sent], bool]) -> bool:
        for client in clients:
            if client.error is not None:
                raise AssertionError(f"load client failed: {client.error!r}") from client.error
        return any(what(s) for client in clients for s in list(client.sent))

    for client in clients:
        client.start()
    wait_for(lambda: seen(lambda s: s.fresh and not s.outage), "load recorded new calls with Redis up")
    own_redis.stop()
    phase[0] = "down"
    try:
        wait_for(lambda: seen(lambda s: s.fresh and s.outage and s.phases == ("down", "down")),
                 "a load client got the outage answer for a new call while Redis was down")
        for i in (77_777, 88_888, 99_999):  # calls this server has not seen: Redis must be asked
            start = time.monotonic()
            r = session.post(server.url + "/virtual", json=payload(i), timeout=10)
            assert time.monotonic() - start < 2.0, "a Redis outage must answer quickly"
            assert_served_unrecorded(r, i)
        now = health(server)
        assert now["status"] == "degraded" and now["unrecorded"] >= 3 and "redis" in str(now["store_problems"])
        # answers this server has already read stay available from its memory of them
        r = session.post(server.url + "/virtual", json=payload(5), timeout=10)
        assert r.status_code == 200 and r.json() == expected_answer(api(5), "{'n': 5}")
        wait_for(lambda: seen(lambda s: not s.fresh and not s.outage and s.phases == ("down", "down")),
                 "a load client got a remembered answer while Redis was down")
    finally:
        own_redis.start()
    phase[0] = "back"
    wait_for(lambda: seen(lambda s: s.fresh and not s.outage and s.phases == ("back", "back")),
             "a load client recorded a new call after Redis came back")
    for client in clients:
        client.stop.set()
    for client in clients:
        client.join(60)
        assert not client.is_alive() and client.error is None, client.error
    sent = [s for client in clients for s in client.sent]
    # a remembered answer never needs Redis; once Redis is back, nothing gets the outage answer
    assert not [s for s in sent if s.outage and (not s.fresh or s.phases[0] == "back")]

    # normal service after, without a restart of the mirror; recorded answers survived
    for i in list(range(20)) + [99_999, 123_456]:
        r = session.post(server.url + "/virtual", json=payload(i), timeout=10)
        assert r.status_code == 200, r.text
        assert r.json() == expected_answer(api(i), f"{{'n': {i}}}")
    assert layer.store.get(api(99_999), "{'n': 99999}") is not None  # recorded now that Redis is back
    assert health(server)["status"] == "ok"
    assert layer.stats.snapshot()["unrecorded"] >= 4
    # the outage was logged once (per interval), not once per request
    down = [r.getMessage() for r in caplog.records if "answers are served but not recorded" in r.getMessage()]
    assert len(down) == 1, down
    # nothing half-written: every canonical pointer names an entry
    check_pointers(own_redis.url, "faults")


def test_lock_left_by_a_redis_outage_is_released_when_redis_returns(own_redis: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    store = RedisStore(own_redis.url, prefix="orphan", lock_ttl_s=30.0)
    other = RedisStore(own_redis.url, prefix="orphan", lock_ttl_s=30.0)
    with store.flight_lock("Data/t_for_Data/a", "k"):
        own_redis.stop()
    # the release failed (retried in the background); the lock (30 s lease) is still in Redis's data when it restarts
    assert [r for r in caplog.records if "not released now (Redis unavailable)" in r.getMessage()]
    own_redis.start()
    start = time.monotonic()
    with other.flight_lock("Data/t_for_Data/a", "k"):
        waited = time.monotonic() - start
    assert waited < 5.0, f"waited {waited:.1f}s for a lock whose holder had finished"
    store.close()
    other.close()


def check_pointers(url: str, prefix: str) -> None:
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        for ns in client.smembers(f"{prefix}:namespaces"):
            entries = client.hgetall(f"{prefix}:e:{ns}")
            for _canonical, key in client.hgetall(f"{prefix}:c:{ns}").items():
                assert key in entries
    finally:
        client.close()


def test_redis_memory_full_refuses_writes_serves_hits_and_recovers(own_redis: RedisServer, redis_app) -> None:
    server, _layer = redis_app
    for i in range(5):
        assert server.post(payload(i)).status_code == 200
    admin = redis.Redis.from_url(own_redis.url)
    admin.config_set("maxmemory-policy", "noeviction")
    admin.config_set("maxmemory", 1)  # far below what is in use: every write is refused with OOM
    try:
        assert_served_unrecorded(server.post(payload(50)), 50)
        assert "maxmemory" in health(server)["store_problems"]["write"]
        assert server.post(payload(3)).status_code == 200  # reads still work
    finally:
        admin.config_set("maxmemory", 0)
    r = server.post(payload(50))
    assert r.status_code == 200 and r.json() == expected_answer(api(50), "{'n': 50}")
    assert r.headers["x-stm-outcome"] == "recorded" and health(server)["status"] == "ok"
    admin.close()


def test_redis_read_only_replica_refuses_writes_and_recovers(own_redis: RedisServer, redis_app) -> None:
    from tests.helpers.live import free_port

    server, _layer = redis_app
    assert server.post(payload(1)).status_code == 200
    admin = redis.Redis.from_url(own_redis.url)
    admin.execute_command("REPLICAOF", "127.0.0.1", str(free_port()))  # a master that is not there: read-only
    try:
        assert_served_unrecorded(server.post(payload(60)), 60)
        problem = health(server)["store_problems"]["write"]
        assert "READONLY" in problem or "read only" in problem
        assert server.post(payload(1)).status_code == 200
    finally:
        admin.execute_command("REPLICAOF", "NO", "ONE")
    r = server.post(payload(60))
    assert r.status_code == 200 and r.json() == expected_answer(api(60), "{'n': 60}")
    assert r.headers["x-stm-outcome"] == "recorded"
    admin.close()


def test_redis_url_password_never_appears_in_errors(tmp_path: Path, serve, settings_factory) -> None:
    from tests.helpers.live import free_port

    url = f"redis://:s3cret-pw@127.0.0.1:{free_port()}/0"  # nothing listens there
    settings = settings_factory(store={"kind": "redis", "url": url})
    assert "s3cret-pw" in settings.secrets()
    server = serve(settings)
    r = server.post(payload(1))
    assert_store_unavailable(r)  # nothing configured to answer a miss: nothing to serve, so the store's error
    assert "s3cret-pw" not in r.text


def test_a_redis_that_never_answers_is_an_error_within_the_timeout() -> None:
    """A host that accepts connections and then says nothing (a hung Redis, a black hole)."""
    import socket

    from stabletoolbench_mirror.stores import StoreError

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    port = listener.getsockname()[1]
    try:
        store = RedisStore(f"redis://127.0.0.1:{port}/0", timeout_s=0.3)
        start = time.monotonic()
        with pytest.raises(StoreError, match="TimeoutError|Timeout"):
            store.get("Data/t_for_Data/a", "{}")
        assert time.monotonic() - start < 1.5
        store.close()
    finally:
        listener.close()


def test_async_reads_match_sync_reads_and_fail_as_store_errors(own_redis: RedisServer) -> None:
    import asyncio

    from stabletoolbench_mirror.core.records import Record
    from stabletoolbench_mirror.stores import StoreError

    ns = "Data/t_for_Data/a"
    writer = RedisStore(own_redis.url, prefix="async")
    writer.add(Record.from_answer(ns, "{'a': 1}", {"error": "", "response": "one"}, "simulated", "m"), "ca")

    async def reads() -> tuple:
        reader = RedisStore(own_redis.url, prefix="async")  # a fresh process's view: nothing in memory
        try:
            return (await reader.aget(ns, "{'a': 1}"), await reader.aget(ns, "{'b': 2}"),
                    await RedisStore(own_redis.url, prefix="async").aget_canonical(ns, "ca"))
        finally:
            reader.close()

    exact, absent, by_canonical = asyncio.run(reads())
    assert exact == writer.get(ns, "{'a': 1}") == by_canonical and absent is None
    own_redis.stop()

    async def read_while_down() -> None:
        await RedisStore(own_redis.url, prefix="async").aget(ns, "{'a': 1}")

    with pytest.raises(StoreError, match="read failed"):
        asyncio.run(read_while_down())
    writer.close()


def test_a_paused_redis_is_waited_for_at_most_store_timeout_s_per_request(own_redis: RedisServer, serve, settings_factory,
                                                                          tmp_path: Path) -> None:
    """Redis stopped with SIGSTOP (it accepts connections and says nothing, as a Redis swapping or paused by
    ``DEBUG SLEEP`` does): a frozen cache's answer is served after at most one wait of ``store.timeout_s`` for the
    store, not after every read, its retry and a second lookup (8 s at 2 s); a record-mode miss is answered,
    unrecorded, without waiting again for the lock, the re-read and the write; once Redis runs again, the next
    calls are recorded again."""
    import json as json_module
    import os
    import signal

    from stabletoolbench_mirror.stores.frozen import FrozenCache

    timeout_s = 2.0
    tree = tmp_path / "tree"
    frozen_api = api(0)
    category, tool, name = frozen_api.split("/")
    (tree / category / tool).mkdir(parents=True)
    (tree / category / tool / f"{name}.json").write_text(json_module.dumps({"{'n': 0}": {"error": "", "response": "from the frozen tree"}}))
    settings = settings_factory(store={"kind": "redis", "url": own_redis.url, "prefix": "paused", "timeout_s": timeout_s})
    layer = MirrorLayer(RedisStore(own_redis.url, prefix="paused", timeout_s=timeout_s), frozen=[FrozenCache(tree)],
                        responders=[KeyedResponder()])
    server = serve(settings, layer)
    session = requests.Session()
    assert session.post(server.url + "/virtual", json=payload(5), timeout=30).headers["x-stm-outcome"] == "recorded"
    assert own_redis.process is not None
    os.kill(own_redis.process.pid, signal.SIGSTOP)
    try:
        timed: list[tuple[float, requests.Response]] = []
        for i in (0, 0, 10, 15):  # the frozen answer twice, then two new calls
            start = time.monotonic()
            r = session.post(server.url + "/virtual", json=payload(i), timeout=60)
            timed.append((time.monotonic() - start, r))
        # the waits are those of store.timeout_s: at most one each, however many reads, locks and writes a call makes
        assert all(elapsed < 2.5 * timeout_s for elapsed, _ in timed), [round(e, 2) for e, _ in timed]
        for _elapsed, r in timed[:2]:
            assert r.status_code == 200 and r.headers["x-stm-outcome"] == "hit" and r.headers["x-stm-source"] == "frozen"
            assert r.json() == {"error": "", "response": "from the frozen tree"}
        for (_elapsed, r), i in zip(timed[2:], (10, 15)):
            assert_served_unrecorded(r, i)
        assert health(server)["status"] == "degraded"
    finally:
        os.kill(own_redis.process.pid, signal.SIGCONT)

    def recorded_again() -> bool:
        r = session.post(server.url + "/virtual", json=payload(20 + int(time.monotonic() * 1000) % 1000), timeout=60)
        return r.headers["x-stm-outcome"] == "recorded"

    wait_for(recorded_again, "a new call recorded once Redis runs again")
