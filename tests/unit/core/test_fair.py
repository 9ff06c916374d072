"""Turns shared fairly between clients (``core/fair.py``): the thread semaphore and the event loop's limiter.
Moved from tests/integration/test_fairness.py (no sockets); each step waits for the turns' state, never a fixed time."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from stabletoolbench_mirror.core.fair import CLIENT, FairLimiter, FairSemaphore


def run_as(client: str, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` with :data:`CLIENT` set to ``client``, in a copy of this context (as anyio runs a worker thread)."""

    def as_client() -> Any:
        CLIENT.set(client)
        return fn(*args)

    return contextvars.copy_context().run(as_client)


class Counted:
    """A :class:`FairLimiter` whose turns in use the test counts (each entered and not yet left)."""

    def __init__(self, total: int, reserve: int = 0) -> None:
        self.limiter = FairLimiter(total, reserve)
        self.held = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.limiter, name)

    async def __aenter__(self) -> None:
        await self.limiter.__aenter__()
        self.held += 1

    async def __aexit__(self, *exc: object) -> None:
        self.held -= 1
        await self.limiter.__aexit__(*exc)


def _waiting(turns: Any) -> int:
    """Waiters queued now (under the semaphore's lock, where it has one: its threads change the queues)."""
    with getattr(turns, "_lock", None) or contextlib.nullcontext():
        return sum(len(q) for q in turns._turns.waiting.values())  # noqa: SLF001 - the turns' own bookkeeping


def _in_use(turns: FairSemaphore) -> int:
    return turns._turns.in_use  # noqa: SLF001 - the turns' own bookkeeping


def _until(condition: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout_s:g} s: {what}"
        time.sleep(0.002)


async def _until_async(condition: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout_s:g} s: {what}"
        await asyncio.sleep(0.001)


def test_a_freed_turn_goes_to_the_client_holding_the_fewest_then_in_turn() -> None:
    turns = FairSemaphore(2)
    order: list[str] = []
    lock = threading.Lock()
    busy_go, late_go = threading.Event(), threading.Event()

    def work(client: str, go: threading.Event) -> None:
        def one() -> None:
            with turns:
                with lock:
                    order.append(client)
                assert go.wait(10)

        run_as(client, one)

    threads = [threading.Thread(target=work, args=("busy", busy_go)) for _ in range(10)]
    for t in threads:
        t.start()
    _until(lambda: _in_use(turns) == 2 and _waiting(turns) == 8, '"busy" queues 8 behind its 2 running')
    late = [threading.Thread(target=work, args=(c, late_go)) for c in ("a", "b")]
    for t in late:
        t.start()
    _until(lambda: _waiting(turns) == 10, "a and b queue behind busy's 8")
    busy_go.set()  # busy's two turns are freed; a and b keep the turns they get until late_go
    _until(lambda: len(order) == 4, "the two freed turns are taken")
    late_go.set()
    for t in threads + late:
        t.join(10)
    # a and b hold nothing: they get the next two turns, not the 8 queued before them
    assert order[:2] == ["busy", "busy"] and sorted(order[2:4]) == ["a", "b"], order
    assert _in_use(turns) == 0 and _waiting(turns) == 0 and len(order) == 12


def test_clients_with_queues_share_turns_equally_fifo_within_each() -> None:
    async def main() -> list[tuple[str, int]]:
        limiter = Counted(1)
        done: list[tuple[str, int]] = []
        gate = asyncio.Event()

        async def one(client: str, n: int) -> None:
            CLIENT.set(client)
            async with limiter:
                await gate.wait()
                done.append((client, n))

        tasks = [asyncio.create_task(one(c, n)) for c in ("x", "y", "z") for n in range(3)]
        await _until_async(lambda: limiter.held == 1 and _waiting(limiter) == 8, "one runs, eight wait")
        gate.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 10)
        assert limiter.held == 0 and _waiting(limiter) == 0
        return done

    done = asyncio.run(main())
    assert done == [("x", 0), ("y", 0), ("z", 0), ("x", 1), ("y", 1), ("z", 1), ("x", 2), ("y", 2), ("z", 2)]


def test_a_wait_that_times_out_or_is_cancelled_leaves_no_turn_behind() -> None:
    turns = FairSemaphore(1)
    assert run_as("a", turns.acquire)
    assert run_as("b", turns.acquire, 0.05) is False  # timed out
    assert _waiting(turns) == 0
    run_as("a", turns.release)
    assert _in_use(turns) == 0 and run_as("b", turns.acquire, 0.05)
    run_as("b", turns.release)

    async def main() -> None:
        limiter = Counted(1)
        await limiter.__aenter__()
        waiter = asyncio.create_task(limiter.__aenter__())
        await _until_async(lambda: _waiting(limiter) == 1, "the second enter waits")
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        await limiter.__aexit__(None, None, None)
        assert limiter.held == 0 and _waiting(limiter) == 0
        async with limiter:
            pass

    asyncio.run(main())


def test_among_clients_never_served_the_one_with_the_least_work_goes_first() -> None:
    async def main() -> list[str]:
        limiter = Counted(1)
        done: list[str] = []
        gate = asyncio.Event()

        async def one(client: str) -> None:
            CLIENT.set(client)
            async with limiter:
                if client == "holder":
                    await gate.wait()
                done.append(client)

        tasks = [asyncio.create_task(one("holder"))]
        await _until_async(lambda: limiter.held == 1, "the holder holds the turn")
        tasks += [asyncio.create_task(one("crowd")) for _ in range(8)]  # queued first, 8 of them
        await _until_async(lambda: _waiting(limiter) == 8, "the crowd queues")
        tasks.append(asyncio.create_task(one("newcomer")))
        await _until_async(lambda: _waiting(limiter) == 9, "the newcomer queues")
        gate.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 10)
        return done

    assert asyncio.run(main()) == ["holder", "newcomer"] + ["crowd"] * 8


def test_a_reserve_turn_serves_a_client_holding_none_at_once_and_is_never_handed_on() -> None:
    async def main() -> None:
        limiter = Counted(1, reserve=1)
        CLIENT.set("busy")
        await limiter.__aenter__()  # busy fills the one turn
        second = asyncio.create_task(limiter.__aenter__())  # busy's second call waits
        await _until_async(lambda: _waiting(limiter) == 1, "busy's second call waits")

        async def newcomer() -> int:
            CLIENT.set("new")
            async with limiter:  # holds none: the reserve serves it at once
                return limiter.held

        assert await asyncio.wait_for(newcomer(), 10) == 2
        assert _waiting(limiter) == 1 and limiter.held == 1  # the freed reserve turn went to nobody
        await limiter.__aexit__(None, None, None)  # busy's first turn is handed to its second call
        await asyncio.wait_for(second, 10)
        assert limiter.held == 1 and _waiting(limiter) == 0
        await limiter.__aexit__(None, None, None)
        assert limiter.held == 0

    asyncio.run(main())


def test_fewer_than_one_turn_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one turn"):
        FairLimiter(0)
    with pytest.raises(ValueError, match="at least one turn"):
        FairSemaphore(0)


def test_a_thread_releasing_a_turn_it_does_not_hold_is_refused() -> None:
    turns = FairSemaphore(1)
    run_as("a", turns.acquire)
    with pytest.raises(ValueError, match="b releases a turn it does not hold"):
        run_as("b", turns.release)
    with pytest.raises(ValueError, match="no client releases"):
        turns.release()
    run_as("a", turns.release)
    assert _in_use(turns) == 0


def test_work_without_a_client_is_one_client_first_come_first_served() -> None:
    turns = FairSemaphore(1)
    order: list[int] = []
    turns.acquire()

    def one(n: int) -> None:
        with turns:
            order.append(n)

    threads = []
    for n in range(5):
        threads.append(threading.Thread(target=one, args=(n,)))
        threads[-1].start()
        _until(lambda n=n: _waiting(turns) == n + 1, f"thread {n} waits")
    turns.release()
    for t in threads:
        t.join(10)
    assert order == [0, 1, 2, 3, 4]
