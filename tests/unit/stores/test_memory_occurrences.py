"""The in-memory occurrence counters (stores/base.py) a run only this process can see is counted in."""

from __future__ import annotations

from stabletoolbench_mirror.stores.base import MemoryOccurrences


def test_private_counters_count_give_back_and_hand_over_past_their_bound() -> None:
    counters = MemoryOccurrences(limit=2)
    assert [counters.claim("a") for _ in range(3)] == [1, 2, 3]
    counters.release("a", 2)
    assert counters.claim("a") == 2
    assert counters.holds("b") and counters.claim("b") == 1
    assert not counters.holds("c") and not counters.counts("c")  # past the bound: the store counts "c"
    assert counters.holds("a") and counters.counts("a")
