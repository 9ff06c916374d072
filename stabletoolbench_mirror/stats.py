"""Counters behind ``GET /stats`` and ``cache stats``.

Per request exactly one of ``hits``, ``misses``, ``retries`` (a failure record tried again
in ``record`` mode), ``rejected`` (bad input),
``local`` (answered without the cache: ``chat_with_user``) or ``refused`` (turned away
by a server limit: a full wait queue, a wait past ``limits.queue_timeout_s``, a body
slower than ``limits.body_timeout_s``; by setting in ``refusals``) counts.  Each miss then
ends as ``recorded`` (a real or simulated answer, stored), ``unrecorded`` (an answer
served that the store could not record), ``failed`` (the real API and simulator gave
nothing usable; the error answer served is recorded as a failure record) or
``unanswered`` (nothing may fill it: ``replay`` mode or nothing configured).
Besides: ``failure_hits`` (hits that served a failure record), ``failure_records`` (new
failure records written), ``replaced`` (retries whose usable answer replaced a failure record).
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

MAX_TRACKED_APIS = 10_000
MAX_TRACKED_FAILURES = 200
_OTHER = "(other)"
OUTCOMES = (
    "hits", "misses", "retries", "rejected", "local", "refused", "recorded", "failed", "unrecorded", "unanswered", "store_errors",
    "failure_hits", "failure_records", "replaced",
)


class Stats:
    """Thread-safe counters; per-API and per-failure tables are capped so random input cannot grow them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counters: Counter[str] = Counter()
        self.by_source: Counter[str] = Counter()
        self.by_api: dict[str, Counter[str]] = {}
        self.failures: Counter[str] = Counter()
        self.refusals: Counter[str] = Counter()

    def count(self, outcome: str, namespace: str | None = None, source: str | None = None) -> None:
        assert outcome in OUTCOMES, outcome
        with self._lock:
            self.counters[outcome] += 1
            if source is not None:
                self.by_source[source] += 1
            if namespace is not None:
                api = self.by_api.get(namespace)
                if api is None:
                    key = namespace if len(self.by_api) < MAX_TRACKED_APIS else _OTHER
                    api = self.by_api.setdefault(key, Counter())
                api[outcome] += 1

    def count_refusal(self, setting: str) -> None:
        """A request turned away by a server limit (``setting`` names it) before the layer saw it."""
        with self._lock:
            self.counters["refused"] += 1
            self.refusals[setting] += 1

    def count_failure(self, detail: str) -> None:
        with self._lock:
            detail = detail[:200]
            if detail in self.failures or len(self.failures) < MAX_TRACKED_FAILURES:
                self.failures[detail] += 1
            else:
                self.failures[_OTHER] += 1

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            out: dict[str, Any] = {
                "requests": sum(self.counters[k] for k in ("hits", "misses", "retries", "rejected", "local", "refused")),
            }
            out.update({k: self.counters[k] for k in OUTCOMES})
            out["by_source"] = dict(sorted(self.by_source.items()))
            out["refusals"] = dict(sorted(self.refusals.items()))
            out["failures"] = dict(self.failures.most_common())
            out["by_api"] = {ns: dict(c) for ns, c in sorted(self.by_api.items())}
            return out
