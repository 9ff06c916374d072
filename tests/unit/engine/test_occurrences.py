"""The server's private run counted in bounded memory, spilled beyond (engine/occurrences.py): never a number twice."""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path

from stabletoolbench_mirror.engine.occurrences import PrivateRun, RunCounters
from stabletoolbench_mirror.stores import DiskcacheStore


def digest(n: int) -> str:
    return hashlib.sha256(str(n).encode()).hexdigest()


def claim(run: PrivateRun, d: str) -> int:
    """:meth:`PrivateRun.claim_now`, else the worker thread's :meth:`PrivateRun.claim`, as :class:`RunCounters` does."""
    number = run.claim_now(d)
    if run.wants_spill():
        run.spill()
    return number if number is not None else run.claim(d)


def release(run: PrivateRun, d: str, number: int) -> None:
    if not run.release_now(d, number):
        run.release(d, number)


def test_counters_past_the_bound_are_spilled_and_go_on_counting_where_they_were() -> None:
    run = PrivateRun("mine", limit=10, batch=4, bloom_bits=1 << 12)
    try:
        assert [claim(run, digest(0)) for _ in range(3)] == [1, 2, 3]
        release(run, digest(0), 2)  # a number given back, kept as the whole counter
        for n in range(1, 40):  # digest(0) is evicted and spilled
            assert claim(run, digest(n)) == 1
        assert len(run._held) <= 10  # noqa: SLF001 - the counters kept in memory
        assert claim(run, digest(0)) == 2 and claim(run, digest(0)) == 4  # the given-back number first, then on
        release(run, digest(0), 4)
        assert claim(run, digest(0)) == 4
        assert [claim(run, digest(n)) for n in (1, 20, 39)] == [2, 2, 2]
        folder = run._folder  # noqa: SLF001 - the spill file's temporary folder
        assert folder is not None and os.path.isdir(folder)
    finally:
        run.close()
    assert not os.path.exists(folder)  # the spill file goes with the server


def test_a_number_claimed_in_memory_and_evicted_before_its_release_is_given_back_in_the_file() -> None:
    run = PrivateRun("mine", limit=2, batch=1, bloom_bits=1 << 12)
    try:
        assert claim(run, digest(0)) == 1  # its upstream call is under way...
        for n in range(1, 6):
            claim(run, digest(n))  # ...while other requests push it out
        release(run, digest(0), 1)  # it failed: its number goes back, in the file
        assert claim(run, digest(0)) == 1
    finally:
        run.close()


def test_a_full_spill_queue_sends_new_requests_to_the_file_which_waits_for_the_spill() -> None:
    run = PrivateRun("mine", limit=2, batch=2, bloom_bits=1 << 12)
    try:
        numbers = {}
        for n in range(12):  # no spill written in between: the queue fills, then new keys go to the file
            numbers[n] = run.claim_now(digest(n))
        assert None in numbers.values()
        for n, number in numbers.items():
            if number is None:
                numbers[n] = run.claim(digest(n))  # writes the queue first
        assert set(numbers.values()) == {1}
        assert [claim(run, digest(n)) for n in range(12)] == [2] * 12
    finally:
        run.close()


def test_run_counters_count_another_run_in_the_store(tmp_path: Path) -> None:
    store = DiskcacheStore(tmp_path / "store")

    async def main() -> list[int]:
        counters = RunCounters(store, PrivateRun("mine"), 2.0)
        try:
            got = [await counters.claim("mine", digest(1)), await counters.claim("shared", digest(1)),
                   await counters.claim("shared", digest(1))]
            await counters.release("shared", digest(1), 2)
            got.append(await counters.claim("shared", digest(1)))
            return got
        finally:
            counters.close()

    try:
        assert asyncio.run(main()) == [1, 1, 2, 2]
        assert store.claim_occurrence("shared", digest(1)) == 3  # the store holds the shared run's counter
    finally:
        store.close()


def test_a_request_evicted_but_not_yet_spilled_waits_for_its_counter_to_be_written() -> None:
    run = PrivateRun("mine", limit=1, batch=100, bloom_bits=1 << 12)  # no batch is full: nothing spilled by itself
    try:
        assert run.claim_now(digest(0)) == 1
        assert run.claim_now(digest(1)) == 1  # digest(0) evicted, its counter waiting to be written
        assert run.claim_now(digest(0)) is None and run.claim(digest(0)) == 2
    finally:
        run.close()
