"""What a store's writes decide, written once: each backend reads, asks these rules, and applies.

requests-cache splits its rules (``BaseCache``) from its storage (``BaseStorage``); so does this
package.  A backend reads what the store holds for a record's key and canonical key (a
:class:`Holding`), asks :func:`add`, :func:`replace` or :func:`delete` what to do (a
:class:`Plan`), and applies the plan atomically: diskcache in one SQLite transaction, Redis in one
compare-and-apply script that applies it only while what was read is still there (else the
backend reads again and asks again).  Nothing here does I/O.

The rules:

* **add** is add-if-absent, except that a usable answer replaces a failure record (the failure's
  provenance is the caller's to keep in ``replaced``; its counts move to the answer);
* **replace** (``mode: refresh``) writes over whatever the key holds; the counts move;
* **the canonical pointer** names the first record written for the canonical key, and moves to a
  usable answer of another key while it names a failure record (or nothing); a failure never
  takes it from an answer;
* **delete** removes the named keys' records with their counts and every pointer naming them.

Counters are :data:`Counts`: ``("entries",)``, ``("category", c)``, ``("source", s)``,
``("origin", source:origin)``, ``("outcome", "failure" | "replaced")``, each backend spelling the
names its own way.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from stabletoolbench_mirror.core.naming import category_of
from stabletoolbench_mirror.core.records import Record, origin_key

Counts = Counter[tuple[str, ...]]


def provenance_counts(record: Record, sign: int = 1) -> Counts:
    """What a record adds to the counters by source, origin and outcome (``sign`` -1: takes away)."""
    counts: Counts = Counter()
    counts["source", record.source] += sign
    counts["origin", origin_key(record)] += sign
    if record.is_failure:
        counts["outcome", "failure"] += sign
    return counts


def record_counts(record: Record, sign: int = 1) -> Counts:
    """:func:`provenance_counts`, and an answer that replaced a record (kept in ``replaced``)."""
    counts = provenance_counts(record, sign)
    if record.replaced is not None:
        counts["outcome", "replaced"] += sign
    return counts


@dataclass(frozen=True)
class Holding:
    """What the store holds for one record's key and, when it has one, its canonical key."""

    current: Record | None
    """The record under the record's own key."""
    target: str | None = None
    """The key the canonical pointer names (``None``: no pointer yet, or no canonical key)."""
    target_is_failure: bool = True
    """Whether the record ``target`` names is a failure record or missing (read only when it is another key)."""


@dataclass(frozen=True)
class Plan:
    """What one write does; ``write`` false and ``point`` false: nothing at all."""

    write: bool
    """Write the record under its key."""
    point: bool
    """Make the canonical pointer name the record's key."""
    counts: Counts = field(default_factory=Counter)
    """Counter changes (the API set aside: whether the API is new is storage's to know)."""
    replaced: Record | None = None
    """The record written over (add: a failure; replace: whatever was there)."""

    @property
    def changes(self) -> bool:
        return self.write or self.point


def _moves_pointer(record: Record, canonical: str | None, held: Holding) -> bool:
    if canonical is None:
        return False
    if held.target is None:
        return True
    # a failure never takes the pointer; an answer takes it from a failure (or a record gone) of another key
    return held.target != record.key and not record.is_failure and held.target_is_failure


def needs_target_record(record: Record, canonical: str | None, target: str | None) -> bool:
    """Whether :func:`add` or :func:`replace` needs to know if ``target``'s record is a failure (a backend reads it only then)."""
    return canonical is not None and target is not None and target != record.key


def add(record: Record, canonical: str | None, held: Holding) -> Plan:
    """Add-if-absent; a usable answer replaces a failure record; the pointer as the module says."""
    current = held.current
    replaces_failure = current is not None and current.is_failure and not record.is_failure
    write = current is None or replaces_failure
    counts: Counts = Counter()
    if write:
        if replaces_failure:
            assert current is not None
            counts.update(provenance_counts(current, -1))
            counts["outcome", "replaced"] += 1
            counts.update(provenance_counts(record))
        else:  # a key that held nothing (the API's own count aside)
            counts.update(provenance_counts(record))
            counts["entries",] += 1
            counts["category", category_of(record.api)] += 1
    return Plan(write=write, point=_moves_pointer(record, canonical, held), counts=counts,
                replaced=current if replaces_failure else None)


def replace(record: Record, canonical: str | None, held: Holding) -> Plan:
    """Write over whatever the key holds (``mode: refresh``); the counts move from it to ``record``."""
    current = held.current
    if current is None:
        return add(record, canonical, held)
    counts = record_counts(current, -1)
    counts.update(record_counts(record))
    point = canonical is not None and (held.target is None or (held.target != record.key and held.target_is_failure))
    return Plan(write=True, point=point, counts=counts, replaced=current)


def delete(removed: Iterable[Record]) -> Counts:
    """The counter changes of removing ``removed`` (records that were there); pointers naming them go too."""
    counts: Counts = Counter()
    for record in removed:
        counts["entries",] -= 1
        counts["category", category_of(record.api)] -= 1
        counts.update(record_counts(record, -1))
    return counts


def batch_adds(items: list[tuple[Record, str | None]], held: list[Holding]) -> list[Plan]:
    """:func:`add` for each item of a batch in order, each seeing what the earlier ones wrote.

    ``held[i]``: what the store held for item ``i`` before the batch (its key's record, the key its
    canonical pointer names, and whether that key's record is a failure when :func:`needs_target_record`).
    """
    plans: list[Plan] = []
    holds: dict[tuple[str, str], Record | None] = {}
    """What each ``(api, key)`` of the batch holds so far (the store's record, or one the batch wrote)."""
    pointers: dict[tuple[str, str], str] = {}
    for (record, canonical), before in zip(items, held, strict=True):
        here = (record.api, record.key)
        current = holds[here] if here in holds else before.current
        target = pointers.get((record.api, canonical), before.target) if canonical is not None else None
        if target is not None and (record.api, target) in holds:
            pointed = holds[record.api, target]
            target_is_failure = pointed is None or pointed.is_failure
        else:
            target_is_failure = before.target_is_failure
        plan = add(record, canonical, Holding(current, target, target_is_failure))
        holds[here] = record if plan.write else current
        if plan.point and canonical is not None:
            pointers[record.api, canonical] = record.key
        plans.append(plan)
    return plans


# -- occurrence numbers (recorded model calls) --------------------------------------------------------
#
# The n-th identical model request of a run gets the n-th recorded answer.  A run's counter of one
# request is an :class:`Occurrences`: the next number never given, and the numbers given back (a
# request that got no answer: an upstream error, a replay miss), which are given again first, lowest
# first, so the judge's retry of a failed request takes the number the failure left.


@dataclass(frozen=True)
class Occurrences:
    """One request's numbers in one run."""

    next: int = 1
    """The lowest number never given."""
    free: tuple[int, ...] = ()
    """Numbers given back, ascending."""

    @property
    def at_start(self) -> bool:
        """No number given that was not given back: a counter the store need not keep (removed, not written)."""
        return self.next == 1 and not self.free

    def to_json(self) -> str:
        return f'{{"next":{self.next},"free":[{",".join(map(str, self.free))}]}}'

    @classmethod
    def from_json(cls, text: str | bytes | None) -> Occurrences:
        if not text:
            return cls()
        import json

        data = json.loads(text)
        return cls(int(data["next"]), tuple(sorted(int(n) for n in data.get("free", ()))))


#: how long a run's counters outlive its last request (a run of a benchmark takes hours, not weeks)
OCCURRENCE_TTL_S = 30 * 24 * 3600
#: numbers given back kept per request (more would mean a client that fails for ever: the lowest are kept)
MAX_FREE_OCCURRENCES = 1024


Decide = Callable[[Occurrences], tuple[int, Occurrences]]
"""A counter's decision: the number given (or given back) and the counter after it (:func:`claim_occurrence`, :func:`releasing`)."""


def claim_occurrence(held: Occurrences) -> tuple[int, Occurrences]:
    """The number the next identical request gets, and the counter after it."""
    if held.free:
        return held.free[0], Occurrences(held.next, held.free[1:])
    return held.next, Occurrences(held.next + 1, held.free)


def releasing(number: int) -> Decide:
    """The decision that gives ``number`` back (:func:`release_occurrence`)."""
    return lambda held: (number, release_occurrence(held, number))


def release_occurrence(held: Occurrences, number: int) -> Occurrences:
    """The counter after ``number`` is given back (it had no answer); a number never given changes nothing."""
    if number < 1 or number >= held.next or number in held.free:
        return held
    if number == held.next - 1 and not held.free:
        return Occurrences(number, ())
    return Occurrences(held.next, tuple(sorted((*held.free, number)))[:MAX_FREE_OCCURRENCES])
