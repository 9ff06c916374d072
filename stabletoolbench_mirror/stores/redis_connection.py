"""How the Redis store talks to Redis: the clients' options and the outage window.

Every Redis problem (refused or lost connection, timeout, ``OOM``/``READONLY``/``MISCONF``
answers) becomes the store's error quickly: sockets time out after ``store.timeout_s``, and a
command whose connection was lost is retried once on a fresh connection (one that timed out is
not: a Redis that hangs would cost twice the timeout).  After Redis failed to answer in time it is
not asked again for ``store.timeout_s`` (:class:`Outage`), so no request waits for Redis longer
than ``store.timeout_s`` in all.  redis-py has the retry but no such window: it is written here.
"""

from __future__ import annotations

import time
from typing import Any

import redis
from redis.backoff import NoBackoff


def client_options(timeout_s: float, retry_class: Any) -> dict[str, Any]:
    """The options of every client of the store (sync or asyncio: ``retry_class``)."""
    return {
        "decode_responses": True,
        "socket_timeout": timeout_s,
        "socket_connect_timeout": timeout_s,
        # one retry on a fresh connection, for a lost connection only: a restarted Redis is picked up by the next
        # command, and a Redis that does not answer costs one timeout, not two
        "retry": retry_class(NoBackoff(), 1, supported_errors=(redis.exceptions.ConnectionError,)),
        "health_check_interval": 0,
    }


class Unreachable(redis.exceptions.ConnectionError):
    """Redis was not asked: it failed to answer less than ``store.timeout_s`` ago (see :class:`Outage`)."""


class Outage:
    """When Redis last failed to answer in time, so that it is not waited for again within ``window_s``.

    A timeout (Redis paused, swapping or unreachable: the socket timed out) opens the window; every
    command meanwhile fails at once with :class:`Unreachable`; the first one after it asks Redis again
    (and a successful read closes it).  One request in a window may wait ``window_s`` (the socket
    timeout); the others do not wait.  A refused or lost connection opens nothing: it costs no wait,
    and a Redis that restarts is used again by the very next command.
    """

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._until = 0.0
        self._why = ""

    def check(self) -> None:
        """Raise :class:`Unreachable` while the window is open."""
        until = self._until
        if until and time.monotonic() < until:
            raise Unreachable(f"not asked: it failed less than {self.window_s:g} s ago (store.timeout_s): {self._why}")

    def failed(self, exc: BaseException) -> None:
        if isinstance(exc, (redis.exceptions.TimeoutError, TimeoutError)):
            self._why = f"{type(exc).__name__}: {exc}"[:300]
            self._until = time.monotonic() + self.window_s

    def succeeded(self) -> None:
        self._until = 0.0


def optional_text(value: str | bytes | None) -> str | None:
    return None if value is None else text(value)


def text(value: str | bytes) -> str:
    """A reply's text (the clients decode replies: ``decode_responses``; bytes only as a fallback)."""
    return value if isinstance(value, str) else value.decode("utf-8")
