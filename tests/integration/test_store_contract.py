"""Both writable stores keep the same contract: add-if-absent, canonical pointers, JSON, processes, locks."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from stabletoolbench_mirror.core.call import ToolCall
from stabletoolbench_mirror.core.records import Record
from stabletoolbench_mirror.engine.layer import MirrorLayer
from stabletoolbench_mirror.stores import DiskcacheStore, Store, StoreError
from stabletoolbench_mirror.stores import diskcache_layout as layout
from stabletoolbench_mirror.stores.diskcache_keys import CHANGES
from tests.helpers.redis_server import RedisServer, redis_prefix, redis_server, require_redis_server  # noqa: F401
from tests.helpers.responders import KeyedResponder, expected_answer
from tests.helpers.store_fixtures import shared_spec, spec, store  # noqa: F401
from tests.helpers.store_workers import add_many, hold_lock_forever, open_store

NS = "Cat/tool_for_Cat/api"


def rec(key: str, text: str, ns: str = NS, source: str = "simulated") -> Record:
    return Record.from_answer(ns, key, {"error": "", "response": text}, source, "test")  # type: ignore[arg-type]


def test_add_if_absent_first_writer_wins(store: Store) -> None:
    assert store.get(NS, "{'a': 1}") is None
    assert store.add(rec("{'a': 1}", "first"), "c1") is True
    assert store.add(rec("{'a': 1}", "second"), "c1") is False
    got = store.get(NS, "{'a': 1}")
    assert got is not None and got.answer == {"error": "", "response": "first"}
    assert got.source == "simulated" and got.origin == "test"
    assert store.get("Other/x_for_Other/y", "{'a': 1}") is None


def test_canonical_pointer_names_the_first_key(store: Store) -> None:
    store.add(rec("{'a': 1, 'b': 2}", "ab"), "canon")
    store.add(rec("{'b': 2, 'a': 1}", "ba"), "canon")
    assert store.get_canonical(NS, "canon").answer["response"] == "ab"  # type: ignore[union-attr]
    assert store.get(NS, "{'b': 2, 'a': 1}").answer["response"] == "ba"  # type: ignore[union-attr]
    assert store.get_canonical(NS, "other") is None
    store.add(rec("{}", "no canonical"), None)
    assert store.get(NS, "{}") is not None


def test_sample_iter_len(store: Store) -> None:
    for i in range(12):
        store.add(rec(f"{{'i': {i}}}", f"r{i}"), f"c{i}")
    store.add(rec("{'z': 0}", "elsewhere", ns="Other/t_for_Other/b"), "cz")
    sample = list(store.sample(NS, 5))
    assert len(sample) == 5 and all(r.api == NS for r in sample)
    assert len({r.key for r in sample}) == 5
    assert len(list(store.sample(NS, 100))) == 12
    assert list(store.sample("No/such_for_No/api", 5)) == []
    assert len(store) == 13
    assert sorted(r.key for r in store if r.api == NS) == sorted(f"{{'i': {i}}}" for i in range(12))


def test_values_are_json_not_pickles(shared_spec: dict[str, Any]) -> None:
    spec = shared_spec
    with open_store(spec) as store:
        store.add(rec("{'q': 'x'}", "café"), "cq")
    if spec["kind"] == "redis":
        import redis

        client = redis.Redis.from_url(spec["url"])
        raw = client.hget(f"{spec['prefix']}:e:{NS}", "{'q': 'x'}")
        client.close()
    else:
        con = sqlite3.connect(os.path.join(spec["path"], "cache.db"))
        (raw,) = con.execute("SELECT value FROM Cache WHERE key = ?", (f"e\x00{NS}\x00{{'q': 'x'}}",)).fetchone()
        con.close()
    data = json.loads(raw)
    assert data["body"] == '{"error":"","response":"café"}' and data["source"] == "simulated"


def test_concurrent_processes_agree_on_one_winner_per_key(shared_spec: dict[str, Any]) -> None:
    ctx = multiprocessing.get_context("spawn")
    keys, writers = 300, 4
    start_at = time.time() + 2.0
    with ctx.Pool(writers) as pool:
        won = pool.starmap(add_many, [(shared_spec, w, keys, start_at) for w in range(writers)])
    owner: dict[int, int] = {}
    for writer, keys_won in enumerate(won):
        for i in keys_won:
            assert i not in owner, f"key {i} added by writers {owner[i]} and {writer}"
            owner[i] = writer
    assert sorted(owner) == list(range(keys))
    store = open_store(shared_spec)
    try:
        assert len(store) == keys
        for i, writer in owner.items():
            ns = f"Cat/tool_for_Cat/api{i % 7}"
            assert store.get(ns, f"{{'i': {i}}}").answer["response"] == f"writer {writer}"  # type: ignore[union-attr]
            assert store.get_canonical(ns, f"canon-{i}").origin == f"w{writer}"  # type: ignore[union-attr]
    finally:
        store.close()


def test_flight_lock_excludes_another_store_instance(spec: dict[str, Any]) -> None:
    """Two instances (two connections: like two processes or hosts) never hold one key's lock together."""
    a, b = open_store(spec), open_store(spec)
    holding = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with a.flight_lock(NS, "k"):
            holding.set()
            release.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    assert holding.wait(10)
    got_it = threading.Event()

    def wait_for_it() -> None:
        with b.flight_lock(NS, "k"):
            got_it.set()

    w = threading.Thread(target=wait_for_it)
    w.start()
    assert not got_it.wait(0.4), "a second holder got the lock"
    with b.flight_lock(NS, "another key"):
        pass  # other keys are not blocked
    release.set()
    assert got_it.wait(5)
    t.join(5)
    w.join(5)
    a.close()
    b.close()


def test_flight_lock_of_a_killed_holder_is_freed(shared_spec: dict[str, Any]) -> None:
    """kill -9 of a holder: diskcache's kernel lock goes at once; Redis's lease runs out (1.5 s here)."""
    shared_spec = dict(shared_spec, lock_ttl_s=1.5)
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    holder = ctx.Process(target=hold_lock_forever, args=(shared_spec, NS, "k", ready))
    holder.start()
    try:
        assert ready.wait(30)
        os.kill(holder.pid, signal.SIGKILL)  # type: ignore[arg-type]
        holder.join(10)
        store = open_store(shared_spec)
        start = time.monotonic()
        with store.flight_lock(NS, "k"):
            waited = time.monotonic() - start
        store.close()
        if shared_spec["kind"] == "redis":
            assert 0.2 < waited < 5.0, waited
        else:
            assert waited < 1.0, waited
    finally:
        if holder.is_alive():
            holder.kill()


def test_flight_lock_is_renewed_while_held(spec: dict[str, Any]) -> None:
    """A holder working longer than the lease keeps its lock (Redis: the lease keeper renews it)."""
    spec = dict(spec, lock_ttl_s=0.6)
    a, b = open_store(spec), open_store(spec)
    holding, release, got_it = threading.Event(), threading.Event(), threading.Event()

    def hold() -> None:
        with a.flight_lock(NS, "k"):
            holding.set()
            release.wait(10)

    def wait_for_it() -> None:
        with b.flight_lock(NS, "k"):
            got_it.set()

    t = threading.Thread(target=hold)
    t.start()
    assert holding.wait(10)
    w = threading.Thread(target=wait_for_it)
    w.start()
    assert not got_it.wait(2.0), "the lease ran out while its holder was working"
    release.set()
    assert got_it.wait(5)
    t.join(5)
    w.join(5)
    a.close()
    b.close()


def test_two_layers_on_one_store_simulate_a_call_once(spec: dict[str, Any]) -> None:
    """Cross-process / cross-host single flight: two layers with their own store connections."""
    responders = [KeyedResponder(delay_s=0.3), KeyedResponder(delay_s=0.3)]
    layers = [MirrorLayer(open_store(spec), responders=[r]) for r in responders]
    call = ToolCall.of("Cat", "tool", "api", {"city": "Paris"})
    outcomes = []
    lock = threading.Lock()

    def ask(layer: MirrorLayer) -> None:
        out = layer.handle_call(call)
        with lock:
            outcomes.append(out)

    threads = [threading.Thread(target=ask, args=(layers[i % 2],)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert sum(r.calls for r in responders) == 1
    assert len(outcomes) == 8 and len({o.body for o in outcomes}) == 1
    assert outcomes[0].answer == expected_answer(call.api, call.key)
    for layer in layers:
        layer.close()


def test_diskcache_open_failure_is_a_store_error(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(StoreError, match="cannot open diskcache store"):
        DiskcacheStore(blocker / "store")


def test_redis_record_memory_is_bounded_and_never_remembers_absence() -> None:
    from stabletoolbench_mirror.stores.redis_kept import KeptReads

    memory = KeptReads(max_bytes=20_000)
    memory.go_live()  # as when its store hears invalidations
    for i in range(200):
        memory.put((NS, str(i)), rec(str(i), "x" * 100))
    assert memory.get((NS, "199")) is not None and memory.get((NS, "0")) is None  # least recently used went first
    memory.put((NS, "big"), rec("big", "y" * 10_000))  # over a quarter of the budget: not kept
    assert memory.get((NS, "big")) is None


@pytest.mark.redis
def test_redis_recall_only_what_was_read_or_written(redis_server: RedisServer, redis_prefix: str) -> None:
    from stabletoolbench_mirror.stores.redis_store import RedisStore

    writer, reader = RedisStore(redis_server.url, prefix=redis_prefix), RedisStore(redis_server.url, prefix=redis_prefix)
    writer.add(rec("{'a': 1}", "one"), "ca")
    assert reader.recall(NS, "{'a': 1}") is None  # another host's write is not in this one's memory
    assert reader.get_canonical(NS, "ca").answer["response"] == "one"  # type: ignore[union-attr]
    assert reader.recall(NS, "{'a': 1}").answer["response"] == "one"  # type: ignore[union-attr]
    assert reader.get(NS, "{'zz': 0}") is None and reader.recall(NS, "{'zz': 0}") is None
    writer.close()
    reader.close()


# -- failure records ----------------------------------------------------------------------------


def fail(key: str, ns: str = NS, text: str = "Failed to generate fake response") -> Record:
    return Record.failure(ns, key, {"error": text, "response": ""}, "simulated", "test",
                          reason="simulator output not parsable", tried=("simulated:test",))


def test_a_usable_answer_replaces_a_failure_record_and_nothing_replaces_an_answer(store: Store) -> None:
    key = "{'a': 1}"
    assert store.add(fail(key), "c") is True
    got = store.get(NS, key)
    assert got is not None and got.is_failure and got.reason == "simulator output not parsable"
    assert got.tried == ("simulated:test",) and got.body == '{"error":"Failed to generate fake response","response":""}'
    assert store.add(fail(key, text="API not working error..."), "c") is False  # the first failure stays
    assert store.get(NS, key).answer["error"] == "Failed to generate fake response"  # type: ignore[union-attr]
    answer = rec(key, "usable")
    answer = Record(answer.api, answer.key, answer.body, answer.source, answer.origin, replaced=got.provenance())
    assert store.add(answer, "c") is True
    now = store.get(NS, key)
    assert now is not None and not now.is_failure and now.answer["response"] == "usable"
    assert now.replaced is not None and now.replaced["reason"] == "simulator output not parsable"
    assert now.replaced["body"] == got.body
    assert store.get_canonical(NS, "c") == now
    # an answer is never replaced, by a failure or by another answer
    assert store.add(fail(key), "c") is False and store.add(rec(key, "second"), "c") is False
    assert store.get(NS, key) == now
    assert len(store) == 1 and [r.key for r in store] == [key]
    counts = store.counts()  # kept on every write: the failure's counts moved to the answer
    assert counts is not None and counts.entries == 1 and counts.by_source == {"simulated": 1}
    assert counts.by_origin == {"simulated:test": 1} and counts.by_outcome == {"replaced": 1}


def test_a_canonical_pointer_moves_from_a_failure_to_an_answer_of_another_key(store: Store) -> None:
    """{'a': 1, 'b': 2} failed first; {'b': 2, 'a': 1} (same canonical key) got an answer."""
    assert store.add(fail("{'a': 1, 'b': 2}"), "ab") is True
    assert store.get_canonical(NS, "ab").is_failure  # type: ignore[union-attr]
    assert store.add(rec("{'b': 2, 'a': 1}", "ba answer"), "ab") is True
    assert store.get_canonical(NS, "ab").answer["response"] == "ba answer"  # type: ignore[union-attr]
    # the failure's own exact key still holds it (what that exact call was served)
    assert store.get(NS, "{'a': 1, 'b': 2}").is_failure  # type: ignore[union-attr]
    # a later failure of a third spelling does not move the pointer back
    assert store.add(fail("{'b': 2, 'a': 1, }"), "ab") is True
    assert store.get_canonical(NS, "ab").answer["response"] == "ba answer"  # type: ignore[union-attr]
    # nor does a second answer: the first answer keeps the canonical key
    assert store.add(rec("{ 'a': 1, 'b': 2 }", "third"), "ab") is True
    assert store.get_canonical(NS, "ab").answer["response"] == "ba answer"  # type: ignore[union-attr]


def test_another_instance_sees_a_replaced_failure(spec: dict[str, Any]) -> None:
    """A failure read by one process (or host) is not remembered: its replacement is seen at once."""
    a, b = open_store(spec), open_store(spec)
    try:
        a.add(fail("{'x': 1}"), "cx")
        assert b.get(NS, "{'x': 1}").is_failure and b.get_canonical(NS, "cx").is_failure  # type: ignore[union-attr]
        a.add(rec("{'x': 1}", "fixed"), "cx")
        assert b.get(NS, "{'x': 1}").answer["response"] == "fixed"  # type: ignore[union-attr]
        assert b.get_canonical(NS, "cx").answer["response"] == "fixed"  # type: ignore[union-attr]
    finally:
        a.close()
        b.close()


def test_old_answer_records_read_the_same_and_failure_json_is_inspectable(store: Store, spec: dict[str, Any]) -> None:
    answer = rec("{'q': 1}", "plain")
    assert "outcome" not in answer.to_json() and "replaced" not in answer.to_json()  # answers' JSON unchanged
    assert Record.from_json(answer.to_json()) == answer
    failure = fail("{'q': 2}")
    data = json.loads(failure.to_json())
    assert data["outcome"] == "failure" and data["reason"] and data["tried"] == ["simulated:test"]
    assert Record.from_json(failure.to_json()) == failure


def _second(spec: dict[str, Any]) -> dict[str, Any]:
    """Another fresh store of the same backend."""
    return {**spec, "path": spec.get("path", "store") + "-2", "prefix": spec.get("prefix", "stm") + "-2"}


@pytest.mark.parametrize("batch", ["plain", "conflicting"])
def test_a_batch_with_failures_ends_as_adding_one_at_a_time(batch: str, spec: dict[str, Any]) -> None:
    """``add_many`` (cache import) gives what ``add`` one at a time gives, failure records included."""
    if batch == "plain":  # failures and answers of distinct keys and canonical keys (the bulk path)
        items = [(fail(f"{{'f': {i}}}"), f"f{i}") if i % 3 == 0 else (rec(f"{{'r': {i}}}", str(i)), f"r{i}") for i in range(300)]
    else:  # the same key or canonical key twice in one batch: the answer wins, as one at a time
        items = [
            (fail("{'k': 3}"), "c3"), (rec("{'k': 3}", "three"), "c3"),
            (fail("{'a': 1, 'b': 2}"), "ab"), (rec("{'b': 2, 'a': 1}", "ba"), "ab"),
            (rec("{'k': 5}", "five"), "c5"), (fail("{'k': 5}"), "c5"),
            (fail("{'k': 6}"), "c6"), (fail("{'k': 6, }"), "c6"),
        ] + [(rec(f"{{'r': {i}}}", str(i)), f"r{i}") for i in range(20)]
    one, many = open_store(spec), open_store(_second(spec))
    try:
        assert many.add_many(items) == [one.add(record, canonical) for record, canonical in items]
        for record, canonical in items:
            assert many.get(NS, record.key) == one.get(NS, record.key)
            assert many.get_canonical(NS, canonical) == one.get_canonical(NS, canonical)
        counted = [s.counts() for s in (one, many)]
        assert counted[0] is not None and counted[1] is not None
        for field in ("entries", "apis", "by_source", "by_category", "by_origin", "by_outcome"):
            assert getattr(counted[0], field) == getattr(counted[1], field), field
        assert counted[1].by_outcome.get("failure", 0) == sum(r.is_failure for r in many)
    finally:
        one.close()
        many.close()


# -- delete and replace (cache delete, mode: refresh) -------------------------------------------

OTHER = "Other/t_for_Other/b"


def _scanned_counts(store: Store) -> dict[str, Any]:
    """What a full scan counts (the counters must say the same)."""
    from stabletoolbench_mirror.snapshots.tree_export import Tally

    tally = Tally()
    for record in store:
        tally.add(record)
    return tally.to_json()


def _counted(store: Store) -> dict[str, Any]:
    counts = store.counts()
    assert counts is not None
    return {"entries": counts.entries, "apis": counts.apis, "by_source": counts.by_source, "by_category": counts.by_category,
            "failure_records": counts.by_outcome.get("failure", 0), "replaced_failures": counts.by_outcome.get("replaced", 0)}


def _agree(store: Store) -> None:
    scanned, counted = _scanned_counts(store), _counted(store)
    for name in ("entries", "apis", "by_source", "by_category", "failure_records", "replaced_failures"):
        assert counted[name] == scanned[name], name


def test_delete_removes_exactly_the_keys_named_with_their_pointers_and_counts(store: Store) -> None:
    for i in range(5):
        store.add(rec(f"{{'i': {i}}}", f"r{i}"), f"c{i}")
    store.add(fail("{'f': 1}"), "cf")
    store.add(rec("{'i': 0}", "other api", ns=OTHER), "c0")
    store.add(rec("{'imp': 1}", "imported", ns=OTHER, source="imported"), "ci")
    _agree(store)
    assert store.delete(NS, ["{'i': 1}", "{'f': 1}", "{'absent': 0}"]) == 2
    assert store.get(NS, "{'i': 1}") is None and store.get_canonical(NS, "c1") is None
    assert store.get(NS, "{'f': 1}") is None and store.get_canonical(NS, "cf") is None
    assert store.get(NS, "{'i': 2}").answer["response"] == "r2"  # type: ignore[union-attr]
    assert store.get(OTHER, "{'i': 0}").answer["response"] == "other api"  # type: ignore[union-attr]
    assert len(store) == 6 and _counted(store)["entries"] == 6 and _counted(store)["failure_records"] == 0
    _agree(store)
    # the last records of an API: it is no longer counted, and a new record brings it back
    assert store.delete(OTHER, ["{'i': 0}", "{'imp': 1}"]) == 2
    assert _counted(store)["apis"] == 1 and store.get_canonical(OTHER, "c0") is None
    _agree(store)
    assert store.add(rec("{'i': 0}", "again", ns=OTHER), "c0") is True
    assert _counted(store)["apis"] == 2 and store.get_canonical(OTHER, "c0").answer["response"] == "again"  # type: ignore[union-attr]
    _agree(store)
    assert store.delete(NS, []) == 0 and store.delete("No/such_for_No/api", ["{}"]) == 0


def _changes(store: DiskcacheStore) -> int:
    """The store's counter of ``delete`` and ``replace`` calls (``g\\x00changes``), as any reader of its folder reads it."""
    reader = layout.ReadOnlyCache(store.path)
    try:
        return int(reader.get(CHANGES) or 0)  # type: ignore[call-overload]
    finally:
        reader.close()


def test_replace_writes_over_an_answer_keeping_counts_right(store: Store) -> None:
    store.add(rec("{'a': 1}", "old"), "ca")
    old = store.get(NS, "{'a': 1}")
    assert old is not None
    new = rec("{'a': 1}", "new", source="real")
    new = Record(new.api, new.key, new.body, new.source, "real-endpoint", replaced=old.provenance())
    before = _changes(store) if isinstance(store, DiskcacheStore) else None
    assert store.replace(new, "ca") is True
    if before is not None:  # diskcache: the counter of changes an in-process copy of records would watch
        assert _changes(store) == before + 1  # type: ignore[arg-type]
    got = store.get(NS, "{'a': 1}")
    assert got is not None and got.answer["response"] == "new" and got.replaced is not None and got.replaced["body"] == old.body
    assert store.get_canonical(NS, "ca") == got
    assert _counted(store)["by_source"] == {"real": 1} and _counted(store)["replaced_failures"] == 1
    _agree(store)
    # a key not there yet: replace adds it
    assert store.replace(rec("{'b': 1}", "fresh"), "cb") is True and len(store) == 2
    _agree(store)


def test_another_instance_stops_serving_a_deleted_or_replaced_record_at_once(spec: dict[str, Any]) -> None:
    """Redis instances remember what they read: a delete or replace elsewhere must reach that memory."""
    a, b = open_store(spec), open_store(spec)
    try:
        a.add(rec("{'x': 1}", "kept"), "cx")
        a.add(rec("{'y': 1}", "replaced"), "cy")
        for _ in range(2):  # read twice: the second read is served from b's memory on Redis
            assert b.get(NS, "{'x': 1}") is not None and b.get_canonical(NS, "cy") is not None
        assert a.delete(NS, ["{'x': 1}"]) == 1
        a.replace(rec("{'y': 1}", "refreshed"), "cy")
        # "at once": within the invalidation's travel time; the deadline is generous for a busy machine
        deadline = time.monotonic() + 10.0
        while not (b.get(NS, "{'x': 1}") is None and b.get(NS, "{'y': 1}").answer["response"] == "refreshed"):  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "b still serves the deleted or replaced record after 10 s"
            time.sleep(0.005)
        assert b.get(NS, "{'x': 1}") is None and b.get_canonical(NS, "cx") is None
        assert b.get(NS, "{'y': 1}").answer["response"] == "refreshed"  # type: ignore[union-attr]
        assert b.get_canonical(NS, "cy").answer["response"] == "refreshed"  # type: ignore[union-attr]
    finally:
        a.close()
        b.close()
