"""The miss path's cuts (issue 24, third round) keep every answer, record and counter as it was.

* a miss answered by the server reads the cache once before its single flight (the event loop's
  lookup goes along to the worker), and once inside it; a failure record found there is still
  tried again and marked ``retried``;
* one ``add`` to the diskcache store takes the bulk path (a few statements) and writes the
  same rows as the one-by-one path did;
* the counters are incremented as diskcache's ``incr`` increments them (zero deltas, missing
  counters, a counter that is no integer, one that expires);
* a write costs the same in a large store as in a small one (the counters' lookup uses the key
  index: it used to read every row once it had five counters to update).
"""

from __future__ import annotations

import asyncio
import itertools
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

import diskcache
import pytest

from stabletoolbench_mirror.core.call import ToolCall
from stabletoolbench_mirror.core.outcomes import OutcomeKind
from stabletoolbench_mirror.core.records import Record
from stabletoolbench_mirror.engine.layer import Looked, MirrorLayer
from stabletoolbench_mirror.stores import diskcache_layout as layout
from stabletoolbench_mirror.stores.diskcache_store import DiskcacheStore
from tests.helpers.responders import KeyedResponder, expected_answer


class CountingStore(DiskcacheStore):
    """The real diskcache store, counting its reads by key."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.reads: list[str] = []

    def get(self, api: str, key: str) -> Record | None:
        self.reads.append("get")
        return super().get(api, key)

    def get_canonical(self, api: str, canonical: str) -> Record | None:
        self.reads.append("get_canonical")
        return super().get_canonical(api, canonical)


def _call(i: int) -> ToolCall:
    return ToolCall.of("Tools", "t", "a", {"i": i})


def _server_path(layer: MirrorLayer, call: ToolCall):
    """What the server does for a plain ``/virtual`` call: the loop's probe, then the worker's answer."""
    found = asyncio.run(layer.probe_async(call))
    return found, (found if not isinstance(found, Looked) else layer.answer(call, {}, found))


def test_a_miss_reads_the_cache_once_before_its_single_flight(tmp_path: Path) -> None:
    store = CountingStore(tmp_path / "store")
    responder = KeyedResponder()
    layer = MirrorLayer(store, responders=[responder])
    call = _call(1)
    found, outcome = _server_path(layer, call)
    assert found == Looked(None)
    assert outcome.kind is OutcomeKind.RECORDED and responder.calls == 1
    # the probe (record key, canonical key), then the re-lookup inside the single flight: nothing more
    assert store.reads == ["get", "get_canonical", "get", "get_canonical"]
    assert Record.from_json(store.get(call.api, call.key).to_json()).body == outcome.body  # type: ignore[union-attr]
    # the same answer as the full path gives (which reads the cache itself)
    again = MirrorLayer(DiskcacheStore(tmp_path / "other"), responders=[KeyedResponder()]).handle_call(call)
    assert (again.body, again.kind, again.source, again.origin) == (outcome.body, outcome.kind, outcome.source, outcome.origin)
    assert outcome.body == layer.handle_call(call).body  # now a hit, the same bytes


def test_a_failure_record_found_by_the_probe_is_tried_again_and_marked_retried(tmp_path: Path) -> None:
    store = CountingStore(tmp_path / "store")
    call = _call(2)
    store.add(Record.failure(call.api, call.key, {"error": "down", "response": ""}, "simulated", "m",
                             reason="test", tried=("simulated:m",)), call.canonical)
    responder = KeyedResponder()
    layer = MirrorLayer(store, responders=[responder])
    found, outcome = _server_path(layer, call)
    assert isinstance(found, Looked) and found.record is not None and found.record.is_failure
    assert outcome.kind is OutcomeKind.REPLACED and outcome.retried and responder.calls == 1
    stored = store.get(call.api, call.key)
    assert stored is not None and not stored.is_failure and stored.replaced is not None
    assert stored.answer == expected_answer(call.api, call.key)


def _rows(path: Path) -> dict[str, tuple[Any, ...]]:
    """Every row of a store's table but its times: key -> (mode, filename, value)."""
    con = sqlite3.connect(path / "cache.db")
    try:
        return {key: (mode, value) for key, mode, value in con.execute("SELECT key, mode, value FROM Cache")}
    finally:
        con.close()


def _old_add(store: DiskcacheStore, record: Record, canonical: str | None) -> bool:
    """The one-by-one path ``add`` took before (every step through diskcache's own calls)."""
    with store._write_lock, store._transaction():  # noqa: SLF001
        store._see_deletes()  # noqa: SLF001
        deltas: Counter[str] = Counter()
        added = store._add_in_transaction(record, canonical, deltas)  # noqa: SLF001
        for key, delta in deltas.items():
            store._cache.incr(key, delta)  # noqa: SLF001
    store._remember_apis((record,))  # noqa: SLF001
    return added


def _records() -> list[tuple[Record, str | None]]:
    api, other = "Tools/t_for_Tools/a", "Maps/m_for_Maps/b"
    failure = Record.failure(api, "k2", {"error": "e", "response": ""}, "simulated", "m", reason="r", tried=("simulated:m",))
    return [
        (Record.from_answer(api, "k1", {"error": "", "response": 1}, "simulated", "m"), "c1"),
        (Record.from_answer(api, "k1", {"error": "", "response": "again"}, "simulated", "m"), "c1"),  # present: not added
        (failure, "c2"),
        (Record.from_answer(api, "k2", {"error": "", "response": "fixed"}, "real", "rapidapi"), "c2"),  # replaces the failure
        (Record.from_answer(api, "k3", {"error": "", "response": 3}, "simulated", "m"), "c2"),  # canonical taken
        (Record.from_answer(other, "k4", {"error": "", "response": 4}, "local", "tool"), None),
    ]


def test_one_add_writes_the_rows_the_one_by_one_path_wrote(tmp_path: Path) -> None:
    new, old = DiskcacheStore(tmp_path / "new"), DiskcacheStore(tmp_path / "old")
    results = [(new.add(r, c), _old_add(old, r, c)) for r, c in _records()]
    assert [a for a, _ in results] == [b for _, b in results] == [True, False, True, True, True, True]
    assert _rows(tmp_path / "new") == _rows(tmp_path / "old")
    assert new.counts() == old.counts()


def test_a_new_record_is_written_in_a_few_statements(tmp_path: Path) -> None:
    store = DiskcacheStore(tmp_path / "store")
    store.add(Record.from_answer("Tools/t_for_Tools/a", "k0", {"error": "", "response": 0}, "simulated", "m"), "c0")
    statements: list[str] = []
    store._cache._con.set_trace_callback(statements.append)  # noqa: SLF001
    store.add(Record.from_answer("Tools/t_for_Tools/a", "k1", {"error": "", "response": 1}, "simulated", "m"), "c1")
    store._cache._con.set_trace_callback(None)  # noqa: SLF001
    # SQLite's trace repeats a statement for each of its trigger steps: a run of one text is one
    # statement (one row).  BEGIN, the deletes counter, one read of the keys, the insert (2 rows),
    # one read of the counters, their updates (4 rows), COMMIT: 11; the one-by-one path took 17
    runs = [text for text, _ in itertools.groupby(statements)]
    assert len(runs) <= 11, runs


def test_counters_are_incremented_as_diskcache_increments_them(tmp_path: Path) -> None:
    new, old = diskcache.Cache(str(tmp_path / "new")), diskcache.Cache(str(tmp_path / "old"))
    for cache in (new, old):
        cache.set("a", 5)
        cache.set("zero", 7)
        cache.set("text", "x")
        cache.set("expiring", 4, expire=3600)
    deltas = Counter({"a": 2, "zero": 0, "missing": 3, "missing-zero": 0, "expiring": 1})
    with new.transact():
        layout.increment(new, deltas)
    with old.transact():
        for key, delta in deltas.items():
            old.incr(key, delta)
    assert {k: new.get(k) for k in new} == {k: old.get(k) for k in old} == {
        "a": 7, "zero": 7, "text": "x", "missing": 3, "missing-zero": 0, "expiring": 5}
    row = "SELECT expire_time FROM Cache WHERE key = 'expiring'"
    assert new._sql(row).fetchone()[0] is not None and old._sql(row).fetchone()[0] is not None  # noqa: SLF001 - it still expires
    with pytest.raises(TypeError), new.transact():  # not a count: incr's own error
        layout.increment(new, Counter({"text": 1}))
    assert new.get("text") == "x"


def _vm_steps(store: DiskcacheStore, record: Record) -> int:
    """SQLite virtual-machine steps (in thousands) that adding ``record`` takes."""
    steps = [0]

    def step() -> int:
        steps[0] += 1
        return 0

    store._cache._con.set_progress_handler(step, 1000)  # noqa: SLF001
    try:
        assert store.add(record, "canonical")
    finally:
        store._cache._con.set_progress_handler(None, 0)  # noqa: SLF001
    return steps[0]


@pytest.mark.parametrize("failure", [False, True], ids=["answer", "failure"])
def test_a_write_costs_the_same_in_a_large_store(tmp_path: Path, failure: bool) -> None:
    """A record of a new API (or a failure record) updates five counters or more; at 1,000 entries
    and at 30,000 the write takes about the same work (it read every row of the table before)."""
    costs = []
    for size in (1_000, 30_000):
        store = DiskcacheStore(tmp_path / str(size))
        api = "Tools/t_for_Tools/a"
        for start in range(0, size, 5_000):
            store.add_many((Record.from_answer(api, f"k{i}", {"error": "", "response": i}, "simulated", "m"), f"c{i}")
                           for i in range(start, min(size, start + 5_000)))
        new_api = "Maps/m_for_Maps/b"
        record = (Record.failure(new_api, "k", {"error": "e", "response": ""}, "simulated", "m", reason="r", tried=("simulated:m",))
                  if failure else Record.from_answer(new_api, "k", {"error": "", "response": 0}, "real", "rapidapi"))
        costs.append(_vm_steps(store, record))
        counts = store.counts()
        assert counts is not None and (counts.entries, counts.apis) == (size + 1, 2)
        store.close()
    small, large = costs
    assert large <= 2 * small + 5, costs


def test_the_store_writes_benchmark_times_each_kind_and_refuses_a_folder_without_a_store(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "store_writes.py"
    store = DiskcacheStore(tmp_path / "store")
    store.add(Record.from_answer("Tools/t_for_Tools/a", "k", {"error": "", "response": 1}, "simulated", "m"), None)
    store.close()
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "store"), "--n", "3"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert set(json.loads(done.stdout)) == {"known_api", "new_api", "failure"}
    counts = DiskcacheStore(tmp_path / "store").counts()
    assert counts is not None and (counts.entries, counts.apis) == (1 + 9, 1 + 3)
    empty = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert empty.returncode != 0 and "no cache.db" in empty.stderr
