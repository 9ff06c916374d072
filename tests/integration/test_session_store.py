"""The session stores (diskcache, and a real redis-server): heads and call entries, appends that
rewrite nothing before them, expiry, documents written before (version 1), export."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stabletoolbench_mirror.commands.sessions_export import export_sessions
from stabletoolbench_mirror.engine.sessions import new_head, public_view
from stabletoolbench_mirror.stores.sessions import DiskcacheSessionStore, RedisSessionStore, SessionStore
from tests.helpers.redis_server import RedisServer, redis_prefix, redis_server  # noqa: F401


@pytest.fixture(params=["diskcache", pytest.param("redis", marks=pytest.mark.redis)])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """Opens a session store of each backend (the same data each time), closed at the end."""
    opened: list[SessionStore] = []
    if request.param == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        prefix = request.getfixturevalue("redis_prefix")

    def make(ttl_s: float = 3600.0) -> SessionStore:
        if request.param == "redis":
            store: SessionStore = RedisSessionStore(server.url, ttl_s, prefix=prefix)
        else:
            store = DiskcacheSessionStore(tmp_path / "sessions", ttl_s)
        opened.append(store)
        return store

    make.kind = request.param  # type: ignore[attr-defined]
    yield make
    for store in opened:
        store.close()


def entry(n: int, size: int = 10) -> dict[str, Any]:
    return {"api": "Tools/t/a", "api_name": "a", "tool_input": {"n": n, "pad": "x" * size}, "answer": {"error": "", "response": str(n)}, "in_history": True}


def appended(store: SessionStore, head: dict[str, Any], call: dict[str, Any]) -> dict[str, Any]:
    head = {**head, "n_calls": head["n_calls"] + 1, "in_history": [*head["in_history"], head["n_calls"]], "state": {"last": call["tool_input"]["n"]}}
    assert store.append(head, call)
    return head


def test_heads_calls_and_delete(make_store) -> None:
    store = make_store()
    head = new_head("s1", "a task")
    assert store.create(head) and not store.create(new_head("s1", "other"))
    assert store.load_head("s1")["task"] == "a task" and store.load_head("nobody") is None
    for n in range(3):
        head = appended(store, head, entry(n))
    assert [c["tool_input"]["n"] for c in store.calls("s1", [2, 0])] == [2, 0]
    doc = store.load("s1")
    assert [c["tool_input"]["n"] for c in doc["calls"]] == [0, 1, 2] and doc["state"] == {"last": 2}
    assert public_view(doc)["calls"] == doc["calls"]
    assert len(store) == 1 and [d["id"] for d in store] == ["s1"]
    assert store.delete("s1") and not store.delete("s1")
    assert store.load("s1") is None and store.load_head("s1") is None
    assert not store.append({**head, "n_calls": 4}, entry(3))  # a deleted session is not written again
    # an id created again starts with no calls of the old session
    assert store.create(new_head("s1")) and store.load("s1")["calls"] == []


def _written(make_store, store: SessionStore, fn: Any) -> int:
    """Bytes the store wrote while ``fn`` ran: what redis-server received, or this process's writes."""
    if make_store.kind == "redis":
        info = lambda: int(store._client.info("stats")["total_net_input_bytes"])  # noqa: E731, SLF001
    else:
        info = lambda: int(Path("/proc/self/io").read_text().split("wchar:")[1].split()[0])  # noqa: E731
    before = info()
    fn()
    return info() - before


def test_an_append_rewrites_none_of_the_calls_before_it(make_store) -> None:
    store = make_store()
    head = new_head("long")
    store.create(head)
    size = 100_000
    costs = []
    for n in range(30):
        box: dict[str, Any] = {"head": head, "call": entry(n, size)}
        costs.append(_written(make_store, store, lambda box=box: box.update(head=appended(store, box["head"], box["call"]))))
        head = box["head"]
    # each append writes about one call, however many there are before it (a rewrite would be 30 calls' worth)
    assert max(costs[-5:]) < 3 * size, costs
    assert max(costs[-5:]) < 2 * max(costs[1:5]) + 50_000, costs
    assert len(store.load("long")["calls"]) == 30


def test_calls_outlive_their_head_while_the_session_is_used_then_expire(make_store) -> None:
    ttl_s = 1.5
    store = make_store(ttl_s=ttl_s)
    head = new_head("short")
    store.create(head)
    started = last = time.monotonic()
    gaps, n = [], 0
    while time.monotonic() - started < 2 * ttl_s:  # used for twice its idle expiry, a call every 0.3 s
        head = appended(store, head, entry(n))
        gaps.append(time.monotonic() - last)
        last = time.monotonic()
        n += 1
        time.sleep(0.3)
    # the precondition, measured: no pause between two calls came near the expiry (a loaded machine may stretch them)
    assert max(gaps) < 0.8 * ttl_s, gaps
    assert [c["tool_input"]["n"] for c in store.load("short")["calls"]] == list(range(n))
    deadline = time.monotonic() + 20
    while store.load_head("short") is not None:
        assert time.monotonic() < deadline, "the idle session never expired"
        time.sleep(0.2)
    assert store.load("short") is None


def _write_version_1(make_store, store: SessionStore, doc: dict[str, Any]) -> None:
    # exactly as the store wrote documents before: the whole session, calls inside, in one value
    text = json.dumps(doc, ensure_ascii=False, separators=(",", ":"))
    if make_store.kind == "redis":
        store._client.set(store._key(doc["id"]), text, px=3_600_000)  # noqa: SLF001
    else:
        store._cache.add(doc["id"], text, expire=3600)  # noqa: SLF001


def test_documents_written_before_are_read_and_continued(make_store, tmp_path: Path) -> None:
    store = make_store()
    old = {**{k: v for k, v in new_head("old", "before").items() if k not in ("n_calls", "calls_bytes", "in_history")}, "v": 1}
    old["calls"] = [{**entry(0), "in_history": False}, entry(1)]
    old["state"] = {"kept": True}
    _write_version_1(make_store, store, old)
    assert store.load("old")["calls"] == old["calls"]
    out = tmp_path / "before.jsonl"
    assert export_sessions(store, str(out), progress=False) == 1
    assert json.loads(out.read_text())["calls"] == old["calls"]
    # the next call splits it into a head and entries, then adds to it
    head = store.load_head("old")
    assert head["n_calls"] == 2 and head["in_history"] == [1] and head["state"] == {"kept": True} and "calls" not in head
    head = appended(store, head, entry(2))
    doc = make_store().load("old")  # as another process reads it
    assert [c["tool_input"]["n"] for c in doc["calls"]] == [0, 1, 2] and doc["task"] == "before"
    assert store.delete("old") and store.load("old") is None
