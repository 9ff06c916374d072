"""The store's rules as pure decisions: what an add, a replace or a delete does given what is there."""

from __future__ import annotations

from collections import Counter

import pytest

from stabletoolbench_mirror.core.records import Record
from stabletoolbench_mirror.stores import rules
from stabletoolbench_mirror.stores.rules import Holding

API = "Cat/t_for_Cat/a"


def ans(key: str = "k", text: str = "a", source: str = "simulated", origin: str = "m", api: str = API) -> Record:
    return Record.from_answer(api, key, {"error": "", "response": text}, source, origin)  # type: ignore[arg-type]


def fail(key: str = "k", text: str = "f") -> Record:
    return Record.failure(API, key, {"error": "Failed to generate fake response", "response": text}, "simulated", "m", reason="x")


# (name, record, canonical, holding) -> (write, point, replaced is the held record)
ADD_CASES = [
    ("nothing there", ans(), "c", Holding(None), (True, True, False)),
    ("nothing there, no canonical", ans(), None, Holding(None), (True, False, False)),
    ("an answer there", ans(text="b"), "c", Holding(ans(), "k", False), (False, False, False)),
    ("a failure there, an answer comes", ans(), "c", Holding(fail(), "k", True), (True, False, True)),
    ("a failure there, a failure comes", fail(text="g"), "c", Holding(fail(), "k", True), (False, False, False)),
    ("an answer there, a failure comes", fail(), "c", Holding(ans(), "k", False), (False, False, False)),
    ("pointer names an answer of another key", ans("k2"), "c", Holding(None, "k1", False), (True, False, False)),
    ("pointer names a failure of another key", ans("k2"), "c", Holding(None, "k1", True), (True, True, False)),
    ("pointer names a failure, a failure comes", fail("k2"), "c", Holding(None, "k1", True), (True, False, False)),
    ("pointer names an answer, a failure comes", fail("k2"), "c", Holding(None, "k1", False), (True, False, False)),
    ("pointer names this key", ans(), "c", Holding(None, "k", True), (True, False, False)),
    ("pointer missing, key holds an answer", ans(text="b"), "c", Holding(ans(), None), (False, True, False)),
]


@pytest.mark.parametrize(("name", "record", "canonical", "held", "expected"), ADD_CASES, ids=[c[0] for c in ADD_CASES])
def test_add(name: str, record: Record, canonical: str | None, held: Holding, expected: tuple[bool, bool, bool]) -> None:
    plan = rules.add(record, canonical, held)
    assert (plan.write, plan.point, plan.replaced is held.current and held.current is not None) == expected
    assert plan.changes == (plan.write or plan.point)
    if not plan.write:
        assert not +plan.counts  # nothing written: nothing counted


def test_a_new_key_counts_the_entry_its_category_source_origin_and_outcome() -> None:
    assert +rules.add(ans(source="imported", origin="tree/Cat/t/a.json"), None, Holding(None)).counts == Counter({
        ("entries",): 1, ("category", "Cat"): 1, ("source", "imported"): 1, ("origin", "imported:tree"): 1})
    assert +rules.add(fail(), None, Holding(None)).counts == Counter({
        ("entries",): 1, ("category", "Cat"): 1, ("source", "simulated"): 1, ("origin", "simulated:m"): 1, ("outcome", "failure"): 1})


def test_an_answer_replacing_a_failure_moves_its_counts() -> None:
    plan = rules.add(ans(source="real", origin="relay"), None, Holding(fail()))
    assert {k: v for k, v in plan.counts.items() if v} == {
        ("source", "simulated"): -1, ("origin", "simulated:m"): -1, ("outcome", "failure"): -1, ("outcome", "replaced"): 1,
        ("source", "real"): 1, ("origin", "real:relay"): 1}


REPLACE_CASES = [
    ("nothing there: an add", ans(), "c", Holding(None), (True, True)),
    ("an answer there", ans(text="b"), "c", Holding(ans(), "k", False), (True, False)),
    ("pointer names a failure of another key", ans(text="b"), "c", Holding(ans(), "k1", True), (True, True)),
    ("pointer names an answer of another key", ans(text="b"), "c", Holding(ans(), "k1", False), (True, False)),
    ("no pointer yet", ans(text="b"), "c", Holding(ans(), None), (True, True)),
    ("no canonical", ans(text="b"), None, Holding(ans()), (True, False)),
]


@pytest.mark.parametrize(("name", "record", "canonical", "held", "expected"), REPLACE_CASES, ids=[c[0] for c in REPLACE_CASES])
def test_replace(name: str, record: Record, canonical: str | None, held: Holding, expected: tuple[bool, bool]) -> None:
    plan = rules.replace(record, canonical, held)
    assert (plan.write, plan.point) == expected
    assert plan.replaced is held.current


def test_replace_moves_the_counts_from_the_old_record_to_the_new() -> None:
    old = ans(origin="old")
    plan = rules.replace(ans(origin="new"), None, Holding(old))
    assert {k: v for k, v in plan.counts.items() if v} == {("origin", "simulated:old"): -1, ("origin", "simulated:new"): 1}


def test_delete_takes_away_each_records_counts() -> None:
    counts = rules.delete([ans("k1"), fail("k2")])
    assert {k: v for k, v in counts.items() if v} == {
        ("entries",): -2, ("category", "Cat"): -2, ("source", "simulated"): -2, ("origin", "simulated:m"): -2, ("outcome", "failure"): -1}


@pytest.mark.parametrize(("target", "record", "needed"), [
    (None, ans(), False), ("k", ans(), False), ("k1", ans(), True), ("k1", fail(), True)])
def test_a_target_record_is_read_only_when_the_decision_needs_it(target: str | None, record: Record, needed: bool) -> None:
    assert rules.needs_target_record(record, "c", target) is needed
    assert rules.needs_target_record(record, None, target) is False


BATCHES = [
    ("two answers of one key: the first", [(ans(text="1"), "c"), (ans(text="2"), "c")], [(True, True), (False, False)]),
    ("a failure then an answer of one key", [(fail(), "c"), (ans(), "c")], [(True, True), (True, False)]),
    ("an answer then a failure of one key", [(ans(), "c"), (fail(), "c")], [(True, True), (False, False)]),
    ("one canonical, two answers", [(ans("k1"), "c"), (ans("k2"), "c")], [(True, True), (True, False)]),
    ("one canonical, a failure then an answer", [(fail("k1"), "c"), (ans("k2"), "c")], [(True, True), (True, True)]),
    ("one canonical, an answer then a failure", [(ans("k1"), "c"), (fail("k2"), "c")], [(True, True), (True, False)]),
    ("one key and canonical in two APIs: two records", [(ans(), "c"), (ans(api="Cat/t_for_Cat/b"), "c")], [(True, True), (True, True)]),
    ("a failure replaced, then its canonical taken by another key",
     [(fail("k1"), "c"), (ans("k1"), "c"), (ans("k2"), "c")], [(True, True), (True, False), (True, False)]),
]


@pytest.mark.parametrize(("name", "items", "expected"), BATCHES, ids=[b[0] for b in BATCHES])
def test_a_batch_decides_as_adding_one_at_a_time(name: str, items: list, expected: list[tuple[bool, bool]]) -> None:
    plans = rules.batch_adds(items, [Holding(None)] * len(items))
    assert [(p.write, p.point) for p in plans] == expected


def test_a_batch_sees_what_the_store_held_before_it() -> None:
    items = [(ans("k1"), "c"), (ans("k2"), "d")]
    held = [Holding(fail("k1"), "k0", False), Holding(None, "k9", True)]
    plans = rules.batch_adds(items, held)
    assert [(p.write, p.point, p.replaced is not None) for p in plans] == [(True, False, True), (True, True, False)]
    with pytest.raises(ValueError):
        rules.batch_adds(items, held[:1])


class _OneAtATime:
    """A store as the rules describe it, one add at a time: records by (api, key), pointers by (api, canonical)."""

    def __init__(self) -> None:
        self.records: dict[tuple[str, str], Record] = {}
        self.pointers: dict[tuple[str, str], str] = {}

    def holding(self, record: Record, canonical: str | None) -> Holding:
        target = self.pointers.get((record.api, canonical)) if canonical is not None else None
        pointed = self.records.get((record.api, target)) if target is not None else None
        return Holding(self.records.get((record.api, record.key)), target, target is not None and (pointed is None or pointed.is_failure))

    def add(self, record: Record, canonical: str | None) -> rules.Plan:
        plan = rules.add(record, canonical, self.holding(record, canonical))
        if plan.write:
            self.records[record.api, record.key] = record
        if plan.point and canonical is not None:
            self.pointers[record.api, canonical] = record.key
        return plan


@pytest.mark.parametrize("seed", range(8))
def test_a_random_batch_writes_points_and_counts_as_its_adds_one_at_a_time(seed: int) -> None:
    import random

    rng = random.Random(seed)
    items: list[tuple[Record, str | None]] = []
    for n in range(12):
        key, api = rng.choice(["k1", "k2", "k3"]), rng.choice([API, "Cat/t_for_Cat/b"])
        record = fail(key, f"f{n}") if rng.random() < 0.4 else ans(key, f"a{n}", api=api)
        items.append((replace_api(record, api), rng.choice(["c1", "c2", None])))
    one = _OneAtATime()
    sequential = [one.add(record, canonical) for record, canonical in items]
    batch = rules.batch_adds(items, [Holding(None)] * len(items))
    assert [(p.write, p.point) for p in batch] == [(p.write, p.point) for p in sequential]
    total_batch: Counter = Counter()
    total_one: Counter = Counter()
    for b, s in zip(batch, sequential):
        total_batch.update(b.counts)
        total_one.update(s.counts)
    assert +total_batch == +total_one and -total_batch == -total_one


def replace_api(record: Record, api: str) -> Record:
    from dataclasses import replace as copy

    return copy(record, api=api)


def test_a_batch_after_the_store_held_an_answer_writes_nothing_for_that_key() -> None:
    plans = rules.batch_adds([(ans(text="new"), "c"), (fail(), "c")], [Holding(ans(text="old"), "k", False)] * 2)
    assert [(p.write, p.point, +p.counts) for p in plans] == [(False, False, Counter()), (False, False, Counter())]


def test_an_empty_batch_plans_nothing() -> None:
    assert rules.batch_adds([], []) == []
