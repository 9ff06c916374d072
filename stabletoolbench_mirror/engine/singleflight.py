"""Single flight: concurrent identical misses in one process share one call.

The first caller for a key runs the function; callers that arrive while it runs
wait for its result (or exception) instead of calling again.  Across processes and
hosts the store's add-if-absent write (and, with Redis, a lock) keeps one answer.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from typing import Generic, TypeVar

T = TypeVar("T")


class SingleFlight(Generic[T]):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._in_flight: dict[Hashable, Future[T]] = {}

    def do(self, key: Hashable, fn: Callable[[], T]) -> tuple[T, bool]:
        """Run ``fn`` once for concurrent callers of ``key``; return ``(result, shared)``.

        ``shared`` is false for the caller that ran ``fn`` and true for those that waited.
        """
        with self._lock:
            future = self._in_flight.get(key)
            leader = future is None
            if leader:
                future = Future()
                self._in_flight[key] = future
        assert future is not None
        if not leader:
            return future.result(), True
        try:
            result = fn()
        except BaseException as exc:
            future.set_exception(exc)
            raise
        else:
            future.set_result(result)
            return result, False
        finally:
            with self._lock:
                self._in_flight.pop(key, None)
