"""The OpenAI-compatible front of recorded model calls: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``GET /v1/models``.

``OpenAI(base_url="http://HOST:PORT/v1")`` works unchanged, for the agent (``qa_pipeline
--base_url``, ToolLLaMA's ``toolllama_vllm`` too) and for the judge (``API_POOL_FILE`` entries' ``api_base``).
``http://HOST:PORT/run/<name>/v1`` is the same front for the run ``<name>``, exactly as ``/v1`` with the
header ``X-STM-Run: <name>`` (:func:`run_route`): for clients that cannot send a header.
:class:`ModelFront` is a pure ASGI handler the server's front hands ``/v1/...`` and ``/run/...`` to, as it handles ``/virtual``
(ahead of FastAPI's middleware stack): the body is taken in by the front's own way in (the body read at most
``llm.max_body_bytes``, within ``limits.body_timeout_s``, counted against ``limits.max_queued_bytes``, then a slot
among the client's), and handed to :class:`~stabletoolbench_mirror.engine.model_calls.ModelCalls` once (a hit of a
local store answered on the event loop, the rest in worker threads); its answer is sent as JSON, or as
server-sent events when the request asked for ``stream: true`` (a large one built in a worker thread).  Every answer names
how it ended (``X-STM-Outcome``), where it came from (``X-STM-Source``) and, for a completion, its
record's key (``X-STM-Key``: ``<sha256>#<occurrence>``) and run (``X-STM-Run``).  A client names its
run with the ``X-STM-Run`` header (printable, at most 200 characters); with the server's bearer token
set, the client's ``Authorization`` is that token and never passed upstream.  An error the client should not
send again unchanged (a bad request, a spent budget, a call not recorded in replay) carries
``X-Should-Retry: false``, which the ``openai`` SDK obeys (it retries 408, 409, 429 and 5xx otherwise).
"""

from __future__ import annotations

import json
import os
import time
import urllib.parse
from typing import Any

import anyio.to_thread
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from stabletoolbench_mirror.config import Mode, Settings
from stabletoolbench_mirror.core import model_calls as mc
from stabletoolbench_mirror.core.model_calls import Endpoint
from stabletoolbench_mirror.core.outcomes import Outcome, OutcomeKind
from stabletoolbench_mirror.core.protocol import encode_answer
from stabletoolbench_mirror.engine.layer import MirrorLayer
from stabletoolbench_mirror.engine.metrics import multiprocess_dir
from stabletoolbench_mirror.engine.model_calls import ModelCalls, TokenBudget, new_run_id
from stabletoolbench_mirror.engine.model_requests import ANSWERED, ON_LOOP_BYTES, ModelAnswer
from stabletoolbench_mirror.responders.model_servers import ModelServers
from stabletoolbench_mirror.serving.asgi_front import Front, stop_headers
from stabletoolbench_mirror.stores.base import Store, StoreError

MAX_RUN_CHARS = 200


def hold_private_run(settings: Settings, store: Store, run: str) -> bool:
    """Refuse to start a second server recording model calls into one store, each in a run of its own.

    Each would count identical requests from 1: the judge's 4 identical requests, spread over both,
    would get answers 1, 1, 2, 2 instead of 1, 2, 3, 4 (each server finding the other's recordings), and
    nothing would say so.  Counting them together needs a run both name (``llm.run``), as only the user
    knows whether a server started later is the same evaluation or the next one; so the second is refused
    (:class:`StoreError`, naming the fixes) while the first runs.  ``serve --workers N`` names one run
    for its workers and holds this in its first process.
    """
    # only a server recording model calls (an upstream, llm.mode not replay) in a run nobody named
    if settings.llm.run is not None or not settings.llm.upstreams or (settings.llm.mode or settings.mode) is Mode.REPLAY:
        return False
    holder = store.hold_private_run(run)
    if holder is not None:
        raise StoreError(
            f"another server records model calls into this store in a run of its own ({holder}); two would each count "
            f"identical requests from 1 and serve each other's recordings (the judge's identical requests would get one "
            f"answer twice). Name one run for both (llm.run: <name>, or STM_LLM__RUN=<name>), or serve both from one "
            f"process with `serve --workers N`, or stop the other one; a replay server (llm.mode: replay) may run beside it")
    return True


def build_model_calls(settings: Settings, layer: MirrorLayer, limiter: Any = None) -> ModelCalls:
    """The model-call path of a server: the layer's store and frozen caches, ``llm``'s upstreams, mode, run and budget.

    :class:`StoreError` when another server records model calls into the store in a run of its own (:func:`hold_private_run`).
    """
    llm = settings.llm
    stats = layer.stats
    run = llm.run or new_run_id()
    held = settings.workers == 1 and hold_private_run(settings, layer.store, run)  # serve --workers N: its first process
    budget = None
    if llm.max_upstream_tokens is not None:
        # with --workers N every worker's settled tokens are read from the shared counts (in a thread)
        budget = TokenBudget(llm.max_upstream_tokens, llm.timeout_s, stats.model_tokens_spent if multiprocess_dir() else None)
    calls = ModelCalls(
        layer.store, layer.frozen, ModelServers(llm),
        mode=llm.mode or settings.mode, run=run, secrets=settings.secrets(),
        # a run only this process can see: one worker, and no run named in the config (serve names it for workers)
        private_run=llm.run is None and settings.workers == 1,
        budget=budget, timeout_s=llm.timeout_s, store_timeout_s=settings.store.timeout_s, limiter=limiter,
        count=lambda answer, prompt, completion, asked: stats.count_model(answer.model or "(none)", answer.outcome, prompt, completion, asked),
    )
    calls.holds_private_run = held
    if layer.served is not None:  # record.served_store: the model answers served are copied with the tool answers
        calls.served = layer.served.add
        if not llm.reuse_answers and (llm.mode or settings.mode) is Mode.RECORD:
            calls.own = layer.served.store  # answered only from what this run was served (llm.reuse_answers: false)
    return calls


_WORKER = (b"x-stm-worker", str(os.getpid()).encode())
_NO_RETRY = (b"x-should-retry", b"false")
#: the headers of a request refused before it reached :class:`ModelCalls`
_REJECTED = [(b"x-stm-outcome", b"rejected"), (b"x-stm-source", b"mirror"), _NO_RETRY]
_RUN_HEADER = b"x-stm-run"


def _headers(answer: ModelAnswer) -> list[tuple[bytes, bytes]]:
    headers = [(b"x-stm-outcome", answer.outcome.encode()), (b"x-stm-source", answer.source.encode()), _WORKER]
    if not answer.retry:
        headers.append(_NO_RETRY)
    if answer.key is not None:
        headers += [(b"x-stm-key", answer.key.encode()), (_RUN_HEADER, answer.run.encode("utf-8", "replace"))]
    return headers


def _error_body(status: int, message: str, type_: str = "invalid_request_error") -> tuple[int, bytes]:
    return status, encode_answer(mc.error_body(message, type_)).encode("utf-8")


def run_route(scope: Scope) -> Scope | tuple[int, bytes]:
    """``/run/<name>/v1/...`` as ``/v1/...`` with the header ``X-STM-Run: <name>`` (the name's bytes as they are
    percent-decoded from the path), or the error answer: no ``/v1/`` after the name, or another run in the header."""
    raw = scope.get("raw_path") or scope["path"].encode("utf-8")
    raw = raw.split(b"?", 1)[0]
    name, slash, rest = raw[len(b"/run/"):].partition(b"/")
    if not slash or not (rest == b"v1" or rest.startswith(b"v1/")):
        return _error_body(404, "a run in the URL is http://HOST:PORT/run/<name>/v1/... (e.g. the base URL "
                                "http://HOST:PORT/run/eval-2/v1); the name holds no '/'")
    value = urllib.parse.unquote_to_bytes(name)
    headers = list(scope.get("headers", ()))
    named = [v for k, v in headers if k == _RUN_HEADER]
    if named and named != [value]:
        return _error_body(400, "the URL (/run/<name>/v1) and the X-STM-Run header name different runs: name one")
    path = "/" + rest.decode("latin-1")
    if not named:
        headers.append((_RUN_HEADER, value))
    return {**scope, "path": urllib.parse.unquote(path), "raw_path": b"/" + rest, "headers": headers}


class ModelFront:
    """``/v1`` as a pure ASGI handler (the server's front hands it the request, as it does ``/virtual``'s, ahead
    of FastAPI's middleware stack: a replayed model call costs what a tool hit does).  A completion route
    (:data:`~stabletoolbench_mirror.core.model_calls.ENDPOINTS`) is answered here, its body taken in by the
    front's own way in (:meth:`~.asgi_front.Front.admit`: the body read under ``llm.max_body_bytes`` and
    ``limits.body_timeout_s``, its bytes counted against ``limits.max_queued_bytes``, then a slot among the
    client's ``limits.max_in_flight_per_client``); any other ``/v1`` route (``GET /v1/models``) goes on to ``app``."""

    def __init__(self, calls: ModelCalls, settings: Settings, app: ASGIApp, gate: Front) -> None:
        self.calls = calls
        self.app = app
        self.gate = gate
        self.max_body = settings.llm.max_body_bytes
        self.pass_authorization = settings.auth_token is None
        """The client's ``Authorization`` is its upstream key only when it is not the server's bearer token."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["path"].startswith("/run/"):
            routed = run_route(scope)
            if isinstance(routed, tuple):
                await _send_json(send, *routed, _REJECTED)
                return
            scope = routed
        endpoint = mc.ENDPOINTS.get(scope["path"])
        if endpoint is None:
            await self.app(scope, receive, send)
            return
        if scope["method"] != "POST":
            status, body = _error_body(405, f"use POST /v1{endpoint.path}")
            await _send_json(send, status, body, [(b"allow", b"POST"), *_REJECTED])
            return
        client = scope["client"][0] if scope.get("client") else "?"
        raw = await self.gate.admit(scope, receive, client, self.max_body, "llm.max_body_bytes")
        if isinstance(raw, Outcome):
            await self._stopped(send, raw)
            return
        try:
            await self._answer(scope, raw, endpoint, send)
        finally:
            self.gate.admission.leave(client)

    async def _stopped(self, send: Send, stop: Outcome) -> None:
        """The answer to a request :meth:`Front.admit` ended (too large, too slow, gone, over a limit), OpenAI-shaped."""
        refused = stop.kind is OutcomeKind.REFUSED
        answer = self.calls.refused(stop.status, str(stop.answer.get("error", "")), "refused" if refused else "rejected")
        await _send_json(send, answer.status, answer.body, [*_headers(answer), *stop_headers(stop)])

    async def _answer(self, scope: Scope, raw: bytes, endpoint: Endpoint, send: Send) -> None:
        headers = dict(scope.get("headers", ()))
        run = _run_of(headers.get(_RUN_HEADER))
        if isinstance(run, tuple):
            await _send_json(send, *run, _REJECTED)
            return
        authorization = headers.get(b"authorization") if self.pass_authorization else None
        answer = await self.calls.answer(raw, authorization.decode("latin-1") if authorization else None, run, endpoint)
        if answer.stream is None or answer.outcome not in ANSWERED:
            await _send_json(send, answer.status, answer.body, _headers(answer))
            return
        events = events_of(answer, endpoint) if len(answer.body) <= ON_LOOP_BYTES else \
            await anyio.to_thread.run_sync(events_of, answer, endpoint, limiter=self.calls.limiter)
        if events is None:
            status, body = _error_body(502, f"the answer recorded under {answer.key} is not a {endpoint.name} answer, so it "
                                            f"cannot be streamed (ask without stream: true to get it as recorded)", "server_error")
            await _send_json(send, status, body, [(b"x-stm-outcome", b"error"), (b"x-stm-source", answer.source.encode())])
            return
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"), *_headers(answer)]})
        await send({"type": "http.response.body", "body": events})


def events_of(answer: ModelAnswer, endpoint: Endpoint) -> bytes | None:
    """The server-sent events of a streamed request's answer; ``None`` when the record is no answer of ``endpoint``
    (recorded by an older version, imported, hand-made): it is then refused whole, never sent half."""
    try:
        completion = json.loads(answer.body)
    except (ValueError, RecursionError):
        return None
    if endpoint.answer_problem(completion) is not None:
        return None
    try:
        return b"".join(endpoint.events(completion, bool(answer.stream)))
    except (RecursionError, ValueError, TypeError):
        return None


def _run_of(header: bytes | None) -> str | None | tuple[int, bytes]:
    """The run a client named with ``X-STM-Run`` (``None``: none), or the 400 answer to a bad name."""
    if header is None:
        return None
    run = header.decode("latin-1")
    if not run or len(run) > MAX_RUN_CHARS or not run.isprintable():
        return _error_body(400, f"the X-STM-Run header (or the /run/<name>/v1 URL) must name 1 to {MAX_RUN_CHARS} printable characters")
    return run


async def _send_json(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)), *headers]})
    await send({"type": "http.response.body", "body": body})


def add_model_routes(app: FastAPI, settings: Settings, layer: MirrorLayer) -> None:
    """``GET /v1/models`` on ``app`` (the completion routes are :class:`ModelFront`'s, ahead of the app)."""
    started = int(time.time())

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        # the models answered so far and every model named without a pattern in llm.upstreams
        named = {p for u in settings.llm.upstreams for p in u.models if not any(c in p for c in "*?[")}
        counted = await anyio.to_thread.run_sync(layer.stats.model_snapshot)
        # the models that answered (a made-up name asked for is no model: it never gets here, see Stats.count_model)
        seen = {m for m, row in counted.items() if m not in ("(other)", "(none)") and
                (row["hits"] or row["upstream_calls"] or row.get("recorded") or row.get("replaced"))}
        data = [{"id": m, "object": "model", "created": started, "owned_by": "stabletoolbench-mirror"}
                for m in sorted(named | seen)]
        return JSONResponse({"object": "list", "data": data})
