"""Admission control for ``/virtual``: a request over a limit waits for a slot instead of being turned away.

StableToolBench's client has no timeout and turns any answer other than HTTP 200 into a tool
error the agent reads, so an overloaded server must make requests *wait*, not refuse them.
Each client address has ``per_client`` slots; more requests from it wait in that client's own
FIFO queue (so clients do not wait behind each other), up to ``queue_timeout_s``.  Only a full
queue (``max_queued`` requests, or ``max_queued_bytes`` across all clients) or a wait past the
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
import logging
from collections import deque
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

REQUEST_OVERHEAD = 15 * 1024
"""What one request being read or waiting costs the server beside its body (its connection's parser,
scope, task and buffers), counted against ``max_queued_bytes``."""


class Refused(Exception):
    """The request cannot be admitted; ``setting`` names the limit to raise."""

    def __init__(self, reason: str, setting: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.setting = setting


@dataclass
class _Client:
    in_flight: int = 0
    waiters: deque[asyncio.Future[None]] = field(default_factory=deque)


class Admission:
    """Per-client slots with fair, bounded waiting (see the module doc)."""

    def __init__(self, per_client: int, *, max_queued: int, max_queued_bytes: int, queue_timeout_s: float) -> None:
        self.per_client = per_client
        self.max_queued = max_queued
        self.max_queued_bytes = max_queued_bytes
        self.queue_timeout_s = queue_timeout_s
        self._clients: dict[str, _Client] = {}
        self.queued = 0
        self.queued_bytes = 0
        self.waited = 0
        """Requests admitted after waiting (for /stats)."""

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
        if self.queued >= self.max_queued:
            self._forget_if_idle(client, state)
            raise Refused(f"{self.queued} requests are already waiting", "limits.max_queued_requests")
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        state.waiters.append(waiter)
        self.queued += 1
        try:
            await asyncio.wait_for(asyncio.shield(waiter), self.queue_timeout_s)
        except (asyncio.TimeoutError, asyncio.CancelledError) as exc:
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
        self.waited += 1

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

    def in_flight(self, client: str) -> int:
        state = self._clients.get(client)
        return state.in_flight if state else 0
