"""The miss path's cuts (issue 24, third round) keep every answer, record and counter as it was.

* a miss answered by the server reads the cache once before its single flight (the event loop's
  lookup goes along to the worker), and once inside it; a failure record found there is still
  tried again and marked ``retried``;
* one ``add`` at a time and one batch of the same records write the same rows and counters;
* the counters are incremented as diskcache's ``incr`` increments them (zero deltas, missing
  counters, a counter that is no integer, one that expires).

What a write costs (its SQL statements, its time at 1,000 and at 165,000 entries) is measured by
``benchmarks/store_writes.py`` (run by ``benchmarks/scale.py``), no longer asserted here.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections import Counter
from dataclasses import replace
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


def test_one_add_at_a_time_and_one_batch_write_the_same_rows(tmp_path: Path) -> None:
    # one add takes the batch path for a batch of one (its rows inserted at once when nothing is there);
    # the batch of all, whose keys meet, goes one by one inside its transaction
    single, batch = DiskcacheStore(tmp_path / "single"), DiskcacheStore(tmp_path / "batch")
    records = _records()
    added = [single.add(r, c) for r, c in records]
    assert added == batch.add_many(records) == [True, False, True, True, True, True]
    assert _rows(tmp_path / "single") == _rows(tmp_path / "batch")
    single_counts, batch_counts = single.counts(), batch.counts()
    assert single_counts is not None and batch_counts is not None
    assert replace(single_counts, disk_bytes=0) == replace(batch_counts, disk_bytes=0)  # one commit leaves less log


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
    # it still expires, as diskcache itself says
    assert new.get("expiring", expire_time=True)[1] is not None and old.get("expiring", expire_time=True)[1] is not None
    with pytest.raises(TypeError), new.transact():  # not a count: incr's own error
        layout.increment(new, Counter({"text": 1}))
    assert new.get("text") == "x"


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
    figures = json.loads(done.stdout)
    assert set(figures) == {"known_api", "new_api", "failure", "statements_known_api", "statements_new_api", "statements_failure"}
    assert all(1 <= figures[f"statements_{kind}"] <= 40 for kind in ("known_api", "new_api", "failure"))
    counts = DiskcacheStore(tmp_path / "store").counts()
    assert counts is not None and (counts.entries, counts.apis) == (1 + 12, 1 + 4)
    empty = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert empty.returncode != 0 and "no cache.db" in empty.stderr
