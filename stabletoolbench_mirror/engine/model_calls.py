"""The path of one recorded model call: occurrence, lookup, upstream, record (``POST /v1/chat/completions``, ``/v1/completions``).

A chat or text completion request of the agent or the judge is answered like a tool call, with one more
idea, the **occurrence**: the judge sends 3-4 identical requests per answer and must get 3-4
answers, so the n-th identical request of a run (:mod:`stabletoolbench_mirror.core.model_calls`)
is its own record, ``<digest>#<n>``.  In order:

1. the body is parsed and checked (a ``model`` string, a ``messages`` list or a ``prompt``: its endpoint's
   :meth:`~stabletoolbench_mirror.core.model_calls.Endpoint.request_problem`; valid Unicode, nested less than
   Python's recursion limit) and its digest computed (:func:`~.model_requests.prepare`; a body over :data:`ON_LOOP_BYTES` in a
   worker thread, so a large body never holds the event loop);
2. its occurrence number is claimed (:class:`~.occurrences.RunCounters`: the server's own run in bounded
   memory, any other run in the store, never waiting on the event loop, at most ``store.timeout_s``);
3. ``record``/``replay``: the record is looked up in the store, then in each frozen cache; a hit is
   served as recorded (with :attr:`ModelCalls.own`, ``llm.reuse_answers: false``: only in what this server's
   run was served, so a run gets answers of its own, never another run's);
4. a miss in ``replay``, a model no upstream answers, a spent budget (``llm.max_upstream_tokens``: each
   upstream call reserves its :func:`~stabletoolbench_mirror.core.model_calls.token_estimate` first, and
   settles it with the tokens it used, :class:`TokenBudget`) or an upstream that gives no completion end
   with an OpenAI-shaped error; nothing is recorded and the number is given back, so a retry of the same
   request takes it;
5. otherwise the upstream's completion, every known secret in it masked, is recorded
   (``refresh``: written over what was there) and served: the record run serves the same bytes
   its replay will.  An HTTP 200 that is no answer of the endpoint (no choices, a choice without its
   message or text, an ``error`` object) is the upstream's failure: passed on, never recorded.

Every record served (a hit or a new recording) is also handed to :attr:`ModelCalls.served` when one is set.
:meth:`ModelCalls.answer` runs on the server's event loop: a small body's parse, a local store's claim and
read there (as a tool hit's read), the rest (a large body, a store that would wait, the upstream call and
the record's write, as a tool miss's) in worker threads.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import anyio.to_thread

from stabletoolbench_mirror.config import Mode
from stabletoolbench_mirror.core import model_calls as mc
from stabletoolbench_mirror.core.model_calls import CHAT, Endpoint
from stabletoolbench_mirror.core.protocol import encode_answer
from stabletoolbench_mirror.core.records import Record
from stabletoolbench_mirror.core.secrets import Redactor
from stabletoolbench_mirror.engine.model_requests import ANSWERED, ON_LOOP_BYTES, ModelAnswer, ModelRequest, error_answer, prepare
from stabletoolbench_mirror.engine.occurrences import PrivateRun, RunCounters
from stabletoolbench_mirror.stores.base import CacheTier, Store, StoreError

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class ModelServerAnswer:
    """What an upstream sent: its status and body (an error's too), and how long it took."""

    status: int
    body: bytes
    latency_s: float
    content_type: str = "application/json"

    def parsed(self) -> Any:
        """The body as JSON; ``None`` when it is none."""
        try:
            return json.loads(self.body)
        except (ValueError, UnicodeDecodeError, RecursionError):
            return None


class ModelServerFailed(Exception):
    """No answer came back: the status to tell the client (502 or 504) and why (never a key)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status


class ModelServer(Protocol):
    url: str
    """Its base URL without credentials (a record's ``origin``)."""

    def key(self, client_authorization: str | None) -> str | None: ...

    def complete(self, body: Mapping[str, Any], key: str | None, timeout_s: float, endpoint: Endpoint = CHAT, *,
                 large: bool = False) -> ModelServerAnswer: ...


class ModelServers(Protocol):
    def for_model(self, model: str) -> ModelServer | None: ...


class TokenBudget:
    """``llm.max_upstream_tokens``: reserved before each upstream call, settled with what it used after it.

    A call goes upstream only when the tokens spent, those reserved by calls in flight and its own estimate
    fit in the budget, or when no call is in flight and some budget is left (so one request larger than
    the budget still goes, alone); else it waits (at most ``timeout_s``) for calls in flight to settle.
    So concurrent calls spend at most the budget plus what one call used beyond its estimate.  A call
    settles with its answer's ``usage`` (its estimate when the answer reports none, 0 when no answer
    came).  ``shared_spent``: with ``serve --workers N``, the tokens every worker settled (each worker
    reserves for its own calls).
    """

    def __init__(self, limit: int, timeout_s: float, shared_spent: Callable[[], int] | None = None) -> None:
        self.limit = limit
        self.timeout_s = timeout_s
        self.shared_spent = shared_spent
        self.reserved = 0
        self.spent = 0
        """Tokens settled by this process (the figure itself without workers)."""
        self.unreported = 0
        """Of :attr:`spent`, the estimates charged for answers that reported no usage (counted nowhere else)."""
        self._changed: asyncio.Event | None = None

    async def _spent_now(self) -> int:
        if self.shared_spent is None:
            return self.spent
        return int(await anyio.to_thread.run_sync(self.shared_spent)) + self.unreported

    async def reserve(self, estimate: int) -> int | None:
        """Reserve ``estimate`` tokens (waiting for calls in flight to settle); ``None`` when the budget is spent."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            spent = await self._spent_now()
            if spent >= self.limit:
                return None
            if not self.reserved or spent + self.reserved + estimate <= self.limit:
                self.reserved += estimate
                return estimate
            if self._changed is None:
                self._changed = asyncio.Event()
            try:
                await asyncio.wait_for(self._changed.wait(), max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                return None

    def settle(self, reserved: int, used: int, unreported: bool = False) -> None:
        """Give back a reservation; ``used`` tokens are spent (``unreported``: an estimate, the answer said nothing)."""
        self.reserved -= reserved
        self.spent += used
        if unreported:
            self.unreported += used
        changed, self._changed = self._changed, None
        if changed is not None:
            changed.set()


@dataclass(frozen=True)
class _Asked:
    """What one upstream call gave: the record written and served (a usable answer) and how, or the error answer; its tokens."""

    answer: ModelAnswer | None
    record: Record | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    outcome: str = "recorded"


_NOTHING = (0, 0, False)
"""A call's tokens and whether an upstream was asked: none of either."""


class ModelCalls:
    """Answers model calls from the store, the frozen caches and the upstreams (see the module's docstring)."""

    served: Callable[[Record], None] | None = None
    """Called with every record served (a hit, or an answer just recorded), off the event loop: e.g. to copy
    every model answer a run used into a second store.  ``None`` (the default): nothing is called."""
    own: CacheTier | None = None
    """``llm.reuse_answers: false`` (record mode): the only tier a call is answered from, the answers this server's
    run was served (``record.served_store``); any other call is asked upstream, its answer written over the store's.
    ``None`` (the default): the store's and the frozen caches' records answer."""

    def __init__(
        self, store: Store, frozen: Sequence[CacheTier], upstreams: ModelServers, *, mode: Mode, run: str, private_run: bool = False,
        secrets: Sequence[str] = (), budget: TokenBudget | None = None, timeout_s: float = 600.0, store_timeout_s: float = 2.0,
        count: Callable[[ModelAnswer, int, int, bool], None] | None = None, limiter: Any = None,
    ) -> None:
        """``private_run``: nobody else can count :attr:`run` (one worker, a run named by no one): counted in this
        process's bounded memory.  ``limiter``: the worker threads' limiter (the server's, shared fairly between clients)."""
        self.store = store
        self.frozen = tuple(frozen)
        self.upstreams = upstreams
        self.mode = mode
        self.run = run
        self.counters = RunCounters(store, PrivateRun(run) if private_run else None, store_timeout_s)
        self.redactor = Redactor(secrets)
        self.budget = budget
        self.timeout_s = timeout_s
        self.store_timeout_s = store_timeout_s
        self.limiter = limiter
        self._count = count or (lambda answer, prompt, completion, asked: None)
        self._reads_wait = store.reads_wait
        """Whether a store read can wait (over the network): then bounded by ``store.timeout_s``."""

    holds_private_run = False
    """Whether this path holds the store's private model-call run (:meth:`Store.hold_private_run`), let go at :meth:`close`."""

    def close(self) -> None:
        if self.holds_private_run:
            self.store.release_private_run()
        self.counters.close()
        close = getattr(self.upstreams, "close", None)
        if close is not None:
            close()

    async def _thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await anyio.to_thread.run_sync(fn, *args, limiter=self.limiter)

    # -- the path ---------------------------------------------------------------------------------

    async def answer(self, raw: bytes, authorization: str | None = None, run: str | None = None,
                     endpoint: Endpoint = CHAT) -> ModelAnswer:
        """The answer to one request body of ``endpoint``, counted once; for the server's event loop."""
        request = prepare(raw, endpoint) if len(raw) <= ON_LOOP_BYTES else await self._thread(prepare, raw, endpoint)
        if isinstance(request, ModelAnswer):
            answer, (prompt, completion, asked) = request, _NOTHING
        else:
            answer, (prompt, completion, asked) = await self._answer(request, authorization, run or self.run)
            if request.body.get("stream") is True:
                options = request.body.get("stream_options")
                answer = dataclasses.replace(answer, stream=isinstance(options, dict) and options.get("include_usage") is True)
        self._count(answer, prompt, completion, asked)
        return answer

    def refused(self, status: int, message: str, outcome: str) -> ModelAnswer:
        """The answer (counted) to a request the front turned away before its body was read: too large, too slow,
        or over a client's limits (``refused`` may be retried; ``rejected`` may not)."""
        answer = error_answer(status, message, "server_error" if outcome == "refused" else "invalid_request_error", outcome,
                              retry=outcome == "refused")
        self._count(answer, 0, 0, False)
        return answer

    async def _answer(self, request: ModelRequest, authorization: str | None, run: str) -> tuple[ModelAnswer, tuple[int, int, bool]]:
        try:
            number = await self.counters.claim(run, request.digest)
        except StoreError as exc:
            message = f"the store cannot count this request's occurrence: {exc}"
            return error_answer(503, message, "server_error", "error", request.model), _NOTHING
        answer: ModelAnswer | None = None
        try:
            answer, usage = await self._claimed(request, number, run, authorization)
            return answer, usage
        finally:
            if answer is None or answer.outcome not in ANSWERED:
                await self.counters.release(run, request.digest, number)

    async def _claimed(self, request: ModelRequest, number: int, run: str, authorization: str | None) -> tuple[ModelAnswer, tuple[int, int, bool]]:
        api, key, model = request.endpoint.api(request.model), mc.record_key(request.digest, number), request.model
        if self.mode is not Mode.REFRESH:
            found = await self._lookup(api, key)
            if isinstance(found, StoreError):  # not "not recorded": the store could not say (a retry may find it)
                return error_answer(503, f"the store cannot be read now ({found}); nothing else holds {key}", "server_error", "error",
                                    model), _NOTHING
            if found is not None:
                await self._hand_over_async(found)
                return self._served(found, "hit", model, key, run), _NOTHING
        if self.mode is Mode.REPLAY:
            used_up = number > 1 and isinstance(await self._lookup(api, mc.record_key(request.digest, number - 1)), Record)
            return self._not_recorded(request, number, run, used_up), _NOTHING
        upstream = self.upstreams.for_model(model)
        if upstream is None:
            message = (f"model {model!r}: no upstream answers it (llm.upstreams[].models: add a pattern that matches it), "
                       f"and request sha256:{request.digest} occurrence {number} is not recorded")
            return error_answer(404, message, "invalid_request_error", "unanswered", model, code="model_not_found", param="model",
                                retry=False), _NOTHING
        return await self._from_upstream(request, upstream, key, number, run, authorization)

    async def _from_upstream(self, request: ModelRequest, upstream: ModelServer, key: str, number: int, run: str,
                             authorization: str | None) -> tuple[ModelAnswer, tuple[int, int, bool]]:
        reserved = estimate = None
        if self.budget is not None:
            estimate = mc.token_estimate(request.body, request.size)
            reserved = await self.budget.reserve(estimate)
            if reserved is None:
                return self._budget_spent(request.model), _NOTHING
        asked = _Asked(None)
        try:
            asked = await self._thread(self._ask, request, upstream, key, number, run, authorization)
        finally:
            if self.budget is not None and reserved is not None and estimate is not None:
                used = asked.prompt_tokens + asked.completion_tokens
                unreported = asked.record is not None and not used
                self.budget.settle(reserved, estimate if unreported else used, unreported)
        tokens = (asked.prompt_tokens, asked.completion_tokens, True)
        if asked.record is None:
            assert asked.answer is not None
            return asked.answer, tokens
        record, outcome = asked.record, asked.outcome
        await self._hand_over_async(record)
        return self._served(record, outcome, request.model, key, run), tokens

    def _budget_spent(self, model: str) -> ModelAnswer:
        assert self.budget is not None
        message = (f"the upstream token budget is spent ({self.budget.spent} settled and {self.budget.reserved} reserved of "
                   f"llm.max_upstream_tokens {self.budget.limit}); raise llm.max_upstream_tokens or replay recorded calls "
                   f"(model {model!r})")
        return error_answer(429, message, "insufficient_quota", "refused", model, code="insufficient_quota", retry=False)

    async def _lookup(self, api: str, key: str) -> Record | StoreError | None:
        """The record of ``key``: from the store, else a frozen cache; ``None`` when none holds it, the store's
        :class:`StoreError` when it could not be read and no frozen cache holds it."""
        if self.own is not None:
            try:
                return await self.own.aget(api, key)
            except StoreError as exc:
                return exc
        failed = None
        try:
            if self._reads_wait:  # a read over the network: never longer than store.timeout_s
                found = await asyncio.wait_for(self.store.aget(api, key), self.store_timeout_s)
            else:
                found = await self.store.aget(api, key)
        except (StoreError, TimeoutError) as exc:
            failed = exc if isinstance(exc, StoreError) else StoreError(f"no answer within {self.store_timeout_s:g} s (store.timeout_s)")
            log.warning("model call: store read failed (%s); looking in the frozen caches", failed)
            found = None
        if found is not None:
            return found
        for tier in self.frozen:  # a frozen file's first read is parsed in a thread (CacheTier.aget)
            try:
                found = await tier.aget(api, key)
            except StoreError as exc:
                log.warning("model call: frozen cache read failed (%s)", exc)
                continue
            if found is not None:
                return found
        return failed

    def _write(self, record: Record) -> tuple[Record, str]:
        """Write ``record`` (in the upstream call's worker thread, as a tool miss's record is written); the record to
        serve and its outcome.  When another server recorded this occurrence first, its answer is the one replayed:
        it is served.  When the store fails, the answer is served unrecorded."""
        try:
            if self.mode is Mode.REFRESH:
                self.store.replace(record, None)
                return record, "replaced"
            if self.own is not None:  # a fresh answer: the store's earlier one for this key was not this run's
                self.store.replace(record, None)
                return record, "recorded"
            if not self.store.add(record, None):
                kept = self.store.get(record.api, record.key)
                if kept is not None:
                    return kept, "hit"
        except StoreError as exc:
            log.warning("model call: not recorded (%s); served all the same", exc)
        return record, "replaced" if self.mode is Mode.REFRESH else "recorded"

    async def _hand_over_async(self, record: Record) -> None:
        if self.served is not None:
            await self._thread(self._hand_over, record)

    def _hand_over(self, record: Record) -> None:
        """:attr:`served`, called with ``record``; its failure is logged, never the request's."""
        assert self.served is not None
        try:
            self.served(record)
        except Exception:
            log.exception("model call: the served() callback failed for %s %s", record.api[:200], record.key[:80])

    def _ask(self, request: ModelRequest, upstream: ModelServer, key: str, number: int, run: str,
             authorization: str | None) -> _Asked:
        """The upstream's answer, as a record to write, or the error to pass on (in a worker thread)."""
        client_key = upstream.key(authorization)
        redactor = self.redactor.plus(client_key) if client_key else self.redactor
        try:
            got = upstream.complete(request.body, client_key, self.timeout_s, request.endpoint, large=request.large)
        except ModelServerFailed as exc:
            return _Asked(error_answer(exc.status, redactor.text(str(exc)), "upstream_error", "error", request.model))
        if got.status != 200:
            return _Asked(self._upstream_error(got, request.model, redactor))
        completion = got.parsed()
        problem = request.endpoint.answer_problem(completion)
        if problem is not None:
            return _Asked(self._no_answer(got, upstream.url, request.endpoint, problem, request.model, redactor))
        try:
            completion = redactor.data(completion)
            body = encode_answer(completion)
        except (RecursionError, UnicodeEncodeError, ValueError):
            return _Asked(self._no_answer(got, upstream.url, request.endpoint, "it cannot be kept as JSON text", request.model,
                                          redactor))
        prompt, completion_tokens = mc.usage_of(completion)
        fresh = Record(
            api=request.endpoint.api(request.model), key=key, body=body, source="model", origin=upstream.url,
            meta={
                "upstream": upstream.url, "model_asked": request.model, "model_answered": completion.get("model"),
                "usage": completion.get("usage"), "latency_s": round(got.latency_s, 6), "occurrence": number,
                "run": run, "request_sha256": request.digest,
            },
        )
        record, outcome = self._write(fresh)
        return _Asked(None, record, prompt, completion_tokens, outcome)

    def _upstream_error(self, got: ModelServerAnswer, model: str, redactor: Redactor) -> ModelAnswer:
        """The upstream's own error, its status kept, its body OpenAI-shaped (and masked)."""
        parsed = got.parsed()
        if not (isinstance(parsed, dict) and isinstance(parsed.get("error"), (dict, str))):
            text = got.body[:500].decode("utf-8", "replace")
            parsed = mc.error_body(f"the upstream answered HTTP {got.status}: {text}", "upstream_error")
        status = got.status if 400 <= got.status <= 599 else 502
        try:
            body = encode_answer(redactor.data(parsed)).encode("utf-8")
        except (RecursionError, UnicodeEncodeError, ValueError):
            body = encode_answer(mc.error_body(f"the upstream answered HTTP {got.status}", "upstream_error")).encode("utf-8")
        return ModelAnswer(status, body, "error", "upstream", model)

    def _no_answer(self, got: ModelServerAnswer, url: str, endpoint: Endpoint, problem: str, model: str, redactor: Redactor) -> ModelAnswer:
        """An upstream's HTTP 200 that is no answer of ``endpoint``: its error passed on (HTTP 502), nothing recorded."""
        parsed = got.parsed()
        error = parsed.get("error") if isinstance(parsed, dict) else None
        message = f"the upstream {url} answered HTTP 200 without a {endpoint.name} answer ({problem})"
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            message += ": " + error["message"][:2000]
        elif isinstance(error, str):
            message += ": " + error[:2000]
        return error_answer(502, redactor.text(message), "upstream_error", "error", model)

    def _served(self, record: Record, outcome: str, model: str, key: str, run: str) -> ModelAnswer:
        return ModelAnswer(200, record.body.encode("utf-8"), outcome, record.source, model, key, run)

    def _not_recorded(self, request: ModelRequest, number: int, run: str, used_up: bool) -> ModelAnswer:
        """The replay miss's 404.  ``used_up``: occurrences 1..number-1 are recorded, so this run has used them all:
        most likely a second evaluation sent to a server whose run the first one used (the fixes named first)."""
        model, digest = request.model, request.digest
        api = request.endpoint.api(model)
        if used_up:
            message = (
                f"model {model!r}: request sha256:{digest} occurrence {number} is not recorded: it was recorded {number - 1} "
                f"time(s) and run {run!r} has used them all (a second evaluation on the same server?). Each run replays "
                f"the recorded occurrences once; give each evaluation a run of its own: restart `serve`, or set llm.run to "
                f"a new name, or send the header `X-STM-Run: <new name>`, or use the base URL "
                f"http://HOST:PORT/run/<new name>/v1. `stabletoolbench-mirror cache ls --api '{api}'` lists what is recorded"
            )
        else:
            message = (
                f"model {model!r}: request sha256:{digest} occurrence {number} is not recorded, and in replay mode nothing is "
                f"asked upstream (run {run!r}). `stabletoolbench-mirror cache ls --api '{api}'` lists the "
                f"recorded occurrences of this model (keys <sha256>#<occurrence>); record it with llm.mode: record"
            )
        return error_answer(404, message, "invalid_request_error", "unanswered", model, code="not_recorded", retry=False)


def new_run_id() -> str:
    """A run's name when ``llm.run`` names none: the start time and a random part."""
    import uuid

    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + uuid.uuid4().hex[:8]
