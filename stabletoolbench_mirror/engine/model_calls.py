"""The path of one recorded model call: occurrence, lookup, upstream, record (``POST /v1/chat/completions``, ``/v1/completions``).

A chat or text completion request of the agent or the judge is answered like a tool call, with one more
idea, the **occurrence**: the judge sends 3-4 identical requests per answer and must get 3-4
answers, so the n-th identical request of a run (:mod:`stabletoolbench_mirror.core.model_calls`)
is its own record, ``<digest>#<n>``.  In order:

1. the request is checked (a ``model`` string, a ``messages`` list or a ``prompt``: its endpoint's
   :meth:`~stabletoolbench_mirror.core.model_calls.Endpoint.request_problem`) and its digest computed;
2. its occurrence number is claimed from the store (:meth:`Store.claim_occurrence`: every worker
   and every host of a Redis store count together);
3. ``record``/``replay``: the record is looked up in the store, then in each frozen cache; a hit is
   served as recorded;
4. a miss in ``replay``, a model no upstream answers, a spent budget (``llm.max_upstream_tokens``) or
   an upstream that gives no completion end with an OpenAI-shaped error; nothing is recorded and
   the number is given back (:meth:`Store.release_occurrence`), so a retry of the same request
   takes it;
5. otherwise the upstream's completion, every known secret in it masked, is recorded
   (``refresh``: written over what was there) and served: the record run serves the same bytes
   its replay will.  An HTTP 200 that is no answer of the endpoint (no choices, a choice without its
   message or text, an ``error`` object) is the upstream's failure: passed on, never recorded.

Every record served (a hit or a new recording) is also handed to :attr:`ModelCalls.served` when one is set.

:meth:`ModelCalls.answer` runs on the server's event loop: a local store's claim and read there (as a
tool hit's read), a Redis store's and the upstream call in worker threads.
"""

from __future__ import annotations

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
from stabletoolbench_mirror.stores.base import CacheTier, MemoryOccurrences, Store, StoreError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class UpstreamAnswer:
    """What an upstream sent: its status and body (an error's too), and how long it took."""

    status: int
    body: bytes
    latency_s: float
    content_type: str = "application/json"


class UpstreamFailed(Exception):
    """No answer came back: the status to tell the client (502 or 504) and why (never a key)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status


class ModelUpstream(Protocol):
    url: str
    """Its base URL without credentials (a record's ``origin``)."""

    def key(self, client_authorization: str | None) -> str | None: ...

    def complete(self, body: Mapping[str, Any], key: str | None, timeout_s: float, endpoint: Endpoint = CHAT) -> UpstreamAnswer: ...


class ModelUpstreams(Protocol):
    def for_model(self, model: str) -> ModelUpstream | None: ...


@dataclass(frozen=True)
class ModelAnswer:
    """How one model call ended: what to send, and what to count."""

    status: int
    body: bytes
    outcome: str
    """``hit``, ``recorded``, ``replaced`` (refresh), ``unanswered`` (not recorded, nobody to ask),
    ``refused`` (budget), ``error`` (the upstream gave no completion) or ``rejected`` (a bad request)."""
    source: str
    """``model`` (or the record's source: ``imported``, ``frozen``) for an answer; ``upstream`` for an upstream's
    error; ``mirror`` for this server's own error."""
    model: str = ""
    key: str | None = None
    """``<digest>#<occurrence>``."""
    run: str = ""
    retry: bool = True
    """Whether the client may send the same request again and get another answer (``False``: a bad request, a
    spent budget, a call not recorded in replay; sent as ``X-Should-Retry: false``, which the ``openai`` SDK obeys)."""

    def completion(self) -> Mapping[str, Any] | None:
        """The served completion, parsed (a streamed request's events are built from it); ``None`` for an error."""
        if self.outcome not in ANSWERED:
            return None
        parsed = json.loads(self.body)
        return parsed if isinstance(parsed, dict) else None


#: requests counted in memory for a private run; past it, the store counts the new ones
PRIVATE_RUN_LIMIT = 1_000_000
#: the outcomes that served a completion
ANSWERED = frozenset({"hit", "recorded", "replaced"})


class ModelCalls:
    """Answers model calls from the store, the frozen caches and the upstreams (see the module's docstring)."""

    served: Callable[[Record], None] | None = None
    """Called with every record served (a hit, or an answer just recorded), off the event loop: e.g. to copy
    every model answer a run used into a second store.  ``None`` (the default): nothing is called."""

    def __init__(
        self, store: Store, frozen: Sequence[CacheTier], upstreams: ModelUpstreams, *, mode: Mode, run: str, private_run: bool = False,
        secrets: Sequence[str] = (), max_upstream_tokens: int | None = None, timeout_s: float = 600.0,
        tokens_spent: Callable[[], int] | None = None, count: Callable[[ModelAnswer, int, int, bool], None] | None = None,
    ) -> None:
        self.store = store
        self.frozen = tuple(frozen)
        self.upstreams = upstreams
        self.mode = mode
        self.run = run
        self._private = MemoryOccurrences(limit=PRIVATE_RUN_LIMIT) if private_run else None
        """The counters of :attr:`run` when no other process can share it (one worker, a run named by no one):
        kept here, so a hit writes nothing.  A run a client names (``X-STM-Run``) is always counted in the store."""
        self.redactor = Redactor(secrets)
        self.max_upstream_tokens = max_upstream_tokens
        self.timeout_s = timeout_s
        self._tokens_spent = tokens_spent or (lambda: 0)
        self._count = count or (lambda answer, prompt, completion, asked: None)
        self.local_store = store.kind == "diskcache"
        """Whether the store's claims and reads are local and quick (answered on the event loop)."""

    def close(self) -> None:
        close = getattr(self.upstreams, "close", None)
        if close is not None:
            close()

    # -- the path ---------------------------------------------------------------------------------

    async def answer(self, body: Any, authorization: str | None = None, run: str | None = None,
                     endpoint: Endpoint = CHAT) -> ModelAnswer:
        """The answer to one request body (parsed JSON) of ``endpoint``, counted once; for the server's event loop.

        A hit is answered on the loop when the store is local (diskcache: its occurrence claim and read
        take tens of microseconds, as a tool hit's read does); a Redis store's claim, and every upstream
        call, run in a worker thread.
        """
        answer, prompt, completion, asked = await self._answer(body, authorization, run or self.run, endpoint)
        self._count(answer, prompt, completion, asked)
        return answer

    async def _store_call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(*args) if self.local_store else await anyio.to_thread.run_sync(fn, *args)

    async def _answer(self, body: Any, authorization: str | None, run: str, endpoint: Endpoint) -> tuple[ModelAnswer, int, int, bool]:
        problem = endpoint.request_problem(body)
        if problem is not None:
            return _error(400, problem, "invalid_request_error", "rejected", param="model" if "model" in problem else None,
                          retry=False), 0, 0, False
        model: str = body["model"]
        digest = mc.request_digest(body)
        api = endpoint.api(model)
        counters = self._private if self._private is not None and run == self.run else None
        try:
            number = counters.claim(digest) if counters is not None and counters.holds(digest) else \
                await self._store_call(self.store.claim_occurrence, run, digest)
        except StoreError as exc:
            return _error(503, f"the store cannot count this request's occurrence: {exc}", "server_error", "error", model), 0, 0, False
        key = mc.record_key(digest, number)
        release = True
        try:
            if self.mode is not Mode.REFRESH:
                found = await self._lookup(api, key)
                if found is not None:
                    release = False
                    if self.served is not None:
                        await anyio.to_thread.run_sync(self._hand_over, found)
                    return self._served(found, "hit", model, key, run), 0, 0, False
            if self.mode is Mode.REPLAY:
                before = number > 1 and await self._lookup(api, mc.record_key(digest, number - 1)) is not None
                return self._not_recorded(endpoint, model, digest, number, run, before), 0, 0, False
            answer, prompt, completion, asked = await anyio.to_thread.run_sync(
                self._ask, body, endpoint, model, key, digest, number, run, authorization)
            release = answer.outcome not in ANSWERED
            return answer, prompt, completion, asked
        finally:
            if release:
                if counters is not None and counters.counts(digest):
                    counters.release(digest, number)
                else:
                    await self._store_call(self._give_back, run, digest, number)

    async def _lookup(self, api: str, key: str) -> Record | None:
        try:
            found = await self.store.aget(api, key)
        except StoreError as exc:
            log.warning("model call: store read failed (%s); looking in the frozen caches", exc)
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
        return None

    def _give_back(self, run: str, digest: str, number: int) -> None:
        try:
            self.store.release_occurrence(run, digest, number)
        except StoreError as exc:
            log.warning("model call: occurrence %d of %s not given back (%s)", number, digest[:16], exc)

    def _hand_over(self, record: Record) -> None:
        """:attr:`served`, called with ``record``; its failure is logged, never the request's."""
        if self.served is None:
            return
        try:
            self.served(record)
        except Exception:
            log.exception("model call: the served() callback failed for %s %s", record.api[:200], record.key[:80])

    def _ask(self, body: Mapping[str, Any], endpoint: Endpoint, model: str, key: str, digest: str, number: int, run: str,
             authorization: str | None) -> tuple[ModelAnswer, int, int, bool]:
        api = endpoint.api(model)
        upstream = self.upstreams.for_model(model)
        if upstream is None:
            message = (f"model {model!r}: no upstream answers it (llm.upstreams[].models: add a pattern that matches it), "
                       f"and request sha256:{digest} occurrence {number} is not recorded")
            return _error(404, message, "invalid_request_error", "unanswered", model, code="model_not_found", param="model",
                          retry=False), 0, 0, False
        if self.max_upstream_tokens is not None:
            spent = self._tokens_spent()
            if spent >= self.max_upstream_tokens:
                message = (f"the upstream token budget is spent ({spent} of llm.max_upstream_tokens {self.max_upstream_tokens}); "
                           f"raise llm.max_upstream_tokens or replay recorded calls (model {model!r})")
                return _error(429, message, "insufficient_quota", "refused", model, code="insufficient_quota", retry=False), 0, 0, False
        client_key = upstream.key(authorization)
        redactor = self.redactor.plus(client_key) if client_key else self.redactor
        try:
            got = upstream.complete(body, client_key, self.timeout_s, endpoint)
        except UpstreamFailed as exc:
            return _error(exc.status, redactor.text(str(exc)), "upstream_error", "error", model), 0, 0, True
        if got.status != 200:
            return self._upstream_error(got, model, redactor), 0, 0, True
        try:
            completion = json.loads(got.body)
        except (ValueError, UnicodeDecodeError):
            completion = None
        problem = endpoint.answer_problem(completion)
        if problem is not None:
            return self._no_answer(got, upstream.url, endpoint, problem, model, redactor), 0, 0, True
        completion = redactor.data(completion)
        prompt, completion_tokens = mc.usage_of(completion)
        record = Record(
            api=api, key=key, body=encode_answer(completion), source="model", origin=upstream.url,
            meta={
                "upstream": upstream.url, "model_asked": model, "model_answered": completion.get("model"),
                "usage": completion.get("usage"), "latency_s": round(got.latency_s, 6), "occurrence": number,
                "run": run, "request_sha256": digest,
            },
        )
        outcome = "recorded"
        try:
            if self.mode is Mode.REFRESH:
                self.store.replace(record, None)
                outcome = "replaced"
            elif not self.store.add(record, None):
                # another server recorded this occurrence first: its answer is the one replayed, so serve it
                kept = self.store.get(api, key)
                if kept is not None:
                    self._hand_over(kept)
                    return self._served(kept, "hit", model, key, run), prompt, completion_tokens, True
        except StoreError as exc:
            log.warning("model call: not recorded (%s); served all the same", exc)
        self._hand_over(record)
        return self._served(record, outcome, model, key, run), prompt, completion_tokens, True

    def _no_answer(self, got: UpstreamAnswer, url: str, endpoint: Endpoint, problem: str, model: str, redactor: Redactor) -> ModelAnswer:
        """An upstream's HTTP 200 that is no answer of ``endpoint``: its error passed on (HTTP 502), nothing recorded."""
        try:
            parsed = json.loads(got.body)
        except (ValueError, UnicodeDecodeError, RecursionError):
            parsed = None
        error = parsed.get("error") if isinstance(parsed, dict) else None
        message = f"the upstream {url} answered HTTP 200 without a {endpoint.name} answer ({problem})"
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            message += ": " + error["message"][:2000]
        elif isinstance(error, str):
            message += ": " + error[:2000]
        return _error(502, redactor.text(message), "upstream_error", "error", model)

    def _upstream_error(self, got: UpstreamAnswer, model: str, redactor: Redactor) -> ModelAnswer:
        """The upstream's own error, its status kept, its body OpenAI-shaped (and masked)."""
        try:
            parsed = json.loads(got.body)
        except (ValueError, UnicodeDecodeError):
            parsed = None
        if not (isinstance(parsed, dict) and isinstance(parsed.get("error"), (dict, str))):
            text = got.body[:500].decode("utf-8", "replace")
            parsed = mc.error_body(f"the upstream answered HTTP {got.status}: {text}", "upstream_error")
        status = got.status if 400 <= got.status <= 599 else 502
        return ModelAnswer(status, encode_answer(redactor.data(parsed)).encode("utf-8"), "error", "upstream", model)

    def _served(self, record: Record, outcome: str, model: str, key: str, run: str) -> ModelAnswer:
        return ModelAnswer(200, record.body.encode("utf-8"), outcome, record.source, model, key, run)

    def _not_recorded(self, endpoint: Endpoint, model: str, digest: str, number: int, run: str, used_up: bool) -> ModelAnswer:
        """The replay miss's 404.  ``used_up``: occurrences 1..number-1 are recorded, so this run has used them all:
        most likely a second evaluation sent to a server whose run the first one used (the fixes named first)."""
        api = endpoint.api(model)
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
        return _error(404, message, "invalid_request_error", "unanswered", model, code="not_recorded", retry=False)


def _error(status: int, message: str, type_: str, outcome: str, model: str = "", *, code: str | None = None,
           param: str | None = None, retry: bool = True) -> ModelAnswer:
    body = encode_answer(mc.error_body(message, type_, code, param)).encode("utf-8")
    return ModelAnswer(status, body, outcome, "mirror", model, retry=retry)


def new_run_id() -> str:
    """A run's name when ``llm.run`` names none: the start time and a random part."""
    import uuid

    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + uuid.uuid4().hex[:8]
