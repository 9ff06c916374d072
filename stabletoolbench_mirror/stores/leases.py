"""Keeping single-flight locks alive while they are held, and releasing them when the store comes back.

A lock shared through the store (diskcache or Redis) expires after a short lease, so a
holder that dies (``kill -9``, a lost host) blocks the others for at most that long.  A
holder that is alive renews its lease every third of it from one daemon thread per store,
so a long simulation keeps its lock.  A release that fails (the store is down) is retried
by the same thread until it succeeds or the lease has run out anyway, so a lock is not
left behind by a store outage.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from stabletoolbench_mirror.core.logs import clip

T = TypeVar("T")

log = logging.getLogger(__name__)

#: a waiter never waits longer than this for another holder; then it fills the miss itself
MAX_LOCK_WAIT_S = 600.0
#: how often a waiter tries the lock again
POLL_S = 0.02


def wait_for_lock(try_acquire: Callable[[], T | None], api: str, where: logging.Logger) -> T | None:
    """What ``try_acquire`` gives once it gives something, tried every :data:`POLL_S`; ``None`` (logged on ``where``)
    after :data:`MAX_LOCK_WAIT_S`: the waiter then fills the miss without the lock (both backends' flight locks)."""
    deadline = time.monotonic() + MAX_LOCK_WAIT_S
    while (held := try_acquire()) is None:
        if time.monotonic() >= deadline:
            where.warning("single-flight lock for %s not acquired in %.0fs; filling without it", clip(api), MAX_LOCK_WAIT_S)
            return None
        time.sleep(POLL_S)
    return held


class LeaseKeeper:
    """Renews held leases and retries failed releases in a daemon thread (started on first use)."""

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = float(ttl_s)
        self.renew_every_s = self.ttl_s / 3
        self.tick_s = min(self.renew_every_s, 0.5)
        self._ids = itertools.count()
        self._held: dict[int, tuple[Callable[[], bool], float]] = {}
        """id -> (renew, next renewal); ``renew`` returns False when the lock is no longer ours."""
        self._orphans: dict[int, tuple[Callable[[], bool], float]] = {}
        """id -> (release, give up at); ``release`` returns True when done, False to try again."""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def hold(self, renew: Callable[[], bool]) -> int:
        with self._lock:
            lease = next(self._ids)
            self._held[lease] = (renew, time.monotonic() + self.renew_every_s)
            self._start()
        return lease

    def drop(self, lease: int) -> None:
        with self._lock:
            self._held.pop(lease, None)

    def release_later(self, release: Callable[[], bool]) -> None:
        with self._lock:
            self._orphans[next(self._ids)] = (release, time.monotonic() + self.ttl_s)
            self._start()

    def _start(self) -> None:
        if self._thread is None and not self._stop.is_set():
            self._thread = threading.Thread(target=self._run, name="stm-lease-keeper", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.tick_s):
            now = time.monotonic()
            with self._lock:
                due = [(lease, renew) for lease, (renew, at) in self._held.items() if at <= now]
                orphans = list(self._orphans.items())
            for lease, renew in due:
                try:
                    still_ours = renew()
                except Exception as exc:  # noqa: BLE001 - the store is down: try again next time
                    log.warning("single-flight lock not renewed (retrying): %s", exc)
                    continue
                with self._lock:
                    if lease in self._held:
                        if still_ours:
                            self._held[lease] = (renew, now + self.renew_every_s)
                        else:
                            log.warning("single-flight lock expired while held")
                            del self._held[lease]
            for orphan, (release, give_up_at) in orphans:
                try:
                    done = release()
                except Exception as exc:  # noqa: BLE001
                    log.warning("single-flight lock release failed for good: %s", exc)
                    done = True
                if done or time.monotonic() >= give_up_at:
                    with self._lock:
                        self._orphans.pop(orphan, None)

    def close(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
