"""Blocking work shared fairly between clients: whoever holds the fewest turns gets the next one.

The server answers many clients with a few shared resources: the worker threads (local tools,
sessions, store I/O, misses), the miss turns (``limits.max_pending_misses``) and the simulator's
concurrency.  First come, first served, one client with many slow requests queued makes every
other client wait behind all of them (199 addresses with 8 slow misses each kept 127.0.0.1, with
free slots, waiting 62 s for a local tool).  Here each client waits in its own FIFO queue, and a
freed turn goes to the waiting client that holds the fewest turns at that moment (ties: the one
served least recently, then the one with the least work in all, then the one waiting longest), so a client under its limit is served at the next free turn whatever
others queue (and with a ``reserve``, a client with nothing running is served at once even when
others' work fills every turn), and clients that keep queues take turns (round robin).

Who the client is comes from :data:`CLIENT`, a context variable the server sets for each
``/virtual`` request; anyio runs worker threads in a copy of the caller's context, so code in a
worker thread sees it too.  Work with no client (``warm``, tests) is one client: FIFO, as before.

:class:`FairLimiter` is for the event loop (a ``limiter`` for ``anyio.to_thread.run_sync``);
:class:`FairSemaphore` is for threads (as ``threading.BoundedSemaphore``: ``with`` one, or ``acquire(timeout=...)``).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import threading
from collections import deque
from contextvars import ContextVar
from typing import Generic, TypeVar

CLIENT: ContextVar[str] = ContextVar("stm_client", default="")
"""The client (its address) on whose behalf the current request's work runs."""

W = TypeVar("W")


class _Turns(Generic[W]):
    """The bookkeeping of both kinds (not thread-safe: callers hold a lock or run on one loop).

    ``held``: turns each client holds; ``waiting``: each client's waiters in order; ``_last``: when
    each active client was last handed a turn; ``_ready``: a heap of ``(held, last, held + waiting,
    since, seq, client)`` with one live entry per waiting client (stale ones are skipped when popped).
    """

    def __init__(self, total: int, reserve: int = 0) -> None:
        if total < 1:
            raise ValueError("at least one turn is needed")
        self.total = total
        self.reserve = reserve
        self.in_use = 0
        self.held: dict[str, int] = {}
        self.waiting: dict[str, deque[W]] = {}
        self._ready: list[tuple[int, int, int, int, int, str]] = []
        self._live: dict[str, tuple[int, int, int, int, int, str]] = {}
        self._last: dict[str, int] = {}
        self._since: dict[str, int] = {}
        self._seq = itertools.count()

    def take_now(self, client: str) -> bool:
        """Take a turn at once when one is free and nobody waits; else ``False`` (then :meth:`wait`)."""
        if (self.in_use < self.total and not self.waiting) or self._may_reserve(client):
            self._grant(client)
            return True
        return False

    def _may_reserve(self, client: str) -> bool:
        return self.held.get(client, 0) == 0 and self.in_use < self.total + self.reserve

    def wait(self, client: str, waiter: W) -> None:
        queue = self.waiting.get(client)
        if queue is None:
            queue = self.waiting[client] = deque()
        queue.append(waiter)
        if len(queue) == 1:
            self._since[client] = next(self._seq)
        self._push(client)

    def forget(self, client: str, waiter: W) -> None:
        """A waiter that gave up (timeout, cancel) before it was handed a turn."""
        queue = self.waiting.get(client)
        if queue is None:
            return
        try:
            queue.remove(waiter)
        except ValueError:
            return
        if not queue:
            del self.waiting[client]
            self._live.pop(client, None)
            self._idle(client)
        else:
            self._push(client)

    def release(self, client: str) -> tuple[str, W] | None:
        """Give back ``client``'s turn; the ``(client, waiter)`` it goes to, if anyone waits (already counted)."""
        self.in_use -= 1
        left = self.held.get(client, 0) - 1
        if left > 0:
            self.held[client] = left
        else:
            self.held.pop(client, None)
        if client in self.waiting:
            self._push(client)  # it holds one fewer now: its place changes
        else:
            self._idle(client)
        return self.hand_on()

    def hand_on(self) -> tuple[str, W] | None:
        """Give a free turn to the waiting client that holds the fewest (``None`` when no turn is free or nobody waits)."""
        while self._ready:
            entry = self._ready[0]
            client = entry[-1]
            if self._live.get(client) is not entry:
                heapq.heappop(self._ready)
                continue  # stale
            if self.in_use >= self.total:
                return None  # the reserve is for clients that come with nothing running, never handed on
            heapq.heappop(self._ready)
            del self._live[client]
            queue = self.waiting[client]
            waiter = queue.popleft()
            self._grant(client)
            if queue:
                self._push(client)
            else:
                del self.waiting[client]
            return client, waiter
        return None

    def _grant(self, client: str) -> None:
        self.in_use += 1
        self.held[client] = self.held.get(client, 0) + 1
        self._last[client] = next(self._seq)

    def _idle(self, client: str) -> None:
        if client not in self.held and client not in self.waiting:
            self._last.pop(client, None)
            self._since.pop(client, None)

    def _push(self, client: str) -> None:
        held = self.held.get(client, 0)
        queued = len(self.waiting[client])
        entry = (held, self._last.get(client, -1), held + queued, self._since.get(client, 0), next(self._seq), client)
        self._live[client] = entry
        heapq.heappush(self._ready, entry)
        if len(self._ready) > 4 * len(self._live) + 64:  # drop stale entries now and then
            self._ready = list(self._live.values())
            heapq.heapify(self._ready)


class FairLimiter:
    """``total`` turns for the event loop, shared fairly (see the module doc); ``async with`` one.

    Pass it as ``limiter=`` to ``anyio.to_thread.run_sync``: the threads then run fairly between
    clients (anyio takes the limiter with ``async with`` before it hands the call to a thread).
    """

    def __init__(self, total: int, reserve: int = 0) -> None:
        """``reserve``: turns beyond ``total`` that only a client holding none may take as it comes (a
        client with nothing running is then served at once, even while other clients' work fills every
        turn); a freed reserve turn is never handed to a waiter, so the reserve fills up again."""
        self._turns: _Turns[asyncio.Future[None]] = _Turns(total, reserve)

    async def __aenter__(self) -> None:
        client = CLIENT.get()
        turns = self._turns
        if turns.take_now(client):
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        turns.wait(client, waiter)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self._release(client)  # handed a turn just as the wait ended: pass it on
            else:
                turns.forget(client, waiter)
            raise

    async def __aexit__(self, *exc: object) -> None:
        self._release(CLIENT.get())

    def _release(self, client: str) -> None:
        handed = self._turns.release(client)
        if handed is not None:
            handed[1].set_result(None)


class _Waiter:
    __slots__ = ("event", "granted")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.granted = False


class FairSemaphore:
    """``total`` turns for threads, shared fairly (see the module doc): ``acquire``/``release`` or ``with``.

    A turn is released by the thread (so the client) that acquired it.
    """

    def __init__(self, total: int) -> None:
        self._turns: _Turns[_Waiter] = _Turns(total)
        self._lock = threading.Lock()

    def acquire(self, timeout: float | None = None) -> bool:
        client = CLIENT.get()
        with self._lock:
            if self._turns.take_now(client):
                return True
            waiter = _Waiter()
            self._turns.wait(client, waiter)
        if waiter.event.wait(timeout):
            return True
        with self._lock:
            if waiter.granted:  # handed a turn just as the wait timed out: keep it
                return True
            self._turns.forget(client, waiter)
            return False

    def release(self) -> None:
        client = CLIENT.get()
        with self._lock:
            if self._turns.held.get(client, 0) <= 0:
                raise ValueError(f"{client or 'no client'} releases a turn it does not hold")
            handed = self._turns.release(client)
            if handed is not None:
                handed[1].granted = True
        if handed is not None:
            handed[1].event.set()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
