"""Per-host circuit breakers: a dead host is skipped instead of waited for on every call.

After ``failures`` consecutive failures a host's breaker *opens*: calls to it are
refused at once for ``reset_s`` seconds.  Then it is *half-open*: one trial call
goes through (others are still refused); its success closes the breaker, its
failure opens it again for another ``reset_s``.

Written here, not taken from pybreaker or circuitbreaker: those wrap a call and count the exceptions it raises,
while the real API's transport judges a call after it returned (an HTTP 5xx is a failure, an answer over the size
bound is not: :meth:`~.transport.Transport.send`) and answers a refused call with a failed reply, not an
exception.  The breaker is the three methods that judgement needs (:meth:`CircuitBreaker.allow`, ``success``,
``failure``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

Clock = Callable[[], float]


class CircuitBreaker:
    """The breaker of one host (thread-safe)."""

    def __init__(self, failures: int, reset_s: float, clock: Clock = time.monotonic) -> None:
        self.failures = failures
        self.reset_s = reset_s
        self._clock = clock
        self._lock = threading.Lock()
        self._consecutive = 0
        self._opened_at: float | None = None
        self._probing = False

    def allow(self) -> bool:
        """Whether a call may go to the host now; a ``True`` must be followed by :meth:`success` or :meth:`failure`."""
        with self._lock:
            if self._opened_at is None:
                return True
            if self._probing or self._clock() - self._opened_at < self.reset_s:
                return False
            self._probing = True  # this caller is the half-open trial
            return True

    def success(self) -> None:
        with self._lock:
            self._consecutive = 0
            self._opened_at = None
            self._probing = False

    def failure(self) -> None:
        with self._lock:
            self._consecutive += 1
            if self._probing or self._consecutive >= self.failures:
                self._opened_at = self._clock()
            self._probing = False


class BreakerBoard:
    """One :class:`CircuitBreaker` per host, created on first use."""

    def __init__(self, failures: int, reset_s: float, clock: Clock = time.monotonic) -> None:
        self.failures = failures
        self.reset_s = reset_s
        self._clock = clock
        self._lock = threading.Lock()
        self._breakers: dict[str, CircuitBreaker] = {}

    def get(self, host: str) -> CircuitBreaker:
        with self._lock:
            breaker = self._breakers.get(host)
            if breaker is None:
                breaker = self._breakers[host] = CircuitBreaker(self.failures, self.reset_s, self._clock)
            return breaker
