"""The request path: cache layers, then the real API and the simulator, then the record.

``server -> MirrorLayer.handle -> (store, frozen caches) -> (real API, simulator) -> store.add``
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
from dataclasses import dataclass
from typing import Any, Sequence

from pydantic import ValidationError

from . import protocol
from .call import ToolCall
from .config import Settings
from .naming import resolve_names
from .protocol import ToolInputParseError, VirtualRequest, parse_tool_input
from .records import Record
from .responders import Attempt, Responder
from .singleflight import SingleFlight
from .stats import Stats
from .store_health import StoreHealth
from .stores import FrozenCache, Store, StoreError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Outcome:
    """What the layer answers: the JSON text to serve, its HTTP status and how it was produced."""

    body: str
    kind: str
    """``hit``, ``recorded``, ``replaced`` (a usable answer replaced a failure record), ``failed``,
    ``unrecorded`` (an answer served that the store could not record), ``unanswered``, ``local``,
    ``rejected``, ``overloaded`` or ``store_error``."""
    status: int = 200
    source: str | None = None
    """For ``hit`` and ``recorded``: ``real``, ``simulated`` or ``imported``."""
    origin: str = ""
    failure: bool = False
    """The body is a failure (a failure record, or a miss that ended without a usable answer)."""

    @property
    def answer(self) -> Any:
        return json.loads(self.body)


class MirrorLayer:
    """Answers StableToolBench calls from the cache, the real API or the simulator, and records them."""

    def __init__(
        self,
        store: Store,
        *,
        mode: str = "record",
        frozen: Sequence[FrozenCache] = (),
        responders: Sequence[Responder] = (),
        save: bool = True,
        retry_failures: bool = True,
        max_pending_misses: int = 256,
        pending_timeout_s: float = 600.0,
        stats: Stats | None = None,
    ) -> None:
        if mode not in ("replay", "record"):
            raise ValueError(f"unknown mode {mode!r}")
        self.store = store
        self.mode = mode
        self.frozen = list(frozen)
        self.responders = list(responders)
        self.save = save
        self.retry_failures = retry_failures
        self.stats = stats or Stats()
        self.health = StoreHealth()
        self._flight: SingleFlight[Outcome] = SingleFlight()
        self._pending = threading.BoundedSemaphore(max_pending_misses)
        self.pending_timeout_s = pending_timeout_s

    @classmethod
    def from_settings(cls, settings: Settings, *, store: Store | None = None) -> "MirrorLayer":
        from .factory import build_responders, build_store

        return cls(
            store if store is not None else build_store(settings),
            mode=settings.mode,
            frozen=[FrozenCache(settings.resolve(p)) for p in settings.frozen_caches],
            responders=build_responders(settings),
            save=settings.save,
            retry_failures=settings.record.retry_failures,
            max_pending_misses=settings.limits.max_pending_misses,
            pending_timeout_s=settings.limits.queue_timeout_s,
        )

    # -- entry points -------------------------------------------------------------------------

    def handle_payload(self, payload: Any) -> Outcome:
        """Answer a decoded JSON ``/virtual`` body (the whole path, blocking)."""
        prepared = self.prepare(payload)
        return prepared if isinstance(prepared, Outcome) else self.handle_call(prepared)

    def handle(self, request: VirtualRequest) -> Outcome:
        """Answer one validated ``/virtual`` request (the whole path, blocking)."""
        prepared = self._prepare_request(request)
        return prepared if isinstance(prepared, Outcome) else self.handle_call(prepared)

    def prepare(self, payload: Any) -> ToolCall | Outcome:
        """Validate a decoded body into a :class:`ToolCall`, or the final answer when none is needed.

        Final answers (counted here): HTTP 422 for an invalid body, upstream's
        ``Tool input parse error...`` and ``chat_with_user`` answers.  Cheap: no I/O.
        """
        try:
            request = VirtualRequest.model_validate(payload)
        except ValidationError as exc:
            self.stats.count("rejected")
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in exc.errors(include_url=False)
            )
            return _rejected(422, f"invalid /virtual request: {problems}")
        return self._prepare_request(request)

    def _prepare_request(self, request: VirtualRequest) -> ToolCall | Outcome:
        names = resolve_names(request.category, request.tool_name, request.api_name)
        # upstream answers chat_with_user before it parses the input
        if names.api == protocol.CHAT_WITH_USER_API:
            self.stats.count("local")
            return Outcome(protocol.encode_answer(protocol.chat_with_user_answer()), "local")
        try:
            tool_input = parse_tool_input(request.tool_input)
        except ToolInputParseError:
            self.stats.count("rejected")
            return Outcome(protocol.encode_answer(protocol.parse_error_answer()), "rejected")
        return ToolCall.build(request, tool_input, names)

    @property
    def lookups_are_local(self) -> bool:
        """Whether a cache lookup is cheap enough to run on the server's event loop (no network I/O)."""
        return self.store.is_local

    def cached(self, call: ToolCall) -> Outcome | None:
        """The cached answer as a counted hit, or ``None`` (nothing counted) when it is not cached or the store fails."""
        try:
            record = self.lookup(call)
        except StoreError:
            return None
        if record is None or self.retries(record):
            return None
        return self._hit(call, record)

    async def cached_async(self, call: ToolCall) -> Outcome | None:
        """:meth:`cached` for stores read over the network (Redis): the store is read on the event loop.

        ``None`` (nothing counted) when the store has no async reads, the answer is not cached,
        or the store fails (the full path then answers, with the store's error if it persists).
        """
        store = self.store
        if not store.reads_async:
            return None
        try:
            record = await self._lookup_async(call)
        except StoreError:
            return None
        if record is None or self.retries(record):
            return None
        return self._hit(call, record)

    @property
    def fills(self) -> bool:
        """Whether a miss may be answered by the real API or the simulator (``record`` mode, with one configured)."""
        return self.mode == "record" and bool(self.responders)

    def retries(self, record: Record) -> bool:
        """Whether ``record`` is a failure record this layer tries again (``record.retry_failures``)."""
        return record.is_failure and self.retry_failures and self.fills

    def settled(self, call: ToolCall) -> bool:
        """Whether the cache holds an answer for ``call`` that ``record`` mode would not try again
        (``warm`` skips those calls): a usable answer, or a failure record without ``retry_failures``."""
        record = self.lookup(call)
        return record is not None and not (record.is_failure and self.retry_failures)

    def handle_call(self, call: ToolCall) -> Outcome:
        """Answer ``call``: the cache, else the real API and the simulator (single flight), recorded.

        A failure record is served like any record, except in ``record`` mode with
        ``retry_failures``, where the call is tried again.  When the store cannot be read or
        written, a miss that a responder answers is still served (``unrecorded``).
        """
        try:
            record = self.lookup(call)
            self.health.succeeded("read")
        except StoreError as exc:
            if not self.fills:
                return self._store_error(call, exc)
            self.health.failed("read", exc, unrecorded=False)
            record = None
        if record is not None and not self.retries(record):
            return self._hit(call, record)
        self.stats.count("retries" if record is not None else "misses", call.namespace)
        if self.mode == "replay" or not self.responders:
            reason = "replay mode" if self.mode == "replay" else "no real API or simulator configured"
            log.info("miss %s key=%s (%s)", call.namespace, call.key[:500], reason)
            self.stats.count("unanswered", call.namespace)
            return Outcome(protocol.encode_answer(protocol.miss_answer(call.namespace, reason)), "unanswered")
        # more misses than limits.max_pending_misses wait for a turn (a refusal would become a tool error)
        if not self._pending.acquire(timeout=self.pending_timeout_s):
            self.stats.count_failure("overloaded: waited limits.queue_timeout_s for a miss turn")
            log.warning("a miss waited %g s for a turn; raise limits.max_pending_misses or limits.queue_timeout_s", self.pending_timeout_s)
            return _rejected(
                503, f"stabletoolbench-mirror is overloaded: a miss waited {self.pending_timeout_s:g} s for a turn (limits.max_pending_misses)", "overloaded"
            )
        try:
            outcome, _shared = self._flight.do((call.namespace, call.canonical), lambda: self._fill(call))
        except StoreError as exc:
            return self._store_error(call, exc)
        finally:
            self._pending.release()
        return outcome

    # -- the parts ----------------------------------------------------------------------------

    def lookup(self, call: ToolCall) -> Record | None:
        """The cached record of ``call``: exact upstream key first, then the canonical key.

        In each step the store comes before the frozen caches (in their listed order).  The first
        usable answer wins; a failure record is returned only when no tier has a usable answer
        for the call, so a failure never hides an answer recorded for the same call.
        """
        record = self.store.get(call.namespace, call.key) or self._frozen_exact(call)
        if record is not None and not record.is_failure:
            return record
        return _prefer_answer(record, self._canonical(call, self.store.get_canonical(call.namespace, call.canonical)))

    async def _lookup_async(self, call: ToolCall) -> Record | None:
        """:meth:`lookup` with the store read through its async client (same order)."""
        record = await self.store.aget(call.namespace, call.key) or self._frozen_exact(call)
        if record is not None and not record.is_failure:
            return record
        return _prefer_answer(record, self._canonical(call, await self.store.aget_canonical(call.namespace, call.canonical)))

    def _canonical(self, call: ToolCall, stored: Record | None) -> Record | None:
        if stored is not None and not stored.is_failure:
            return stored
        return _prefer_answer(stored, self._frozen_canonical(call))

    def _frozen_exact(self, call: ToolCall) -> Record | None:
        found: Record | None = None
        for frozen in self.frozen:
            found = _prefer_answer(found, frozen.get(call.namespace, call.key))
            if found is not None and not found.is_failure:
                break
        return found

    def _frozen_canonical(self, call: ToolCall) -> Record | None:
        found: Record | None = None
        for frozen in self.frozen:
            found = _prefer_answer(found, frozen.get_canonical(call.namespace, call.canonical))
            if found is not None and not found.is_failure:
                break
        return found

    def examples(self, call: ToolCall, limit: int = 20) -> list[Record]:
        """Cached answers of the same API, for few-shot simulators: the store's, then the frozen caches'."""
        try:
            found = [r for r in self.store.sample(call.namespace, limit) if not r.is_failure]
        except StoreError:
            found = []
        for frozen in self.frozen:
            if len(found) >= limit:
                break
            found += frozen.sample(call.namespace, limit - len(found))
        return found

    def _fill(self, call: ToolCall) -> Outcome:
        # single flight across processes and hosts: the store's lock (a no-op for stores without
        # one); whoever waited on it then finds the answer by the re-lookup in _fill_locked
        if not self.save:
            return self._fill_locked(call)
        try:
            lock = self.store.flight_lock(call.namespace, call.canonical)
            lock.__enter__()
            self.health.succeeded("lock")
        except StoreError as exc:
            # the store is away: answer without the cross-process lock (and without recording)
            self.health.failed("lock", exc, unrecorded=False)
            return self._fill_locked(call)
        try:
            return self._fill_locked(call)
        finally:
            lock.__exit__(None, None, None)

    def _fill_locked(self, call: ToolCall) -> Outcome:
        # another request (or process) may have recorded it while this one waited
        try:
            record = self.lookup(call)
        except StoreError as exc:
            self.health.failed("read", exc, unrecorded=False)
            record = None
        if record is not None and not self.retries(record):
            return _served(record, "hit")
        failure = record
        fallback: Any = None
        fallback_by: tuple[str, str] | None = None
        tried: list[tuple[str, str, str]] = []
        examples: list[Record] | None = None
        for responder in self.responders:
            if examples is None:
                # only a few-shot simulator reads examples (a store scan per miss otherwise)
                wants = responder.source == "simulated" and getattr(responder, "wants_examples", True)
                examples = self.examples(call) if wants else None
            attempt = responder.respond(call, examples or [])
            if attempt.answer is not None and not protocol.is_encodable(attempt.answer):
                # e.g. a "\ud800" escape in a model's JSON: it can be neither stored nor served as UTF-8
                attempt = Attempt(None, attempt.origin, "answer contains a lone UTF-16 surrogate", attempt.fallback)
            if attempt.answer is None:
                log.info("%s gave no usable answer for %s: %s", responder.source, call.namespace, attempt.detail)
                self.stats.count_failure(f"{responder.source}: {attempt.detail}")
                tried.append((responder.source, attempt.origin, attempt.detail))
                if attempt.fallback is not None and protocol.is_encodable(attempt.fallback):
                    fallback, fallback_by = attempt.fallback, (responder.source, attempt.origin)
                continue
            record = Record.from_answer(call.namespace, call.key, attempt.answer, responder.source, attempt.origin)
            if failure is not None and failure.key == call.key and not failure.origin.startswith("frozen:"):
                # the store's failure record of this very key: the answer replaces it, keeping its provenance
                return self._record(call, dataclasses.replace(record, replaced=failure.provenance()), "replaced")
            return self._record(call, record, "recorded")
        return self._failed(call, failure, fallback, fallback_by, tried)

    def _record(self, call: ToolCall, record: Record, kind: str) -> Outcome:
        """Store a usable answer (unless ``save`` is off) and serve what the store holds for the key."""
        if not self.save:
            kind = "recorded"
        else:
            try:
                if not self.store.add(record, call.canonical):
                    # someone else recorded first: everyone serves that one
                    record = self.store.get(call.namespace, call.key) or record
                    kind = "recorded"
                self.health.succeeded("write")
            except StoreError as exc:
                self.health.failed("write", exc, unrecorded=True)
                kind = "unrecorded"
        if kind == "replaced":
            log.info("a usable answer replaced the failure record of %s key=%s", call.namespace, call.key[:200])
            self.stats.count("replaced", call.namespace)
        self.stats.count("recorded" if kind != "unrecorded" else "unrecorded", call.namespace, record.source)
        return _served(record, kind)

    def _failed(
        self, call: ToolCall, failure: Record | None, fallback: Any, fallback_by: tuple[str, str] | None, tried: list[tuple[str, str, str]]
    ) -> Outcome:
        """No usable answer: serve (and record) a failure.

        A failure record found for the call is served again unchanged (so the run replays
        exactly what it saw); otherwise the fallback answer (else the miss error) is served and
        recorded as a new failure record.
        """
        self.stats.count("failed", call.namespace)
        if failure is not None:
            return Outcome(failure.body, "failed", source=failure.source, origin=failure.origin, failure=True)
        if fallback is None:
            fallback = protocol.miss_answer(call.namespace, "the real API and the simulator gave no usable answer")
        if fallback_by is not None:
            source, origin = fallback_by
        else:
            source, origin = (tried[-1][0], tried[-1][1]) if tried else ("simulated", "")
        reason = "; ".join(f"{src}: {detail}" for src, _origin, detail in tried) or "no responder answered"
        record = Record.failure(
            call.namespace, call.key, fallback, source, origin,  # type: ignore[arg-type]
            reason=reason, tried=tuple(f"{src}:{org}" for src, org, _detail in tried),
        )
        if self.save:
            try:
                if not self.store.add(record, call.canonical):
                    stored = self.store.get(call.namespace, call.key)
                    if stored is not None and not stored.is_failure:
                        # a usable answer was recorded meanwhile (another process): serve it
                        return _served(stored, "hit")
                    record = stored or record
                else:
                    self.stats.count("failure_records", call.namespace)
                self.health.succeeded("write")
            except StoreError as exc:
                self.health.failed("write", exc, unrecorded=True)
                self.stats.count("unrecorded", call.namespace)
        return Outcome(record.body, "failed", source=record.source, origin=record.origin, failure=True)

    def _hit(self, call: ToolCall, record: Record) -> Outcome:
        """A counted cache hit."""
        self.stats.count("hits", call.namespace, record.source)
        if record.is_failure:
            self.stats.count("failure_hits", call.namespace)
        return _served(record, "hit")

    def _store_error(self, call: ToolCall, exc: StoreError) -> Outcome:
        log.error("store error for %s: %s", call.namespace, exc)
        self.stats.count("store_errors", call.namespace)
        return _rejected(503, f"stabletoolbench-mirror: the response store is unavailable: {exc}", "store_error")

    def close(self) -> None:
        for responder in self.responders:
            responder.close()
        self.store.close()


def _prefer_answer(first: Record | None, second: Record | None) -> Record | None:
    """``first`` unless it is missing or a failure record and ``second`` is something better."""
    if first is None:
        return second
    if first.is_failure and second is not None and not second.is_failure:
        return second
    return first


def _served(record: Record, kind: str) -> Outcome:
    return Outcome(record.body, kind, source=record.source, origin=record.origin, failure=record.is_failure)


def _rejected(status: int, message: str, kind: str = "rejected") -> Outcome:
    return Outcome(protocol.encode_answer(protocol.answer(message, "")), kind, status=status)
