"""The per-host circuit breaker's states, driven by an explicit clock."""

from __future__ import annotations

from stabletoolbench_mirror.responders.real.breaker import BreakerBoard, CircuitBreaker


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_opens_after_k_consecutive_failures_and_half_opens_after_reset() -> None:
    clock = Clock()
    breaker = CircuitBreaker(3, 10.0, clock)
    for _ in range(2):
        assert breaker.allow()
        breaker.failure()
    assert breaker.allow()  # closed below k failures
    breaker.failure()
    assert not breaker.allow()  # open
    clock.now += 9.9
    assert not breaker.allow()
    clock.now += 0.2
    assert breaker.allow()  # half open: the one trial call
    assert not breaker.allow()  # others wait for its result
    breaker.success()
    assert breaker.allow() and breaker.allow()  # closed: every call goes


def test_a_failed_trial_reopens_for_a_full_period() -> None:
    clock = Clock()
    breaker = CircuitBreaker(1, 5.0, clock)
    breaker.allow()
    breaker.failure()
    clock.now += 5.0
    assert breaker.allow()
    breaker.failure()
    assert not breaker.allow()  # open again
    clock.now += 4.0
    assert not breaker.allow()
    clock.now += 0.99
    assert not breaker.allow()  # still open just before the full period
    clock.now += 0.01
    assert breaker.allow()  # the next trial, a full period after the failed one


def test_a_success_resets_the_count() -> None:
    breaker = CircuitBreaker(2, 5.0, Clock())
    for _ in range(5):
        breaker.allow()
        breaker.failure()
        breaker.allow()
        breaker.success()
    assert breaker.allow() and breaker.allow()  # never opened: closed


def test_hosts_are_independent() -> None:
    board = BreakerBoard(1, 60.0, Clock())
    board.get("dead.example:443").allow()
    board.get("dead.example:443").failure()
    assert not board.get("dead.example:443").allow()
    assert board.get("alive.example:443").allow() and board.get("alive.example:443").allow()
    assert not board.get("dead.example:443").allow()
