"""A Redis store through the real HTTP server: restarts, memory full and read-only still answer (unrecorded,
/health degraded), then recover."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
import redis
import requests

from stabletoolbench_mirror.layer import MirrorLayer
from stabletoolbench_mirror.stores.redis_store import RedisStore

from tests.helpers.redis_server import RedisServer, require_redis_server
from tests.helpers.responders import KeyedResponder, expected_answer

pytestmark = pytest.mark.redis


def payload(i: int) -> dict[str, Any]:
    return {"category": "Data", "tool_name": "Fault Tool", "api_name": f"api {i % 5}", "tool_input": f'{{"n": {i}}}',
            "strip": "", "toolbench_key": ""}


def namespace(i: int) -> str:
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


def assert_served_unrecorded(r: requests.Response, i: int) -> None:
    """The responder's answer, HTTP 200 (not an error the client turns into a tool failure), not recorded."""
    assert r.status_code == 200, r.text
    assert r.json() == expected_answer(namespace(i), f"{{'n': {i}}}")
    assert r.headers["x-stm-outcome"] == "unrecorded"


def assert_store_unavailable(r: requests.Response) -> None:
    assert r.status_code == 503, r.text
    data = r.json()
    assert set(data) == {"error", "response"}
    assert "response store is unavailable" in data["error"] and "redis" in data["error"]
    assert r.headers["x-stm-outcome"] == "store_error"


def test_redis_restart_mid_run_answers_while_down_then_records(own_redis: RedisServer, redis_app, caplog) -> None:
    server, layer = redis_app
    session = requests.Session()
    for i in range(20):
        r = session.post(server.url + "/virtual", json=payload(i), timeout=10)
        assert r.status_code == 200 and r.json() == expected_answer(namespace(i), f"{{'n': {i}}}")

    # steady load from other clients while Redis goes away and comes back
    statuses: list[int] = []
    stop = threading.Event()

    def load(offset: int) -> None:
        s = requests.Session()
        n = 0
        while not stop.is_set():
            i = offset + n % 40  # hits of the first 20 and new misses
            r = s.post(server.url + "/virtual", json=payload(i), timeout=10)
            statuses.append(r.status_code)
            assert r.status_code == 200 and r.json() == expected_answer(namespace(i), f"{{'n': {i}}}")
            n += 1

    threads = [threading.Thread(target=load, args=(k * 1000,)) for k in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    caplog.set_level("WARNING", logger="stabletoolbench_mirror.store_health")
    own_redis.stop()
    try:
        for i in (77_777, 88_888, 99_999):  # calls this server has not seen: Redis must be asked
            start = time.monotonic()
            r = session.post(server.url + "/virtual", json=payload(i), timeout=10)
            assert time.monotonic() - start < 2.0, "a Redis outage must answer quickly"
            assert_served_unrecorded(r, i)
        health = session.get(server.url + "/health", timeout=10).json()
        assert health["status"] == "degraded" and health["unrecorded"] >= 3 and "redis" in json.dumps(health["store_problems"])
        # answers this server has already read stay available from its memory of them
        r = session.post(server.url + "/virtual", json=payload(5), timeout=10)
        assert r.status_code == 200 and r.json() == expected_answer(namespace(5), "{'n': 5}")
        time.sleep(0.3)
    finally:
        own_redis.start()
    time.sleep(0.3)
    stop.set()
    for t in threads:
        t.join(20)
    assert set(statuses) == {200}
    # the outage was logged once (per interval), not once per request
    down = [r for r in caplog.records if "cannot" in r.getMessage() and "not recorded" in r.getMessage()]
    assert len(down) == 1, [r.getMessage() for r in down]

    # normal service after, without a restart of the mirror; recorded answers survived
    for i in list(range(20)) + [99_999, 123_456]:
        r = session.post(server.url + "/virtual", json=payload(i), timeout=10)
        assert r.status_code == 200, r.text
        assert r.json() == expected_answer(namespace(i), f"{{'n': {i}}}")
    assert layer.store.get(namespace(99_999), "{'n': 99999}") is not None  # recorded now that Redis is back
    assert session.get(server.url + "/health", timeout=10).json()["status"] == "ok"
    assert layer.stats.snapshot()["unrecorded"] >= 3
    # nothing half-written: every canonical pointer names an entry
    check_pointers(own_redis.url, "faults")


def test_lock_left_by_a_redis_outage_is_released_when_redis_returns(own_redis: RedisServer) -> None:
    store = RedisStore(own_redis.url, prefix="orphan", lock_ttl_s=30.0)
    other = RedisStore(own_redis.url, prefix="orphan", lock_ttl_s=30.0)
    with store.flight_lock("Data/t_for_Data/a", "k"):
        own_redis.stop()
    # the release failed; the lock (30 s lease) is still in Redis's data when it restarts
    assert store._leases.pending_releases == 1  # noqa: SLF001
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
        assert "maxmemory" in requests.get(server.url + "/health", timeout=10).json()["store_problems"]["write"]
        assert server.post(payload(3)).status_code == 200  # reads still work
    finally:
        admin.config_set("maxmemory", 0)
    r = server.post(payload(50))
    assert r.status_code == 200 and r.json() == expected_answer(namespace(50), "{'n': 50}")
    assert r.headers["x-stm-outcome"] == "recorded"
    assert requests.get(server.url + "/health", timeout=10).json()["status"] == "ok"
    admin.close()


def test_redis_read_only_replica_refuses_writes_and_recovers(own_redis: RedisServer, redis_app) -> None:
    from tests.helpers.live import free_port

    server, _layer = redis_app
    assert server.post(payload(1)).status_code == 200
    admin = redis.Redis.from_url(own_redis.url)
    admin.execute_command("REPLICAOF", "127.0.0.1", str(free_port()))  # a master that is not there: read-only
    try:
        assert_served_unrecorded(server.post(payload(60)), 60)
        problem = requests.get(server.url + "/health", timeout=10).json()["store_problems"]["write"]
        assert "READONLY" in problem or "read only" in problem
        assert server.post(payload(1)).status_code == 200
    finally:
        admin.execute_command("REPLICAOF", "NO", "ONE")
    r = server.post(payload(60))
    assert r.status_code == 200 and r.json() == expected_answer(namespace(60), "{'n': 60}")
    assert r.headers["x-stm-outcome"] == "recorded"
    admin.close()


def test_redis_url_password_never_appears_in_errors(tmp_path: Path, serve, settings_factory) -> None:
    from tests.helpers.live import free_port

    url = f"redis://:s3cret-pw@127.0.0.1:{free_port()}/0"  # nothing listens there
    settings = settings_factory(store={"kind": "redis", "url": url})
    assert "s3cret-pw" in settings.secrets()
    server = serve(settings)
    r = server.post(payload(1))
    assert_store_unavailable(r)
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

    from stabletoolbench_mirror.records import Record
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
