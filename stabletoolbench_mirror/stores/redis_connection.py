"""How the Redis store talks to Redis: the clients' options, the outage window and the single-flight locks.

Every Redis problem (refused or lost connection, timeout, ``OOM``/``READONLY``/``MISCONF``
answers) becomes the store's error quickly: sockets time out after ``store.timeout_s``, and a
command whose connection was lost is retried once on a fresh connection (one that timed out is
not: a Redis that hangs would cost twice the timeout).  After Redis failed to answer in time it is
not asked again for ``store.timeout_s`` (:class:`Outage`), so no request waits for Redis longer
than ``store.timeout_s`` in all.  redis-py has the retry but no such window: it is written here.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
import uuid
from collections.abc import Iterator
from typing import Any

import redis
import redis.asyncio
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from stabletoolbench_mirror.core.logs import clip
from stabletoolbench_mirror.stores import redis_scripts as scripts
from stabletoolbench_mirror.stores.leases import LeaseKeeper, wait_for_lock


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


class AsyncClients:
    """The asyncio client of the store's URL, for the server's event loop: made on first use in each loop."""

    def __init__(self, url: str, timeout_s: float) -> None:
        self._url = url
        self._timeout_s = timeout_s
        self._client: redis.asyncio.Redis | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def get(self) -> redis.asyncio.Redis:
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            self._client = redis.asyncio.Redis.from_url(self._url, **client_options(self._timeout_s, AsyncRetry))
            self._loop = loop
        return self._client

    def close(self) -> None:
        """Close the client when its loop is the running one (a client of another loop cannot be closed from here)."""
        client, self._client = self._client, None
        if client is None:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is not None and running is self._loop:
            running.create_task(client.aclose() if hasattr(client, "aclose") else client.close())


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


class FlightLocks:
    """Redis locks (``SET NX PX`` with a random token) held while filling a miss.

    Other hosts asking for the same call wait, then find the recorded answer.  The lock
    is a lease of ``ttl_s``, renewed while held (see :mod:`.leases`), so a holder
    that dies blocks the others for at most ``ttl_s``; renewal and release check
    the token, so nobody extends or deletes a lock that another holder has taken since.
    A waiter goes ahead without the lock after :data:`~.leases.MAX_LOCK_WAIT_S` (the
    add-if-absent write still keeps one answer).
    """

    def __init__(self, client: redis.Redis, prefix: str, ttl_s: float, log: logging.Logger) -> None:
        self._client = client
        self._prefix = prefix
        self._ttl_ms = max(1, int(ttl_s * 1000))
        self._log = log
        self._renew = client.register_script(scripts.RENEW)
        self._release = client.register_script(scripts.RELEASE)
        self._leases = LeaseKeeper(ttl_s)

    def acquire(self, api: str, canonical: str) -> tuple[str, str] | None:
        """The lock's name and token once it is held; ``None`` when it was not had in time."""
        digest = hashlib.sha256(f"{api}\x00{canonical}".encode("utf-8", "surrogatepass")).hexdigest()
        name, token = f"{self._prefix}:lock:{digest}", uuid.uuid4().hex
        if wait_for_lock(lambda: self._client.set(name, token, nx=True, px=self._ttl_ms) or None, api, self._log) is None:
            return None
        return name, token

    @contextlib.contextmanager
    def held(self, api: str, name: str, token: str) -> Iterator[None]:
        """Keep the lock :meth:`acquire` took while the block runs, then release it (later, while Redis is away)."""

        def renew() -> bool:
            return int(self._renew(keys=[name], args=[token, self._ttl_ms])) == 1

        def release() -> bool:
            try:
                self._release(keys=[name], args=[token])
            except RedisError:
                return False
            return True

        lease = self._leases.hold(renew)
        try:
            yield
        finally:
            self._leases.drop(lease)
            if not release():
                self._log.warning("single-flight lock for %s not released now (Redis unavailable); retrying in the background", clip(api))
                self._leases.release_later(release)

    def close(self) -> None:
        self._leases.close()
