"""Whether the store can be read and written right now: ``/health``'s ``degraded`` and a throttled log.

When the store fails (disk full, read-only, Redis down) a ``record``-mode miss is still answered
by the real API or the simulator; the answer is served but not recorded (``unrecorded``).  This
object remembers that, so ``/health`` says ``degraded`` until the store works again, and the log
says so once per interval rather than once per request.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

log = logging.getLogger(__name__)

LOG_INTERVAL_S = 60.0


class StoreHealth:
    """Store trouble by operation (``read``, ``write``); cleared by the next success of that operation."""

    def __init__(self, log_interval_s: float = LOG_INTERVAL_S) -> None:
        self.log_interval_s = log_interval_s
        self._lock = threading.Lock()
        self._problems: dict[str, str] = {}
        self._since: float | None = None
        self._last_log = float("-inf")
        self._unlogged = 0
        self.unrecorded = 0
        #: a cheap flag for the hot path: any trouble at all
        self.troubled = False

    def failed(self, op: str, exc: BaseException, *, unrecorded: bool) -> None:
        """The store failed ``op``; ``unrecorded``: an answer was served without being recorded."""
        now = time.monotonic()
        with self._lock:
            self._problems[op] = str(exc)[:500]
            if self._since is None:
                self._since = now
            self.troubled = True
            self.unrecorded += int(unrecorded)
            self._unlogged += 1
            if now - self._last_log < self.log_interval_s:
                return
            self._last_log, count = now, self._unlogged
            self._unlogged = 0
        log.error(
            "the response store cannot %s (%s): answers are served but not recorded; %d request(s) affected since the "
            "last message, %d answer(s) unrecorded in all (logged at most every %.0f s)",
            op, exc, count, self.unrecorded, self.log_interval_s,
        )

    def succeeded(self, op: str) -> None:
        if not self.troubled:
            return
        with self._lock:
            if self._problems.pop(op, None) is None:
                return
            if not self._problems:
                self.troubled = False
                self._since = None
                log.warning("the response store works again (%s succeeded); %d answer(s) were served unrecorded", op, self.unrecorded)

    def report(self) -> dict[str, Any]:
        """``/health``'s view: ``status`` ``ok`` or ``degraded``, and what is wrong."""
        with self._lock:
            if not self._problems:
                return {"status": "ok", "unrecorded": self.unrecorded}
            return {
                "status": "degraded",
                "store_problems": dict(sorted(self._problems.items())),
                "degraded_for_s": round(time.monotonic() - (self._since or time.monotonic()), 1),
                "unrecorded": self.unrecorded,
            }
