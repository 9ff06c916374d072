"""Admission control for ``/virtual``: a request over a limit waits for a slot instead of being turned away.

StableToolBench's client has no timeout and turns any answer other than HTTP 200 into a tool
error the agent reads, so an overloaded server must make requests *wait*, not refuse them.
Each client address has ``per_client`` slots; more requests from it wait in that client's own
FIFO queue (so clients do not wait behind each other), up to ``queue_timeout_s``.  Only a full
queue (:data:`MAX_QUEUED_REQUESTS` requests, or ``max_queued_bytes`` across all clients) or a wait past the
timeout is refused.  Runs on one event loop: no locks.

``max_queued_bytes`` bounds what requests not yet admitted hold: a request reserves (:meth:`reserve`) its
body (its ``Content-Length``, or each chunk as it arrives) plus :data:`REQUEST_OVERHEAD` before its
body is read, and keeps that until it has a slot.  So bodies being read count as well as bodies
waiting (1,000 clients stalling mid-body cannot hold 1,000 bodies), and a request that would go
over is refused before its body is read.  The first request is never refused by it (nothing else
holds any bytes then), so a small setting never locks every request out.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import logging
from collections import deque
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

REQUEST_OVERHEAD = 15 * 1024
"""What one request being read or waiting costs the server beside its body (its connection's parser,
scope, task and buffers), counted against ``max_queued_bytes``."""


MAX_QUEUED_REQUESTS = 100_000  # requests waiting for a slot across all clients; one more gets HTTP 503 at once


class Refused(Exception):
    """The request cannot be admitted; ``limit`` names what refused it: a setting to raise (dotted: ``limits.*``,
    ``mcp.*``) or a fixed bound (:data:`MAX_QUEUED_REQUESTS`'s ``max_queued_requests``)."""

    def __init__(self, reason: str, limit: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.limit = limit

    @property
    def message(self) -> str:
        """What the refused client reads: the reason, and the setting that bounds it when one does."""
        bound = f"; the server's {self.limit} setting bounds this" if "." in self.limit else ""
        return f"stabletoolbench-mirror is overloaded ({self.reason}){bound}"


@dataclass
class _Client:
    in_flight: int = 0
    waiters: deque[asyncio.Future[None]] = field(default_factory=deque)


class Admission:
    """Per-client slots with fair, bounded waiting (see the module doc)."""

    def __init__(self, per_client: int, *, max_queued_bytes: int, queue_timeout_s: float) -> None:
        self.per_client = per_client
        self.max_queued_bytes = max_queued_bytes
        self.queue_timeout_s = queue_timeout_s
        self._clients: dict[str, _Client] = {}
        self.queued = 0
        self.queued_bytes = 0

    def reserve(self, size: int) -> None:
        """Count ``size`` more bytes against ``max_queued_bytes``; :class:`Refused` (nothing counted) when they
        would go over it while other requests hold bytes.  Give them back with :meth:`release`."""
        if self.queued_bytes and self.queued_bytes + size > self.max_queued_bytes:
            raise Refused(f"{self.queued_bytes} bytes of requests are already being read or waiting", "limits.max_queued_bytes")
        self.queued_bytes += size

    def release(self, size: int) -> None:
        """Give back bytes counted by :meth:`reserve`."""
        self.queued_bytes -= size

    async def enter(self, client: str) -> None:
        """Take one of ``client``'s slots, waiting for one if needed; :class:`Refused` when it cannot.

        The request's bytes are counted by :meth:`reserve` (the caller releases them once this returns or raises).
        """
        state = self._clients.get(client)
        if state is None:
            state = self._clients[client] = _Client()
        if state.in_flight < self.per_client and not state.waiters:
            state.in_flight += 1
            return
        if self.queued >= MAX_QUEUED_REQUESTS:
            self._forget_if_idle(client, state)
            raise Refused(f"{self.queued} requests are already waiting, the most this server queues", "max_queued_requests")
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        state.waiters.append(waiter)
        self.queued += 1
        try:
            await asyncio.wait_for(asyncio.shield(waiter), self.queue_timeout_s)
        except (TimeoutError, asyncio.CancelledError) as exc:
            if waiter.done() and not waiter.cancelled():
                # the slot was handed over just as the wait ended: give it on to the next in line
                self.leave(client)
            else:
                waiter.cancel()
                state.waiters.remove(waiter)
                self._forget_if_idle(client, state)
            if isinstance(exc, asyncio.CancelledError):
                raise
            raise Refused(f"waited {self.queue_timeout_s:g} s for a slot", "limits.queue_timeout_s") from None
        finally:
            self.queued -= 1

    def leave(self, client: str) -> None:
        """Give back a slot: to the next waiting request of the same client, else free it."""
        state = self._clients[client]
        while state.waiters:
            waiter = state.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot passes on; in_flight is unchanged
                return
        state.in_flight -= 1
        self._forget_if_idle(client, state)

    def _forget_if_idle(self, client: str, state: _Client) -> None:
        if state.in_flight <= 0 and not state.waiters:
            self._clients.pop(client, None)


class ForwardedFor:
    """Who the client is behind trusted reverse proxies (``limits.trusted_proxies``).

    Only a connection from a trusted proxy has its ``X-Forwarded-For`` read, and each proxy appends the
    address it was connected from, so only the right end of the header can be believed: the client
    is the rightmost address that is not itself a trusted proxy (as uvicorn's ``ProxyHeadersMiddleware``
    and werkzeug's ``ProxyFix`` document).  Whatever lies left of it was written by that client and is
    never read.  A value that is not an IP address (optionally with a port) on the way there makes
    the whole header unusable: the client is then the connecting address, so junk names no new
    client.  With every address trusted, the leftmost is the client.
    """

    def __init__(self, trusted: list[str]) -> None:
        self.any = "*" in trusted
        self.networks = tuple(ipaddress.ip_network(t, strict=False) for t in trusted if t != "*")
        self.trusts = functools.lru_cache(maxsize=4096)(self._trusts)

    def _trusts(self, host: str) -> bool:
        if self.any:
            return True
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False
        return any(address in net for net in self.networks)

    def client(self, connected: str, headers: list[tuple[bytes, bytes]]) -> str:
        """The client of a request from ``connected`` with these (ASGI) headers."""
        if not self.trusts(connected):
            return connected
        values = [v for k, v in headers if k == b"x-forwarded-for"]
        if not values:
            return connected
        hops = b",".join(values).decode("latin-1").split(",")
        client = connected
        for hop in reversed(hops):
            address = _address(hop.strip())
            if address is None:
                return connected  # junk: the header names nobody
            client = address
            if not self.trusts(address):
                return address
        return client


def _address(value: str) -> str | None:
    """The IP address in an ``X-Forwarded-For`` hop (``1.2.3.4``, ``1.2.3.4:80``, ``::1``, ``[::1]:80``), normalised; else ``None``."""
    if len(value) > 64:
        return None
    if value.startswith("["):
        host, bracket, rest = value[1:].partition("]")
        if not bracket or rest and not (rest.startswith(":") and rest[1:].isdigit()):
            return None
    elif value.count(":") == 1:
        host, _, port = value.partition(":")
        if not port.isdigit():
            return None
    else:
        host = value
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return None
