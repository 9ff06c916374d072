"""Shadow pairs: a simulator answer kept beside each real answer, never served.

With ``real.shadow_simulate: true``, every miss the real API answers is also given to the
simulator (``simulator.*`` settings, whether or not ``simulator.enabled``), in the
background; its answer is recorded in the **shadow store**, a separate store that the
server never reads.  ``fidelity --from-store --shadow`` then scores the simulator against
the real answers of the user's own traffic.

The shadow store sits beside the main one: the diskcache folder ``<store.path>-shadow``,
or the Redis prefix ``<store.prefix>-shadow``.  Shadow work never delays or changes an
answer: at most ``MAX_PENDING`` simulations wait at once, more are skipped (and counted).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from stabletoolbench_mirror.core.call import ToolCall
from stabletoolbench_mirror.core.logs import clip
from stabletoolbench_mirror.core.records import Record, Source
from stabletoolbench_mirror.engine.responders import Attempt, Responder
from stabletoolbench_mirror.engine.stats import LocalEvents, event_section
from stabletoolbench_mirror.stores import Store

log = logging.getLogger(__name__)

SHADOW_SUFFIX = "-shadow"
MAX_PENDING = 64
SHADOW_WORKERS = 4


class ShadowedResponder:
    """The real API, plus a background simulation of every call it answers, kept in the shadow store."""

    def __init__(self, real: Responder, simulator: Any, shadow_store: Store, *, max_pending: int = MAX_PENDING) -> None:
        self.real = real
        self.simulator = simulator
        self.shadow_store = shadow_store
        self.source: Source = real.source
        self._pool = ThreadPoolExecutor(max_workers=SHADOW_WORKERS, thread_name_prefix="stm-shadow")
        self._pending = threading.BoundedSemaphore(max_pending)
        self._events: Any = LocalEvents()

    def __getattr__(self, name: str) -> Any:
        # everything else (breaker state, origin, ...) is the real responder's
        return getattr(self.real, name)

    @property
    def prompt(self) -> Any:
        """The shadow simulator's system prompt (for ``/health``)."""
        return self.simulator.prompt

    @property
    def style(self) -> str:
        return self.simulator.style

    def respond(self, call: ToolCall, examples: Sequence[Record]) -> Attempt:
        attempt = self.real.respond(call, examples)
        if attempt.answer is not None:
            self.shadow(call)
        return attempt

    def shadow(self, call: ToolCall) -> None:
        if not self._pending.acquire(blocking=False):
            self._count("shadow_skipped")
            return
        try:
            self._pool.submit(self._simulate, call)
        except RuntimeError:  # shut down
            self._pending.release()

    def _simulate(self, call: ToolCall) -> None:
        try:
            if self.shadow_store.get(call.api, call.key) is not None:
                return
            # no few-shot examples: the real answer just recorded must not leak into its own shadow
            attempt = self.simulator.respond(call, [])
            if attempt.answer is None:
                self._count("shadow_failed")
                return
            record = Record.from_answer(call.api, call.key, attempt.answer, "simulated", attempt.origin, attempt.meta)
            self.shadow_store.add(record, call.canonical)
            self._count("shadow_recorded")
        except Exception as exc:  # noqa: BLE001 - shadow work must never hurt serving (a store error included)
            log.warning("shadow simulation of %s failed: %s", clip(call.api), clip(exc, 500))
            self._count("shadow_failed")
        finally:
            self._pending.release()

    EVENTS = ("shadow_recorded", "shadow_failed", "shadow_skipped")

    def use_stats(self, stats: Any) -> None:
        """Count the shadow events in the server's counters (shared by its workers); the simulator's too."""
        self._events = stats
        self.simulator.use_stats(stats)

    def _count(self, name: str) -> None:
        self._events.count_event("shadow", name)

    def stats(self) -> dict[str, dict[str, int]]:
        """For ``/stats``: shadow answers recorded, failed and skipped (too many waiting)."""
        return event_section(self._events, "shadow", self.EVENTS)

    def close(self) -> None:
        """Finish the shadow work already accepted, then close everything."""
        self._pool.shutdown(wait=True)
        self.real.close()
        self.simulator.close()
        self.shadow_store.close()
