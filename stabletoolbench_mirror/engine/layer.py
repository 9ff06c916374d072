"""The request path: the cache tiers, then the real API and the simulator, then the record.

``server -> MirrorLayer.prepare -> MirrorLayer.answer_async: lookup (store, frozen caches) -> MissPath.fill (real API, simulator) -> store.add``

This module prepares a call and looks it up; a miss goes on in :mod:`.miss` (single flight, the
responders, the record).

A call to a local tool (``local_tools``) skips the lookup: the tool always runs, and its answer
is recorded.  A call inside a session (``X-STM-Session``) takes the same path through
:meth:`MirrorLayer.handle_call`, with the session's history hash in its keys and the session's
state for local tools (see :mod:`.sessions`).

With ``record.served_store`` set, every record served (whichever tier answered) is also copied
into a store of its own (:mod:`.served_copies`), so one run's answers can be replayed from it alone.

A failure record (a miss that ended without a usable answer, recorded as served) is served like
any record, except in ``record`` mode with ``record.retry_failures``, where the call is tried
again; a usable answer for the same call always wins over a failure.  When the store cannot be
read or written, a miss a responder answers is still served (``unrecorded``) and ``/health``
says ``degraded`` (:mod:`.store_health`).

The layer returns an :class:`~.outcomes.Outcome` and counts nothing: the server counts each
request once, from its final outcome.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread
from pydantic import ValidationError

from stabletoolbench_mirror.config import Mode
from stabletoolbench_mirror.core import protocol
from stabletoolbench_mirror.core.call import ToolCall
from stabletoolbench_mirror.core.logs import clip
from stabletoolbench_mirror.core.model_calls import MODEL_CATEGORY
from stabletoolbench_mirror.core.naming import resolve_names
from stabletoolbench_mirror.core.outcomes import Outcome, OutcomeKind
from stabletoolbench_mirror.core.protocol import ToolInputParseError, VirtualRequest, parse_tool_input
from stabletoolbench_mirror.core.records import Record
from stabletoolbench_mirror.engine.local_tools import LocalTool, LocalTools
from stabletoolbench_mirror.engine.lookup_order import lookup_order
from stabletoolbench_mirror.engine.miss import MissPath, store_error
from stabletoolbench_mirror.engine.recent_hits import RecentHits
from stabletoolbench_mirror.engine.refresh import RefreshScope
from stabletoolbench_mirror.engine.responders import CountsEvents, Responder
from stabletoolbench_mirror.engine.served_copies import ServedCopies
from stabletoolbench_mirror.engine.sessions import SessionError, Sessions
from stabletoolbench_mirror.engine.stats import Stats
from stabletoolbench_mirror.engine.store_health import StoreHealth
from stabletoolbench_mirror.stores import CacheTier, FrozenCache, Store, StoreError

if TYPE_CHECKING:
    from stabletoolbench_mirror.engine.faults import FaultPlan

log = logging.getLogger(__name__)

#: what an unanswered miss says, in ``replay`` mode and in ``record`` mode with nothing to fill it: one text true of
#: both (a run recorded with nothing to fill a miss replays byte for byte), never "replay mode" in record mode
UNFILLED_MISS = "not in the caches, and this server fills no miss: replay mode, or neither the real API nor the simulator enabled"


class MirrorLayer:
    """Answers StableToolBench calls from the cache tiers, the real API or the simulator, and records them.

    Built by :func:`stabletoolbench_mirror.factory.build_layer` from the settings.
    """

    def __init__(
        self,
        store: Store,
        *,
        mode: Mode | str = Mode.RECORD,
        frozen: Sequence[FrozenCache] = (),
        responders: Sequence[Responder] = (),
        save: bool = True,
        retry_failures: bool = True,
        max_pending_misses: int = 256,
        pending_timeout_s: float = 600.0,
        sessions: Sessions | None = None,
        local_tools: LocalTools | None = None,
        faults: FaultPlan | None = None,
        refresh: RefreshScope | None = None,
        served: ServedCopies | None = None,
    ) -> None:
        self.mode = Mode(mode)
        self.store = store
        self.frozen = tuple(frozen)
        self.tiers: tuple[CacheTier, ...] = (store, *self.frozen)
        """The cache tiers in lookup order: the store, then the frozen caches as listed."""
        self.responders = list(responders)
        self.save = save
        self.retry_failures = retry_failures
        """``record.retry_failures``: in ``record`` mode, a failure record's call is tried again."""
        self.refresh = refresh or RefreshScope()
        """``mode: refresh``: the usable records asked again (see :mod:`.refresh`)."""
        self.health = StoreHealth()
        """Whether the store can be read and written now (``/health``)."""
        self.stats = Stats()
        """The server's counters (the server counts each request's final outcome here)."""
        self.event_counters = [r for r in self.responders if isinstance(r, CountsEvents)]
        """The responders with counters of their own (parse retries, shadow answers), for ``/stats``."""
        for responder in self.event_counters:
            responder.use_stats(self.stats)
        self.misses = MissPath(
            store, self.tiers, self.responders, save=save, health=self.health, lookup=self.lookup,
            retries=self.retries, serve=self._serve, max_pending_misses=max_pending_misses,
            pending_timeout_s=pending_timeout_s,
        )
        """The miss path: single flight, the responders, the record (:mod:`.miss`)."""
        self.sessions = sessions
        self.local_tools = local_tools if local_tools is not None and len(local_tools) else None
        self._probes = tuple(lookup_order(self.tiers))
        # a store that can tell when it changed (diskcache) and frozen caches that give state tokens: else none kept
        keeps = store.change_token() is not None and all(callable(getattr(f, "state_token", None)) for f in self.frozen)
        self._hits = RecentHits(store.change_token, self.frozen) if keeps else None
        """Recent hits, served again while the store's change token and the frozen files are unchanged (:mod:`.recent_hits`)."""
        self.faults = faults
        """Injected faults (``faults:``), applied by :meth:`answer_async` to what the server serves; ``None`` when off."""
        self.served = served
        """``record.served_store``: a copy of every record served (:mod:`.served_copies`); ``None`` when off."""

    # -- entry points -------------------------------------------------------------------------

    def prepare(self, payload: Any) -> ToolCall | Outcome:
        """Validate a decoded body into a :class:`ToolCall`, or the final answer when none is needed.

        Final answers: HTTP 422 for an invalid body, upstream's ``Tool input parse error...``
        and ``chat_with_user`` answers.  Cheap: no I/O.
        """
        try:
            request = VirtualRequest.model_validate(payload)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in exc.errors(include_url=False)
            )
            return Outcome.error(422, f"invalid /virtual request: {problems}")
        return self._prepare_request(request)

    async def answer_async(
        self, call: ToolCall, session: str | None = None, *, faults: bool = True, limiter: anyio.CapacityLimiter | None = None
    ) -> Outcome:
        """The server's one entry for a prepared call (:meth:`prepare`): its answer, every tier in order.

        A session's calls and the local tools read and write state: they run in a worker thread of
        ``limiter`` (:meth:`handle_call`).  Any other call is looked up on the event loop
        (:meth:`probe_async`: a local store at once, Redis through its async client, a frozen file not
        parsed yet in a thread); a hit is answered there, a miss goes to a worker thread with what the
        lookup found (:meth:`answer`'s ``looked``: the cache is not read again).  ``faults``: whether
        ``faults:`` may fault what is served, after it was recorded (:mod:`.faults`).
        """
        if session is not None or self.runs_locally(call):
            outcome = await anyio.to_thread.run_sync(self.handle_call, call, session, limiter=limiter)
        else:
            found = await self.probe_async(call)
            if isinstance(found, Outcome):
                outcome = found
            else:
                outcome = await anyio.to_thread.run_sync(self.answer, call, {}, found, limiter=limiter)
        if self.faults is not None and faults:
            outcome = await self.faults.serve(call, outcome, session is not None)
        return outcome

    def _prepare_request(self, request: VirtualRequest) -> ToolCall | Outcome:
        names = resolve_names(request.category, request.tool_name, request.api_name)
        if names.category == MODEL_CATEGORY:  # the recorded model calls' names: never a tool's
            return Outcome.error(422, f"invalid /virtual request: category {MODEL_CATEGORY!r} is reserved for recorded model calls (/v1)")
        # upstream answers chat_with_user before it parses the input
        if names.api_name == protocol.CHAT_WITH_USER_API:
            return Outcome(protocol.encode_answer(protocol.chat_with_user_answer()), OutcomeKind.LOCAL, api=names.api)
        try:
            return ToolCall.build(request, parse_tool_input(request.tool_input), names)
        except (ToolInputParseError, ValueError):  # ValueError: a secret field too deep to take out
            return Outcome(protocol.encode_answer(protocol.parse_error_answer()), OutcomeKind.REJECTED, api=names.api)

    def runs_locally(self, call: ToolCall) -> bool:
        """Whether ``call`` is one of the local tools (it always runs: never answered from the cache)."""
        return self.local_tools is not None and self.local_tools.find(call) is not None

    async def probe_async(self, call: ToolCall) -> Outcome | Looked | None:
        """The cached answer as a hit, read through the tiers' async reads (a local store at once, Redis
        through its async client, a frozen file not parsed yet in a thread); when it is no hit, a
        :class:`Looked` (no record, a failure record tried again, or the store's error) for
        :meth:`answer`'s ``looked``, so a miss is not looked up twice before its single flight;
        ``None`` for a local tool."""
        if self.runs_locally(call):
            return None
        hits = self._hits
        token = None if hits is None else hits.token(call.api)  # read before the lookup it vouches for
        if token is not None:
            kept = hits.get(call, token)  # type: ignore[union-attr]
            if kept is not None:
                return kept
        try:
            record = await self.lookup_async(call)
        except StoreError as exc:
            return Looked(None, exc)  # answer() goes on from here: the store is not waited for twice
        if record is None or self.retries(record):
            return Looked(record)
        outcome = self._serve(call, record, OutcomeKind.HIT)  # the hit path's one look at record.served_store
        if token is not None:
            hits.put(call, token, outcome)  # type: ignore[union-attr]
        return outcome

    def handle_call(self, call: ToolCall, session: str | None = None) -> Outcome:
        """Answer ``call`` (inside ``session`` when given): see :meth:`answer`."""
        if session is None:
            return self.answer(call, {})
        if self.sessions is None:
            return Outcome.error(422, "sessions are not available on this server")
        try:
            return self.sessions.run(session, call, self.answer if self.faults is None else self._answer_in_session, self.health)
        except SessionError as exc:
            return Outcome.error(exc.status, exc.message)
        except StoreError as exc:
            return store_error(call, exc)

    def _answer_in_session(self, call: ToolCall, state: dict) -> Outcome:
        """:meth:`answer` inside a session, naming the key it was answered under (faults are decided on it)."""
        return replace(self.answer(call, state), key=call.key)

    @property
    def fills(self) -> bool:
        """Whether a miss may be answered by the real API or the simulator (``record`` mode, with one configured)."""
        return self.mode in (Mode.RECORD, Mode.REFRESH) and bool(self.responders)

    def retries(self, record: Record) -> bool:
        """Whether ``record`` is a failure record this layer tries again (``record.retry_failures``),
        or a usable one ``mode: refresh`` asks again (:meth:`refreshes`)."""
        return (record.is_failure and self.retry_failures and self.fills) or self.refreshes(record)

    def refreshes(self, record: Record) -> bool:
        """Whether ``mode: refresh`` asks ``record``'s call again (a usable answer in ``refresh``'s scope)."""
        return self.mode is Mode.REFRESH and not record.is_failure and bool(self.responders) and self.refresh.covers(record)

    def settled(self, call: ToolCall) -> bool:
        """Whether the cache holds an answer for ``call`` that ``record`` mode would not try again
        (``warm`` skips those calls): a usable answer, or a failure record without ``retry_failures``."""
        record = self.lookup(call)
        return record is not None and not (record.is_failure and self.retry_failures) and not self.refreshes(record)

    def answer(self, call: ToolCall, state: dict, looked: Looked | None = None) -> Outcome:
        """A local tool's answer (it may change ``state``), else the cache, else the real API and the simulator, recorded.

        ``looked``: what :meth:`probe_async` found for ``call`` just now (the cache is not read again here).
        """
        tool = self.local_tools.find(call) if self.local_tools is not None else None
        if tool is not None:
            return self._local(tool, call, state)
        try:
            record = self._cached(call, looked)
        except StoreError as exc:
            return store_error(call, exc)
        if record is not None and not self.retries(record):
            return self._serve(call, record, OutcomeKind.HIT)
        if self.mode is Mode.REPLAY or not self.responders:
            reason = "replay mode" if self.mode is Mode.REPLAY else "no real API or simulator configured"
            log.info("miss %s key=%s (%s)", clip(call.api), clip(call.key), reason)
            # one text in either mode: a run recorded with nothing to fill a miss replays byte for byte (the log says which)
            answer = protocol.encode_answer(protocol.miss_answer(call.api, UNFILLED_MISS))
            return Outcome(answer, OutcomeKind.UNANSWERED, api=call.api)
        # a request that found a failure record tries the call again
        return self.misses.fill(call, retried=record is not None)

    def _cached(self, call: ToolCall, looked: Looked | None) -> Record | None:
        """The cached record of ``call`` (``looked``'s when given); when the store cannot be read, ``None`` if a
        responder may answer (served unrecorded, the store's health told), else the store's error raised."""
        try:
            if looked is None:
                return self.lookup(call)
            if looked.error is not None:
                raise looked.error
            return looked.record
        except StoreError as exc:
            if not self.fills:
                raise
            # the store is away: a responder's answer is still served (unrecorded)
            self.health.failed("read", exc, unrecorded=False)
            return None

    # -- the parts ----------------------------------------------------------------------------

    def lookup(self, call: ToolCall) -> Record | None:
        """The cached record of ``call``, in the order of :func:`.lookup_order.lookup_order`.

        The first usable answer wins; a failure record (the first found) is returned only when
        no tier has a usable answer for the call, so a failure never hides an answer.  When the
        store cannot be read, it is not asked again in this lookup and the frozen caches still
        are: a usable answer of theirs is served (``/health`` says ``degraded``); without one,
        the store's :class:`StoreError` is raised (whether the store holds an answer is unknown).
        """
        failure: Record | None = None
        unread: StoreError | None = None
        for get, _aget, key_of in self._probes:
            key = key_of(call)
            if key is None or (unread is not None and getattr(get, "__self__", None) is self.store):
                continue
            try:
                record = get(call.api, key)
            except StoreError as exc:
                unread = exc
                continue
            if record is not None:
                if not record.is_failure:
                    return self._read(record, unread)
                failure = failure or record
        return self._read(failure, unread)

    async def lookup_async(self, call: ToolCall) -> Record | None:
        """:meth:`lookup` through the tiers' async reads (same order, same rule)."""
        failure: Record | None = None
        unread: StoreError | None = None
        for get, aget, key_of in self._probes:
            key = key_of(call)
            if key is None or (unread is not None and getattr(get, "__self__", None) is self.store):
                continue
            try:
                record = get(call.api, key) if aget is None else await aget(call.api, key)
            except StoreError as exc:
                unread = exc
                continue
            if record is not None:
                if not record.is_failure:
                    return self._read(record, unread)
                failure = failure or record
        return self._read(failure, unread)

    def _read(self, record: Record | None, unread: StoreError | None) -> Record | None:
        """What a lookup found: a usable answer whatever the store did (its failure told to the store's health);
        else the store's error when it could not be read (a failure record or no record settle nothing then:
        the caller handles the error as it always has)."""
        if unread is None:
            self.health.succeeded("read")
            return record
        if record is not None and not record.is_failure:
            self.health.failed("read", unread, unrecorded=False)
            return record
        raise unread

    def _local(self, tool: LocalTool, call: ToolCall, state: dict) -> Outcome:
        """Run a local tool; its answer is recorded (``source: local``) but never served from the cache.

        A failed run (raised, timed out, not JSON) is a ``local`` outcome without a source: its
        error answer is served, nothing is recorded and ``state`` is left as it was.
        """
        assert self.local_tools is not None
        result = self.local_tools.run(tool, call, state)
        if result.answer is None:
            body = protocol.encode_answer(self.local_tools.error_answer(tool, result.detail))
            return Outcome(body, OutcomeKind.LOCAL, api=call.api, problems=(f"local: {result.detail}",))
        state.clear()
        state.update(result.state or {})
        record = Record.from_answer(call.api, call.key, result.answer, "local", tool.origin)
        if self.save and self.mode in (Mode.RECORD, Mode.REFRESH):
            try:
                self.store.add(record, call.canonical)
                self.health.succeeded("write")
            except StoreError as exc:  # the tool ran (its state changed): its answer is served anyway
                self.health.failed("write", exc, unrecorded=True)
                log.warning("local tool answer for %s not recorded: %s", clip(call.api), clip(exc, 500))
        return _served(call, record, OutcomeKind.LOCAL)

    def _serve(self, call: ToolCall, record: Record, kind: OutcomeKind) -> Outcome:
        """What serving ``record`` answers; with ``record.served_store`` set, the record is copied there first."""
        if self.served is not None:
            self.served.add(record, call.canonical)
        return _served(call, record, kind)

    def close(self) -> None:
        for responder in self.responders:
            responder.close()
        if self.sessions is not None:
            self.sessions.close()
        for tier in self.tiers:
            tier.close()
        if self.served is not None:
            self.served.close()


@dataclass(frozen=True, slots=True)
class Looked:
    """What :meth:`MirrorLayer.probe_async` found for a call that is no hit: no record, or a failure record tried again,
    or the store's error when it could not be read (:meth:`MirrorLayer.answer` goes on without reading it again)."""

    record: Record | None
    error: StoreError | None = None


def _served(call: ToolCall, record: Record, kind: OutcomeKind) -> Outcome:
    return Outcome(record.body, kind, source=record.source, origin=record.origin, api=call.api, failure=record.is_failure)

