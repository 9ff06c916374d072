"""Counters behind ``GET /stats``.

Every ``/virtual`` request ends in exactly one :class:`~.outcomes.OutcomeKind`, and
:meth:`Stats.count` is called once per request, by the server, with that final outcome.
So the outcome counters add up to ``requests``.  ``misses`` is not a counter of its own:
it is the sum of the outcomes of requests that missed the cache (``recorded``,
``shared``, ``failed``, ``unanswered``).  ``refusals`` counts the ``refused`` requests by
the setting whose limit turned them away; ``failures`` the reasons responders gave no
usable answer (once per responder call, not per request that shared it).
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

from .outcomes import Outcome, OutcomeKind

MAX_TRACKED_APIS = 10_000
#: API names are client text: the per-API table is also bounded by their total size
MAX_TRACKED_API_BYTES = 4 * 1024 * 1024
MAX_TRACKED_FAILURES = 200
MAX_FAILURE_CHARS = 200
_OTHER = "(other)"

#: the ``/stats`` name of each outcome's counter
COUNTER_NAMES: dict[OutcomeKind, str] = {
    OutcomeKind.HIT: "hits",
    OutcomeKind.RECORDED: "recorded",
    OutcomeKind.SHARED: "shared",
    OutcomeKind.FAILED: "failed",
    OutcomeKind.UNANSWERED: "unanswered",
    OutcomeKind.LOCAL: "local",
    OutcomeKind.REJECTED: "rejected",
    OutcomeKind.REFUSED: "refused",
    OutcomeKind.STORE_ERROR: "store_errors",
    OutcomeKind.ERROR: "errors",
}
MISSES = "misses"


class Stats:
    """Thread-safe counters; per-API and per-failure tables are capped (count and size) so random input cannot grow them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counters: Counter[str] = Counter()
        self.by_source: Counter[str] = Counter()
        self.by_api: dict[str, Counter[str]] = {}
        self.failures: Counter[str] = Counter()
        self.refusals: Counter[str] = Counter()
        self._api_bytes = 0

    def count(self, outcome: Outcome) -> None:
        """Count one finished request by its final outcome (call it exactly once per request)."""
        name = COUNTER_NAMES[outcome.kind]
        with self._lock:
            self.counters[name] += 1
            if outcome.source is not None:
                self.by_source[outcome.source] += 1
            if outcome.limit is not None:
                self.refusals[outcome.limit] += 1
            if outcome.api is not None:
                per_api = self.by_api.get(outcome.api)
                if per_api is None:
                    size = len(outcome.api.encode("utf-8", "surrogatepass"))
                    if len(self.by_api) < MAX_TRACKED_APIS and self._api_bytes + size <= MAX_TRACKED_API_BYTES:
                        key, self._api_bytes = outcome.api, self._api_bytes + size
                    else:
                        key = _OTHER
                    per_api = self.by_api.setdefault(key, Counter())
                per_api[name] += 1
                if outcome.kind.is_miss:
                    per_api[MISSES] += 1
            for problem in outcome.problems:
                detail = problem[:MAX_FAILURE_CHARS]
                if detail in self.failures or len(self.failures) < MAX_TRACKED_FAILURES:
                    self.failures[detail] += 1
                else:
                    self.failures[_OTHER] += 1

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            counters = {name: self.counters[name] for name in COUNTER_NAMES.values()}
            out: dict[str, Any] = {"requests": sum(counters.values())}
            out.update(counters)
            out[MISSES] = sum(counters[COUNTER_NAMES[kind]] for kind in OutcomeKind if kind.is_miss)
            out["by_source"] = dict(sorted(self.by_source.items()))
            out["refusals"] = dict(sorted(self.refusals.items()))
            out["failures"] = dict(self.failures.most_common())
            out["by_api"] = {api: dict(c) for api, c in sorted(self.by_api.items())}
            return out
