"""The store's rules (:mod:`stabletoolbench_mirror.stores.rules`), as a table of cases run over every backend.

Each case is a few writes (``add``, ``add_many``, ``replace``, ``delete``) and what must follow: what
each returned, the record each key holds, the key each canonical key names, and the counters.
The expectations are written out here, not computed from the rules, so a change to a rule fails
every backend that applies it (diskcache in one transaction, Redis in one compare-and-apply
script).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from stabletoolbench_mirror.core.records import Record
from stabletoolbench_mirror.stores import Store
from tests.helpers.redis_server import redis_prefix, redis_server  # noqa: F401
from tests.helpers.store_fixtures import spec, store  # noqa: F401

API = "Rules/t_for_Rules/a"


def answer(key: str, text: str) -> Record:
    return Record.from_answer(API, key, {"error": "", "response": text}, "simulated", "m")


def failure(key: str, text: str) -> Record:
    return Record.failure(API, key, {"error": "Failed to generate fake response", "response": text}, "simulated", "m",
                          reason=f"failed: {text}")


@dataclass
class Case:
    writes: list[tuple[str, Any]]
    """``("add", (record, canonical))``, ``("add_many", [(record, canonical), ...])``, ``("replace", (record, canonical))``, ``("delete", [keys])``."""
    returned: list[Any]
    entries: dict[str, tuple[str, str]]
    """key -> (response text, outcome) the store holds; keys not named hold nothing."""
    pointers: dict[str, str | None] = field(default_factory=dict)
    """canonical -> the key it names (``None``: none)."""
    counts: dict[str, Any] = field(default_factory=dict)
    """``entries``, ``apis`` and the non-zero ``by_outcome`` counters."""


A, B, F, G = "answer A", "answer B", "failure F", "failure G"
CASES: dict[str, Case] = {
    "an add into nothing writes and points": Case(
        [("add", (answer("k1", A), "c"))], [True], {"k1": (A, "answer")}, {"c": "k1"}, {"entries": 1, "apis": 1}),
    "the first answer of a key wins": Case(
        [("add", (answer("k1", A), "c")), ("add", (answer("k1", B), "c"))], [True, False], {"k1": (A, "answer")}, {"c": "k1"},
        {"entries": 1}),
    "an answer replaces a failure of its key": Case(
        [("add", (failure("k1", F), "c")), ("add", (answer("k1", A), "c"))], [True, True], {"k1": (A, "answer")}, {"c": "k1"},
        {"entries": 1, "by_outcome": {"replaced": 1}}),
    "a failure never replaces an answer": Case(
        [("add", (answer("k1", A), "c")), ("add", (failure("k1", F), "c"))], [True, False], {"k1": (A, "answer")}, {"c": "k1"},
        {"entries": 1}),
    "a failure does not replace a failure": Case(
        [("add", (failure("k1", F), "c")), ("add", (failure("k1", G), "c"))], [True, False], {"k1": (F, "failure")}, {"c": "k1"},
        {"entries": 1, "by_outcome": {"failure": 1}}),
    "the pointer stays with the first answer": Case(
        [("add", (answer("k1", A), "c")), ("add", (answer("k2", B), "c"))], [True, True],
        {"k1": (A, "answer"), "k2": (B, "answer")}, {"c": "k1"}, {"entries": 2}),
    "the pointer moves from a failure to an answer of another key": Case(
        [("add", (failure("k1", F), "c")), ("add", (answer("k2", A), "c"))], [True, True],
        {"k1": (F, "failure"), "k2": (A, "answer")}, {"c": "k2"}, {"entries": 2, "by_outcome": {"failure": 1}}),
    "a failure never takes the pointer from an answer": Case(
        [("add", (answer("k1", A), "c")), ("add", (failure("k2", F), "c"))], [True, True],
        {"k1": (A, "answer"), "k2": (F, "failure")}, {"c": "k1"}, {"entries": 2, "by_outcome": {"failure": 1}}),
    "nor from a failure": Case(
        [("add", (failure("k1", F), "c")), ("add", (failure("k2", G), "c"))], [True, True],
        {"k1": (F, "failure"), "k2": (G, "failure")}, {"c": "k1"}, {"entries": 2, "by_outcome": {"failure": 2}}),
    "an add without a canonical key points nothing": Case(
        [("add", (answer("k1", A), None))], [True], {"k1": (A, "answer")}, {"c": None}, {"entries": 1}),
    "replace writes over an answer": Case(
        [("add", (answer("k1", A), "c")), ("replace", (answer("k1", B), "c"))], [True, True], {"k1": (B, "answer")}, {"c": "k1"},
        {"entries": 1}),
    "replace of a key holding nothing adds": Case(
        [("replace", (answer("k1", A), "c"))], [True], {"k1": (A, "answer")}, {"c": "k1"}, {"entries": 1, "apis": 1}),
    "replace takes the pointer from a failure of another key": Case(
        [("add", (failure("k1", F), "c")), ("add", (answer("k2", A), None)), ("replace", (answer("k2", B), "c"))],
        [True, True, True], {"k1": (F, "failure"), "k2": (B, "answer")}, {"c": "k2"}, {"entries": 2, "by_outcome": {"failure": 1}}),
    "replace leaves the pointer with another key's answer": Case(
        [("add", (answer("k1", A), "c")), ("add", (answer("k2", A), None)), ("replace", (answer("k2", B), "c"))],
        [True, True, True], {"k1": (A, "answer"), "k2": (B, "answer")}, {"c": "k1"}, {"entries": 2}),
    "delete removes the keys named, with their pointers and counts": Case(
        [("add", (answer("k1", A), "c")), ("add", (failure("k2", F), "d")), ("delete", ["k1", "k3"])], [True, True, 1],
        {"k2": (F, "failure")}, {"c": None, "d": "k2"}, {"entries": 1, "apis": 1, "by_outcome": {"failure": 1}}),
    "an API left without records is no longer counted": Case(
        [("add", (answer("k1", A), "c")), ("delete", ["k1"])], [True, 1], {}, {"c": None}, {"entries": 0, "apis": 0}),
    "a batch: an answer after a failure of its key replaces it": Case(
        [("add_many", [(failure("k1", F), "c"), (answer("k1", A), "c")])], [[True, True]], {"k1": (A, "answer")}, {"c": "k1"},
        {"entries": 1, "by_outcome": {"replaced": 1}}),
    "a batch: the pointer stays with its first answer": Case(
        [("add_many", [(answer("k1", A), "c"), (answer("k2", B), "c")])], [[True, True]],
        {"k1": (A, "answer"), "k2": (B, "answer")}, {"c": "k1"}, {"entries": 2}),
    "a batch: the pointer moves from its failure to its answer": Case(
        [("add_many", [(failure("k1", F), "c"), (answer("k2", A), "c")])], [[True, True]],
        {"k1": (F, "failure"), "k2": (A, "answer")}, {"c": "k2"}, {"entries": 2, "by_outcome": {"failure": 1}}),
    "a batch over the store: an answer replaces a failure there, a second answer is refused": Case(
        [("add", (failure("k1", F), "c")), ("add", (answer("k2", A), None)),
         ("add_many", [(answer("k1", A), "c"), (answer("k2", B), None), (answer("k3", B), "c")])],
        [True, True, [True, False, True]], {"k1": (A, "answer"), "k2": (A, "answer"), "k3": (B, "answer")}, {"c": "k1"},
        {"entries": 3, "by_outcome": {"replaced": 1}}),
}


def _apply(store: Store, what: str, arg: Any) -> Any:
    if what == "add":
        return store.add(*arg)
    if what == "add_many":
        return store.add_many(arg)
    if what == "replace":
        return store.replace(*arg)
    return store.delete(API, arg)


@pytest.mark.parametrize("name", list(CASES))
def test_every_backend_applies_the_rules_alike(store: Store, name: str) -> None:  # noqa: F811
    case = CASES[name]
    assert [_apply(store, what, arg) for what, arg in case.writes] == case.returned
    held = {record.key: (json.loads(record.body)["response"], record.outcome) for record in store.iter_api(API)}
    assert held == case.entries
    for canonical, key in case.pointers.items():
        pointed = store.get_canonical(API, canonical)
        assert (pointed.key if pointed is not None else None) == key, f"canonical {canonical!r}"
    counts = store.counts()
    assert counts is not None
    for name_, expected in case.counts.items():
        found = getattr(counts, name_)
        if isinstance(expected, dict):
            found = {k: v for k, v in found.items() if v}
        assert found == expected, name_
