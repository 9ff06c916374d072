"""The in-memory occurrence counters of a run only this process can see (engine/model_calls.py)."""

from __future__ import annotations

from stabletoolbench_mirror.engine.model_calls import PrivateCounters


def test_private_counters_count_give_back_and_hand_over_past_their_bound() -> None:
    counters = PrivateCounters(limit=2)
    assert [counters.claim("a") for _ in range(3)] == [1, 2, 3]
    counters.release("a", 2)
    assert counters.claim("a") == 2
    assert counters.holds("b") and counters.claim("b") == 1
    assert not counters.holds("c") and not counters.counts("c")  # past the bound: the store counts "c"
    assert counters.holds("a") and counters.counts("a")
