"""Counters behind ``GET /stats`` and ``GET /metrics``.

Every ``/virtual`` request ends in exactly one :class:`~.outcomes.OutcomeKind`, and
:meth:`Stats.count` is called once per request, by the server, with that final outcome.
So the outcome counters add up to ``requests``.  ``misses`` is not a counter of its own:
it is the sum of the outcomes of requests that missed the cache (``recorded``,
``shared``, ``failed``, ``unanswered``, ``replaced``, ``unrecorded``; a failure record tried
again counts as a miss too).  ``refusals`` counts the ``refused`` requests by the setting
whose limit turned them away; ``failures`` the reasons responders gave no usable answer
(once per responder call, not per request that shared it).  Beside the outcomes:
``failure_records`` (new failure records written), ``failure_hits`` (hits that served a
failure record) and ``retries`` (requests that tried a failure record again); ``faults`` the
injected faults served, by kind (``faults:``, see :mod:`.faults`).

The counts live in prometheus-client counters (:mod:`.metrics`): with ``serve --workers N``
every worker adds to files in one shared folder, so ``/stats`` and ``/metrics`` show the sum
over all workers whichever worker answers the read.
"""

from __future__ import annotations

import threading
from typing import Any

from stabletoolbench_mirror.core.outcomes import Outcome, OutcomeKind
from stabletoolbench_mirror.engine.metrics import Counters

MAX_TRACKED_APIS = 10_000
#: API names are client text: the per-API table is also bounded by their total size
MAX_TRACKED_API_BYTES = 4 * 1024 * 1024
#: models counted under their own name in ``model_calls`` (their own table: a flood of made-up model names
#: never pushes tool APIs into ``(other)``), and their names' total size
MAX_TRACKED_MODELS = 1_000
MAX_TRACKED_MODEL_BYTES = 256 * 1024
#: the model-call outcomes that let a model's name into the table (it answered, or an upstream was asked for it)
MODEL_NAMED_OUTCOMES = frozenset({"hit", "recorded", "replaced"})
MAX_TRACKED_FAILURES = 200
MAX_FAILURE_CHARS = 200
_OTHER = "(other)"
#: the model of a call that named none (a request refused before its body was read, or not a request)
_NONE = "(none)"

#: the ``/stats`` name of each outcome's counter
COUNTER_NAMES: dict[OutcomeKind, str] = {
    OutcomeKind.HIT: "hits",
    OutcomeKind.RECORDED: "recorded",
    OutcomeKind.SHARED: "shared",
    OutcomeKind.FAILED: "failed",
    OutcomeKind.REPLACED: "replaced",
    OutcomeKind.UNRECORDED: "unrecorded",
    OutcomeKind.UNANSWERED: "unanswered",
    OutcomeKind.LOCAL: "local",
    OutcomeKind.REJECTED: "rejected",
    OutcomeKind.REFUSED: "refused",
    OutcomeKind.STORE_ERROR: "store_errors",
    OutcomeKind.ERROR: "errors",
}
MISSES = "misses"
#: failure-record counts beside the outcomes (each request adds to at most one of each)
FAILURE_EVENTS = ("failure_records", "failure_hits", "retries")


class _Names:
    """Names counted under their own label while there is room (at most ``limit`` of them, ``max_bytes`` of UTF-8
    together); any other is ``(other)``.  A name in is in for good, and is found without the lock."""

    def __init__(self, limit: int, max_bytes: int) -> None:
        self.limit = limit
        self.max_bytes = max_bytes
        self._names: set[str] = set()
        self._bytes = 0
        self._lock = threading.Lock()

    def __contains__(self, name: str) -> bool:
        return name in self._names

    def label(self, name: str) -> str:
        if name in self._names:
            return name
        size = len(name.encode("utf-8", "surrogatepass"))
        with self._lock:
            if len(self._names) < self.limit and self._bytes + size <= self.max_bytes:
                self._names.add(name)
                self._bytes += size
                return name
        return _OTHER


class Stats:
    """Thread-safe counters; per-API and per-failure tables are capped (count and size) so random input cannot grow them.

    The caps hold per process: this process tracks an API or a failure reason under its own
    name while there is room, and counts the rest as ``(other)``.
    """

    def __init__(self) -> None:
        self.counters = Counters()
        self._apis = _Names(MAX_TRACKED_APIS, MAX_TRACKED_API_BYTES)
        self._models = _Names(MAX_TRACKED_MODELS, MAX_TRACKED_MODEL_BYTES)
        # a reason is cut to MAX_FAILURE_CHARS first: the count bounds their size
        self._failures = _Names(MAX_TRACKED_FAILURES, MAX_TRACKED_FAILURES * MAX_FAILURE_CHARS * 4)
        self._plain: dict[tuple[OutcomeKind, str | None, str | None], tuple[Any, ...]] = {}

    def _model_label(self, model: str, name_it: bool) -> str:
        """``model``'s name in the model table while it has room, when it is there already or ``name_it``; else ``(other)``."""
        if model in self._models or model == _NONE:
            return model
        return self._models.label(model) if name_it else _OTHER

    def count(self, outcome: Outcome) -> None:
        """Count one finished request by its final outcome (call it exactly once per request)."""
        # its three counters (outcome, source, API), looked up once per (kind, source, api)
        plain = (outcome.kind, outcome.source, outcome.api)
        incs = self._plain.get(plain)
        if incs is None:
            incs = self._plain_counters(plain)
        for inc in incs:
            inc()
        counters = self.counters
        if outcome.limit is not None:
            counters.inc("refusals", outcome.limit)
        for problem in outcome.problems:
            counters.inc("failures", self._failures.label(problem[:MAX_FAILURE_CHARS]))
        if outcome.retried:
            counters.inc("records", "retries")
        if outcome.new_failure_record:
            counters.inc("records", "failure_records")
        if outcome.failure and outcome.kind is OutcomeKind.HIT:
            counters.inc("records", "failure_hits")
        if outcome.fault is not None:
            counters.inc("faults", outcome.fault)

    def _plain_counters(self, plain: tuple[OutcomeKind, str | None, str | None]) -> tuple[Any, ...]:
        """The ``inc`` of each of the three counters every request adds to (kept while there is room)."""
        kind, source, api = plain
        counters = self.counters
        incs = [counters.incrementer("requests", kind.value)]
        if source is not None:
            incs.append(counters.incrementer("sources", source))
        if api is not None:
            incs.append(counters.incrementer("apis", self._apis.label(api), kind.value))
        found = tuple(incs)
        if len(self._plain) < 1024:  # bounded: API names are client text
            self._plain[plain] = found
        return found

    def count_model(self, model: str, outcome: str, prompt_tokens: int = 0, completion_tokens: int = 0, asked: bool = False) -> None:
        """Count one model call (``/v1``) by its outcome, and the upstream's tokens when it was asked.

        A model is counted under its name once it answered or an upstream was asked for it (while the model
        table has room: :data:`MAX_TRACKED_MODELS`); a call of a model never answered (a made-up name, a
        replay miss) counts under ``(other)`` until it is.
        """
        label = self._model_label(model, asked or outcome in MODEL_NAMED_OUTCOMES)
        counters = self.counters
        counters.inc("model_requests", label, outcome)
        if asked:
            counters.inc("model_upstream", label)
        if prompt_tokens:
            counters.inc("model_tokens", label, "prompt", amount=prompt_tokens)
        if completion_tokens:
            counters.inc("model_tokens", label, "completion", amount=completion_tokens)

    def model_tokens_spent(self) -> int:
        """Prompt and completion tokens of every upstream answer so far (every worker together)."""
        return int(sum(self.counters.totals()["model_tokens"].values()))

    def model_snapshot(self, totals: dict[str, dict[tuple[str, ...], float]] | None = None) -> dict[str, dict[str, int]]:
        """``/stats``'s ``model_calls``: by model, ``requests``, each outcome, ``upstream_calls``, ``prompt_tokens``, ``completion_tokens``."""
        totals = totals if totals is not None else self.counters.totals()
        out: dict[str, dict[str, int]] = {}

        def row(model: str) -> dict[str, int]:
            return out.setdefault(model, {"requests": 0, "hits": 0, "upstream_calls": 0, "prompt_tokens": 0, "completion_tokens": 0})

        for (model, outcome), n in sorted(totals["model_requests"].items()):
            r = row(model)
            r["requests"] += int(n)
            name = "hits" if outcome == "hit" else outcome
            r[name] = r.get(name, 0) + int(n)
        for (model,), n in totals["model_upstream"].items():
            row(model)["upstream_calls"] += int(n)
        for (model, kind), n in totals["model_tokens"].items():
            row(model)[f"{kind}_tokens"] += int(n)
        return out

    def count_event(self, group: str, event: str) -> None:
        """A responder's own event (``simulator``: ``parse_retries``; ``shadow``: ``shadow_recorded``, ...)."""
        self.counters.inc("events", group, event)

    def event_totals(self) -> dict[str, dict[str, int]]:
        """The responders' events of every worker together, by group."""
        out: dict[str, dict[str, int]] = {}
        for (group, event), n in self.counters.totals()["events"].items():
            out.setdefault(group, {})[event] = int(n)
        return out

    def snapshot(self) -> dict[str, Any]:
        """The counts of every worker together, in ``/stats``'s shape."""
        totals = self.counters.totals()
        by_kind = {OutcomeKind(labels[0]): int(n) for labels, n in totals["requests"].items() if labels[0] in _KINDS}
        counters = {name: by_kind.get(kind, 0) for kind, name in COUNTER_NAMES.items()}
        out: dict[str, Any] = {"requests": sum(counters.values())}
        out.update(counters)
        out[MISSES] = sum(n for kind, n in by_kind.items() if kind.is_miss)
        events = {labels[0]: int(n) for labels, n in totals["records"].items()}
        out.update({event: events.get(event, 0) for event in FAILURE_EVENTS})
        out["by_source"] = {labels[0]: int(n) for labels, n in sorted(totals["sources"].items())}
        out["refusals"] = {labels[0]: int(n) for labels, n in sorted(totals["refusals"].items())}
        failures = sorted(totals["failures"].items(), key=lambda item: (-item[1], item[0]))
        out["failures"] = {labels[0]: int(n) for labels, n in failures}
        out["faults"] = {labels[0]: int(n) for labels, n in sorted(totals["faults"].items())}
        out["by_api"] = _by_api(totals["apis"])
        out["model_calls"] = self.model_snapshot(totals)
        return out

    def exposition(self) -> bytes:
        """``GET /metrics``: every counter in the Prometheus text format (all workers summed)."""
        return self.counters.exposition()


_KINDS = frozenset(kind.value for kind in OutcomeKind)


def _by_api(apis: dict[tuple[str, ...], float]) -> dict[str, dict[str, int]]:
    """``/stats``'s ``by_api`` table from the ``apis`` counter's totals (API, outcome kind): each API's counts by name."""
    by_api: dict[str, dict[str, int]] = {}
    for (api, kind_value), n in sorted(apis.items()):
        if kind_value not in _KINDS or not n:
            continue
        kind = OutcomeKind(kind_value)
        per_api = by_api.setdefault(api, {})
        per_api[COUNTER_NAMES[kind]] = per_api.get(COUNTER_NAMES[kind], 0) + int(n)
        if kind.is_miss:
            per_api[MISSES] = per_api.get(MISSES, 0) + int(n)
    return by_api


class LocalEvents:
    """Responder events counted in this process only (a responder used without a server's :class:`Stats`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, str], int] = {}

    def count_event(self, group: str, event: str) -> None:
        with self._lock:
            self._counts[(group, event)] = self._counts.get((group, event), 0) + 1

    def event_totals(self) -> dict[str, dict[str, int]]:
        with self._lock:
            out: dict[str, dict[str, int]] = {}
            for (group, event), n in self._counts.items():
                out.setdefault(group, {})[event] = n
            return out


def event_section(sink: Any, group: str, events: tuple[str, ...]) -> dict[str, dict[str, int]]:
    """``{group: {event: count}}`` from ``sink``'s totals, every event of ``events`` present (0 when none)."""
    counted = sink.event_totals().get(group, {})
    return {group: {event: counted.get(event, 0) for event in events}}
