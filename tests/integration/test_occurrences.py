"""Occurrence numbers of recorded model calls, over every backend: one counter per run and request, shared by
every process (and, for Redis, every host), numbers given back taken again first."""

from __future__ import annotations

import multiprocessing
import time
from typing import Any

from stabletoolbench_mirror.stores import Store, rules
from tests.helpers.redis_server import RedisServer, redis_prefix, redis_server  # noqa: F401
from tests.helpers.store_fixtures import shared_spec, spec, store  # noqa: F401
from tests.helpers.store_workers import claim_occurrences, open_store

DIGEST = "d" * 64


def test_numbers_count_up_per_run_and_request(store: Store) -> None:
    assert [store.claim_occurrence("run-a", DIGEST) for _ in range(3)] == [1, 2, 3]
    assert store.claim_occurrence("run-b", DIGEST) == 1  # another run counts from 1
    assert store.claim_occurrence("run-a", "e" * 64) == 1  # another request too
    assert len(store) == 0 and list(store) == []  # counters are no records: never listed, exported or snapshotted


def test_a_number_given_back_is_given_again_first(store: Store) -> None:
    for _ in range(4):
        store.claim_occurrence("r", DIGEST)
    store.release_occurrence("r", DIGEST, 2)
    store.release_occurrence("r", DIGEST, 3)
    store.release_occurrence("r", DIGEST, 3)  # twice: once
    store.release_occurrence("r", DIGEST, 9)  # never given: nothing
    assert [store.claim_occurrence("r", DIGEST) for _ in range(3)] == [2, 3, 5]
    store.release_occurrence("r", DIGEST, 5)  # the last one: the counter steps back
    assert store.claim_occurrence("r", DIGEST) == 5


def test_several_processes_never_get_the_same_number(shared_spec: dict[str, Any]) -> None:  # noqa: F811
    start_at = time.time() + 1.0
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        results = pool.starmap(claim_occurrences, [(shared_spec, "shared", DIGEST, 50, start_at)] * 4)
    numbers = sorted(n for got in results for n in got)
    assert numbers == list(range(1, 201))
    for got in results:
        assert got == sorted(got)  # each process sees its numbers rise
    other = open_store(shared_spec)  # another process or host opening the store later goes on counting
    try:
        assert other.claim_occurrence("shared", DIGEST) == 201
    finally:
        other.close()


def test_the_rules_alone() -> None:
    held = rules.Occurrences()
    first, held = rules.claim_occurrence(held)
    second, held = rules.claim_occurrence(held)
    assert (first, second, held) == (1, 2, rules.Occurrences(3, ()))
    held = rules.release_occurrence(held, 1)
    assert held == rules.Occurrences(3, (1,))
    assert rules.Occurrences.from_json(held.to_json()) == held
    assert rules.claim_occurrence(held) == (1, rules.Occurrences(3, ()))


def _counters_kept(spec: dict[str, Any], run: str) -> int:
    """How many counters of ``run`` the store keeps (read from the backend itself)."""
    if spec["kind"] == "diskcache":
        import sqlite3
        from pathlib import Path

        path = Path(spec["path"]) / "cache.db-occurrences"
        with sqlite3.connect(path) as con:
            return int(con.execute("SELECT COUNT(*) FROM occurrences WHERE run = ?", (run,)).fetchone()[0])
    import redis

    client = redis.Redis.from_url(spec["url"])
    return len(list(client.scan_iter(f"{spec['prefix']}:o:{run}:*")))


def test_a_counter_back_at_its_start_is_not_kept(shared_spec: dict[str, Any]) -> None:  # noqa: F811
    """A run whose requests all got their numbers back (replay misses, errors) leaves nothing in the store."""
    with open_store(shared_spec) as store:
        for n in range(5):
            digest = f"{n:064x}"
            number = store.claim_occurrence("missed-run", digest)
            store.release_occurrence("missed-run", digest, number)
        kept = store.claim_occurrence("kept-run", DIGEST)
        assert kept == 1 and _counters_kept(shared_spec, "missed-run") == 0 and _counters_kept(shared_spec, "kept-run") == 1
        assert store.claim_occurrence("missed-run", f"{0:064x}") == 1  # and counting starts again at 1
