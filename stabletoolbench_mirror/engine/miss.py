"""The miss path: a call no cache tier answers, asked of the responders once and recorded.

``MirrorLayer.answer -> MissPath.fill``: a turn among the pending misses (``limits.max_pending_misses``),
single flight (:mod:`.singleflight` in this process, the store's ``flight_lock`` across processes and
hosts), the cache read again (another request may have recorded the call meanwhile), the responders in
order (the first usable answer wins), then the record: add-if-absent, a failure record replaced by a
usable answer, ``mode: refresh``'s write-over, or a new failure record when nobody answered.

When the store cannot be read or written, a responder's answer is still served (``unrecorded``) and the
store's health is told (:mod:`.store_health`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from stabletoolbench_mirror.core import protocol
from stabletoolbench_mirror.core.call import ToolCall
from stabletoolbench_mirror.core.fair import FairSemaphore
from stabletoolbench_mirror.core.logs import clip
from stabletoolbench_mirror.core.outcomes import Outcome, OutcomeKind
from stabletoolbench_mirror.core.records import Record, Source
from stabletoolbench_mirror.engine.responders import Attempt, Responder, wants_examples
from stabletoolbench_mirror.engine.singleflight import SingleFlight
from stabletoolbench_mirror.engine.store_health import StoreHealth
from stabletoolbench_mirror.stores import CacheTier, Store, StoreError

log = logging.getLogger(__name__)

Serve = Callable[[ToolCall, Record, OutcomeKind], Outcome]


class MissPath:
    """Fills a miss from the responders, once per call across requests, processes and hosts, and records it.

    ``lookup``, ``retries`` and ``serve`` are the layer's (:class:`~.layer.MirrorLayer`): the cache read in
    its order, whether a record is asked again, and what serving a record answers.
    """

    def __init__(
        self,
        store: Store,
        tiers: Sequence[CacheTier],
        responders: Sequence[Responder],
        *,
        save: bool,
        health: StoreHealth,
        lookup: Callable[[ToolCall], Record | None],
        retries: Callable[[Record], bool],
        serve: Serve,
        max_pending_misses: int,
        pending_timeout_s: float,
    ) -> None:
        self.store = store
        self.tiers = tuple(tiers)
        self.responders = tuple(responders)
        self.save = save
        self.health = health
        self.lookup = lookup
        self.retries = retries
        self.serve = serve
        self._wants_examples = tuple(wants_examples(r) for r in self.responders)
        self._flight: SingleFlight[Outcome] = SingleFlight()
        # misses past max_pending_misses wait for a turn: each client in its own queue, a freed turn
        # to the waiting client holding the fewest (see :mod:`.fair`)
        self.pending = FairSemaphore(max_pending_misses)
        self.pending_timeout_s = pending_timeout_s

    def fill(self, call: ToolCall, *, retried: bool) -> Outcome:
        """The answer of a miss: asked once for every identical request, which share it (``shared``).

        ``retried``: the cache held a failure record (or a record ``mode: refresh`` asks again) for the call.
        """
        # more misses than limits.max_pending_misses wait for a turn (a refusal would become a tool error)
        if not self.pending.acquire(timeout=self.pending_timeout_s):
            log.warning("a miss waited %g s for a turn; raise limits.max_pending_misses or limits.queue_timeout_s", self.pending_timeout_s)
            message = f"stabletoolbench-mirror is overloaded: a miss waited {self.pending_timeout_s:g} s for a turn (limits.max_pending_misses)"
            return replace(Outcome.error(503, message, OutcomeKind.REFUSED, "limits.max_pending_misses"), api=call.api)
        try:
            outcome, shared = self._flight.do((call.api, call.canonical), lambda: self._fill(call))
        except StoreError as exc:
            return store_error(call, exc)
        finally:
            self.pending.release()
        outcome = _as_shared(outcome) if shared else outcome
        return replace(outcome, retried=True) if retried else outcome

    def examples(self, call: ToolCall, limit: int = 20) -> list[Record]:
        """Cached answers of the same API, for few-shot simulators: the store's, then the frozen caches'."""
        found: list[Record] = []
        for tier in self.tiers:
            if len(found) >= limit:
                break
            try:
                found += [r for r in tier.sample(call.api, limit - len(found)) if not r.is_failure]
            except StoreError:
                continue
        return found

    def _fill(self, call: ToolCall) -> Outcome:
        # single flight across processes and hosts: the store's lock (a no-op for stores without
        # one); whoever waited on it then finds the answer by the re-lookup in _fill_locked
        if not self.save:
            return self._fill_locked(call)
        lock = self.store.flight_lock(call.api, call.canonical)
        try:
            lock.__enter__()
            self.health.succeeded("lock")
        except StoreError as exc:
            # the store is away: fill without the cross-process lock (the answer is served unrecorded)
            self.health.failed("lock", exc, unrecorded=False)
            return self._fill_locked(call)
        try:
            return self._fill_locked(call)
        finally:
            lock.__exit__(None, None, None)

    def _fill_locked(self, call: ToolCall) -> Outcome:
        # another request (or process) may have recorded it while this one waited
        try:
            found = self.lookup(call)
        except StoreError as exc:
            self.health.failed("read", exc, unrecorded=False)
            found = None
        if found is not None and not self.retries(found):
            return self.serve(call, found, OutcomeKind.SHARED)
        misses = _Misses()
        record = self._ask(call, misses)
        if record is None:
            return self._failed(call, found, misses)
        return self._answered(call, record, found, misses.problems)

    def _ask(self, call: ToolCall, misses: _Misses) -> Record | None:
        """The first usable answer of the responders, in order, as a record; what the others said goes to ``misses``."""
        examples: list[Record] | None = None
        for responder, wants in zip(self.responders, self._wants_examples):
            if examples is None:
                # only a few-shot simulator reads examples (a store scan per miss otherwise)
                examples = self.examples(call) if wants else None
            attempt = responder.respond(call, examples or [])
            if attempt.answer is not None and not protocol.is_encodable(attempt.answer):
                # e.g. a "\ud800" escape in a model's JSON: it can be neither stored nor served as UTF-8
                attempt = Attempt(None, attempt.origin, "answer contains a lone UTF-16 surrogate", attempt.fallback)
            if attempt.answer is None:
                log.info("%s gave no usable answer for %s: %s", responder.source, clip(call.api), clip(attempt.detail, 500))
                misses.add(responder.source, attempt)
                continue
            return Record.from_answer(call.api, call.key, attempt.answer, responder.source, attempt.origin, attempt.meta)
        return None

    def _answered(self, call: ToolCall, record: Record, found: Record | None, problems: list[str]) -> Outcome:
        """A usable answer recorded: new, or over the store's own record of this very key (keeping its provenance)."""
        if found is None or found.key != call.key or found.source == "frozen":
            return self._record(call, record, OutcomeKind.RECORDED, problems)
        record = replace(record, replaced=found.provenance())
        if not found.is_failure:  # mode: refresh, the store's usable record of this very key
            return self._refreshed(call, record, problems)
        return self._record(call, record, OutcomeKind.REPLACED, problems)

    def _record(self, call: ToolCall, record: Record, kind: OutcomeKind, problems: list[str]) -> Outcome:
        """Store a usable answer (unless ``save`` is off) and serve what the store holds for the key."""

        def add() -> tuple[Record, OutcomeKind]:
            if self.store.add(record, call.canonical):
                return record, kind
            # another process recorded first: everyone serves that one
            return self.store.get(call.api, call.key) or record, OutcomeKind.SHARED

        return self._written(call, record, kind, problems, add, "a usable answer replaced the failure record of")

    def _refreshed(self, call: ToolCall, record: Record, problems: list[str]) -> Outcome:
        """``mode: refresh``: write the new answer over the record (unless ``save`` is off) and serve it."""

        def write_over() -> tuple[Record, OutcomeKind]:
            self.store.replace(record, call.canonical)
            return record, OutcomeKind.REPLACED

        return self._written(call, record, OutcomeKind.REPLACED, problems, write_over, "refresh: a new answer replaced the record of")

    def _written(self, call: ToolCall, record: Record, kind: OutcomeKind, problems: list[str],
                 write: Callable[[], tuple[Record, OutcomeKind]], replaced_note: str) -> Outcome:
        """Serve ``record`` as ``kind`` after ``write`` (what it serves, and as what), unless ``save`` is off
        (``recorded``, nothing written) or the store fails (``unrecorded``, the store's health told)."""
        if not self.save:
            kind = OutcomeKind.RECORDED
        else:
            try:
                record, kind = write()
                self.health.succeeded("write")
            except StoreError as exc:
                self.health.failed("write", exc, unrecorded=True)
                kind = OutcomeKind.UNRECORDED
        if kind is OutcomeKind.REPLACED:
            log.info("%s %s key=%s", replaced_note, clip(call.api), clip(call.key))
        return replace(self.serve(call, record, kind), problems=tuple(problems))

    def _failed(self, call: ToolCall, found: Record | None, misses: _Misses) -> Outcome:
        """No usable answer: serve, and record, a failure.

        A failure record found for the call is served again unchanged (every observation of the
        call in a run is then what a replay serves); otherwise the fallback answer (else the miss
        error) is served and recorded as a new failure record.
        """
        problems = tuple(misses.problems)
        if found is not None and not found.is_failure:
            # mode: refresh asked a usable record's call again and got nothing usable: the record is served
            return replace(self.serve(call, found, OutcomeKind.HIT), problems=problems)
        if found is not None:
            return replace(self.serve(call, found, OutcomeKind.FAILED), source=None, problems=problems)
        record = misses.failure_record(call)
        written = False
        if self.save:
            try:
                written = self.store.add(record, call.canonical)
                if not written:
                    stored = self.store.get(call.api, call.key)
                    if stored is not None and not stored.is_failure:
                        # another process recorded a usable answer meanwhile: serve it
                        return replace(self.serve(call, stored, OutcomeKind.SHARED), problems=problems)
                    record = stored or record
                self.health.succeeded("write")
            except StoreError as exc:
                self.health.failed("write", exc, unrecorded=True)
        # a new failure is no answer from a source (``by_source`` counts answers)
        return replace(self.serve(call, record, OutcomeKind.FAILED), source=None, problems=problems, new_failure_record=written)


def store_error(call: ToolCall, exc: StoreError) -> Outcome:
    """The answer when the store cannot be read and nothing else answers: HTTP 503, ``store_error``."""
    log.error("store error for %s: %s", clip(call.api), clip(exc, 500))
    outcome = Outcome.error(503, f"stabletoolbench-mirror: the response store is unavailable: {exc}", OutcomeKind.STORE_ERROR)
    return replace(outcome, api=call.api)


@dataclass
class _Misses:
    """What the responders asked for one miss said when they gave no usable answer (a failure record's provenance)."""

    problems: list[str] = field(default_factory=list)
    """``<source>: <why>``, in order."""
    tried: list[tuple[Source, str]] = field(default_factory=list)
    """``(source, origin)`` of each responder asked, in order."""
    fallback: Any = None
    """The last answer a responder offered to serve unrecorded (e.g. the real API's own error answer)."""
    fallback_by: tuple[Source, str] | None = None

    def add(self, source: Source, attempt: Attempt) -> None:
        self.problems.append(f"{source}: {attempt.detail}")
        self.tried.append((source, attempt.origin))
        if attempt.fallback is not None and protocol.is_encodable(attempt.fallback):
            self.fallback, self.fallback_by = attempt.fallback, (source, attempt.origin)

    def failure_record(self, call: ToolCall) -> Record:
        """The new failure record: the fallback answer (else the miss error), from whoever offered it (else the last asked)."""
        fallback = self.fallback
        if fallback is None:
            fallback = protocol.miss_answer(call.api, "the real API and the simulator gave no usable answer")
        source, origin = self.fallback_by or (self.tried[-1] if self.tried else ("simulated", ""))
        return Record.failure(
            call.api, call.key, fallback, source, origin,
            reason="; ".join(self.problems) or "no responder answered",
            tried=tuple(f"{by}:{name}" for by, name in self.tried),
        )


def _as_shared(outcome: Outcome) -> Outcome:
    """What a request that waited on another's miss gets: its answer, counted as ``shared``.

    Failures stay ``failed`` (the waiter was served a failure too); the reasons are counted
    with the request that asked the responders.
    """
    if outcome.kind in (OutcomeKind.RECORDED, OutcomeKind.SHARED, OutcomeKind.REPLACED, OutcomeKind.UNRECORDED):
        return replace(outcome, kind=OutcomeKind.SHARED, problems=())
    return replace(outcome, problems=(), new_failure_record=False)
