"""Making the calls of a plan in several worker processes (``warm --processes N``).

One Python process tops out at several hundred calls per second (the GIL); the workers
share the store (diskcache and Redis are safe across processes) and each runs its share of
the ``concurrency`` threads.  Each worker has queues of its own: a worker killed while it
holds a queue's lock (kill -9, the OOM killer) then blocks no other worker, and the calls it
had not answered are handed to the others (a call it made without telling us is found
cached, not made twice).  The workers die with the warm process, even by SIGKILL.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import queue as queue_module
import signal
import sys
import threading
import time
from typing import Any

from stabletoolbench_mirror.config import Settings
from stabletoolbench_mirror.factory import build_layer
from stabletoolbench_mirror.snapshots.interrupts import CtrlC
from stabletoolbench_mirror.warming.plan import WarmItem, WarmPlan, WarmReport
from stabletoolbench_mirror.warming.runner import SWITCH_INTERVAL_S, Tracker, make_call, split

log = logging.getLogger(__name__)


def default_processes(concurrency: int) -> int:
    """Worker processes for a concurrency: one per 64 calls in flight, at most one per two CPUs.

    One process keeps about 64 calls in flight before the GIL limits it; on a small machine
    the simulator (or the stub standing in for it) needs the other cores.
    """
    return max(1, min((os.cpu_count() or 1) // 2, concurrency // 64))


def _die_with_parent() -> None:
    """Linux: have the kernel kill this worker when the warm process dies (even by SIGKILL)."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _worker_main(settings: Settings, threads: int, tasks: Any, results: Any, stop: Any, parent_pid: int) -> None:
    """One warming process: ``threads`` threads take calls from ``tasks`` and report to ``results``."""
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent coordinates Ctrl-C
    if os.getppid() != parent_pid:
        return
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    layer = build_layer(settings)

    def work() -> None:
        while not stop.is_set():
            try:
                task = tasks.get(timeout=1.0)
            except queue_module.Empty:
                if os.getppid() != parent_pid:
                    return
                continue
            if task is None:
                return
            index, call = task
            kind, reason, cause = make_call(layer.handle_call, call)
            # short messages: one atomic pipe write each, so a kill cannot leave half a message
            results.put((index, kind, reason[:1000], cause[:800]))

    pool = [threading.Thread(target=work, daemon=True) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    layer.close()


class _Pool:
    """The worker processes of one run and the bookkeeping of which calls each was given."""

    def __init__(self, settings: Settings, todo: list[WarmItem], *, concurrency: int, processes: int) -> None:
        self.todo = todo
        processes = max(1, min(processes, len(todo) or 1))
        self.shares = [max(1, concurrency // processes + (1 if i < concurrency % processes else 0)) for i in range(processes)]
        # fork where there is one: the workers start in milliseconds with everything imported
        # (no thread runs in this process yet, and each worker opens its own store connection)
        forks = "fork" in multiprocessing.get_all_start_methods()
        ctx = multiprocessing.get_context("fork") if forks else multiprocessing.get_context("spawn")
        self.stop = ctx.Event()
        self.tasks = [ctx.Queue() for _ in self.shares]
        self.results = [ctx.Queue() for _ in self.shares]
        for own in self.tasks:
            # calls still queued for a dead worker must not keep this process from exiting
            own.cancel_join_thread()
        self.workers = [
            ctx.Process(target=_worker_main, args=(settings, share, self.tasks[i], self.results[i], self.stop, os.getpid()), daemon=True)
            for i, share in enumerate(self.shares)
        ]
        self.answered: set[int] = set()
        self.assigned: list[set[int]] = [set() for _ in self.workers]
        self.dead: set[int] = set()

    def start(self) -> None:
        for w in self.workers:
            w.start()
        for index in range(len(self.todo)):
            self._give(index, index % len(self.workers))

    def _give(self, index: int, worker: int) -> None:
        self.assigned[worker].add(index)
        self.tasks[worker].put((index, self.todo[index].call))

    def drain(self, worker: int, tracker: Tracker) -> int:
        """Count the answers ``worker`` sent so far; return how many were new."""
        got = 0
        while True:
            try:
                index, kind, reason, cause = self.results[worker].get_nowait()
            except (queue_module.Empty, OSError, ValueError):
                return got
            if index not in self.answered:
                self.answered.add(index)
                tracker.done(self.todo[index], kind, reason, cause)
                got += 1

    def hand_over(self, tracker: Tracker) -> bool:
        """Give the unanswered calls of workers that died to the living; ``False`` when none lives."""
        alive = [i for i, w in enumerate(self.workers) if w.is_alive()]
        if not alive:
            return False
        for i, w in enumerate(self.workers):
            if i in alive or i in self.dead:
                continue
            self.dead.add(i)
            self.drain(i, tracker)
            orphans = sorted(self.assigned[i] - self.answered)
            log.warning("a warm worker process exited (code %s); its %d unanswered calls go to the others", w.exitcode, len(orphans))
            for k, index in enumerate(orphans):
                self._give(index, alive[k % len(alive)])
        return True

    def run(self, tracker: Tracker, ctrl_c: CtrlC) -> None:
        """Until every call is answered, no worker is left, or Ctrl-C."""
        while len(self.answered) < len(self.todo):
            if ctrl_c.pressed or self.stop.is_set():  # stopped early: the workers finish the calls in hand
                return
            if sum(self.drain(i, tracker) for i in range(len(self.workers))):
                continue
            if not self.hand_over(tracker):
                return
            time.sleep(0.005)
        for i, w in enumerate(self.workers):
            if w.is_alive():
                for _ in range(self.shares[i]):
                    self.tasks[i].put(None)

    def wind_down(self, tracker: Tracker, *, interrupted: bool) -> None:
        deadline = time.monotonic() + 30
        for w in self.workers:
            w.join(timeout=max(0.1, deadline - time.monotonic()))
            if w.is_alive():
                w.terminate()
        # answers that arrived while the workers wound down
        for i in range(len(self.workers)):
            self.drain(i, tracker)
        if not interrupted:
            # calls no worker could make (every worker died: it could not open the store, ...)
            for index, item in enumerate(self.todo):
                if index not in self.answered:
                    tracker.done(item, None, "a worker process exited before making this call", made=False)


def run_warm_processes(
    settings: Settings, plan: WarmPlan, *, concurrency: int, processes: int, progress: bool = True, stop_after_failures: int = 0
) -> WarmReport:
    """Like :func:`~.runner.run_warm` with the calls spread over ``processes`` worker processes."""
    layer = build_layer(settings, responders=[])  # the caches only: what is cached already
    try:
        counts, todo = split(layer, plan)
    finally:
        layer.close()
    started = time.monotonic()
    pool = _Pool(settings, todo, concurrency=concurrency, processes=processes)
    tracker: Tracker | None = None
    interrupted = False
    with CtrlC("stopping: the calls in hand finish (Ctrl-C again to quit now)") as ctrl_c:
        try:
            pool.start()
            tracker = Tracker(counts, len(todo), progress, stop_after_failures=stop_after_failures, stop=pool.stop)
            pool.run(tracker, ctrl_c)
        except KeyboardInterrupt:  # where CtrlC does not take Ctrl-C (not the main thread), or raised by other code
            interrupted = True
        finally:
            interrupted = interrupted or ctrl_c.pressed
            if interrupted:
                pool.stop.set()
            tracker = tracker or Tracker(counts, len(todo), False)
            pool.wind_down(tracker, interrupted=interrupted or bool(tracker.stopped))
    return tracker.report(plan, started, interrupted)
