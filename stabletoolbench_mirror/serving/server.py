"""The HTTP server: StableToolBench's ``POST /virtual`` plus ``GET /health`` and ``GET /stats``.

``/virtual`` is the hot path and is served by a small pure-ASGI front (:class:`.asgi_front.Front`)
ahead of FastAPI's routing: hits on a local store are answered on the event loop,
misses wait for the real API or the simulator in worker threads (:class:`.call_path.CallPath`).
Every other route is a plain FastAPI route.  uvicorn's connection layer (timeouts, joined writes,
:func:`uvicorn_options`) is :mod:`.uvicorn_protocol`'s; this module builds the app (:func:`create_app`).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.to_thread
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Receive, Scope, Send

from stabletoolbench_mirror import __version__
from stabletoolbench_mirror.config import ConfigError, Settings
from stabletoolbench_mirror.core import protocol
from stabletoolbench_mirror.core.fair import FairLimiter
from stabletoolbench_mirror.core.logs import clip
from stabletoolbench_mirror.engine import sessions
from stabletoolbench_mirror.engine.layer import MirrorLayer
from stabletoolbench_mirror.engine.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from stabletoolbench_mirror.engine.responders import Prompted
from stabletoolbench_mirror.factory import build_layer
from stabletoolbench_mirror.serving.admission import Admission, ForwardedFor
from stabletoolbench_mirror.serving.asgi_front import Front
from stabletoolbench_mirror.serving.call_path import CallPath as CallPath
from stabletoolbench_mirror.serving.memory import tune_malloc
from stabletoolbench_mirror.serving.model_front import ModelFront, add_model_routes, build_model_calls
from stabletoolbench_mirror.serving.uvicorn_protocol import GuardedHttpProtocol as GuardedHttpProtocol
from stabletoolbench_mirror.serving.uvicorn_protocol import uvicorn_options as uvicorn_options

log = logging.getLogger(__name__)


class _App(FastAPI):
    """FastAPI with :class:`Front` ahead of its own middleware stack (error, telemetry and body-limit
    layers that cost a hit more than the rest of its path); lifespan events go to FastAPI itself."""

    front: Front | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.front is None or scope["type"] != "http":
            await super().__call__(scope, receive, send)
        else:
            await self.front(scope, receive, send)

    async def routed(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Every route but ``/virtual``: FastAPI's middleware stack and routing."""
        await super().__call__(scope, receive, send)


def create_app(settings: Settings, layer: MirrorLayer | None = None) -> FastAPI:
    """The app serving ``layer`` (built from ``settings`` when not given; then closed with the app)."""
    tune_malloc()  # before the worker threads that parse frozen files exist
    owned = layer is None
    mcp_front = None
    if settings.mcp.enabled or settings.mcp_servers:  # the MCP front (``mcp`` extra): its tool lists are read, or fail, before anything starts
        from stabletoolbench_mirror.serving.mcp_front import McpFront

        mcp_front = McpFront.from_settings(settings)
    layer = layer if layer is not None else build_layer(settings)
    # 32 more threads only for clients with nothing running: threads held by other clients' misses
    # (waiting for the simulator) never keep a client's first call waiting for one to finish
    threads = FairLimiter(max(40, settings.limits.max_pending_misses + 32), reserve=32)
    live = None
    try:
        model_calls = build_model_calls(settings, layer, threads)  # /v1: the agent's and the judge's model calls
        if mcp_front is not None:  # the live MCP servers (mcp_servers): their tools at /mcp
            live = _live_front(settings, layer, mcp_front, model_calls.run, threads)
    except Exception:
        if owned:
            layer.close()
        raise

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # misses wait on the real API or the simulator in worker threads: /virtual's, shared fairly
        # between clients (threads), as are frozen files parsed; the other routes use anyio's default
        anyio.to_thread.current_default_thread_limiter().total_tokens = max(40, settings.limits.max_pending_misses + 32)
        try:
            if live is not None:  # the live servers started and listed (or their listings read) before /mcp answers
                await anyio.to_thread.run_sync(live.start)
            if mcp_front is None:
                yield
            else:
                async with mcp_front.running():
                    yield
        finally:
            if live is not None:
                await anyio.to_thread.run_sync(live.close)
            model_calls.close()
            if owned:
                layer.close()

    app = _App(title="stabletoolbench-mirror", version=__version__, lifespan=lifespan)
    app.state.layer = layer
    app.state.model_calls = model_calls
    app.state.settings = settings
    token = settings.auth_token.get_secret_value().encode() if settings.auth_token else None
    for tier in layer.tiers:
        tier.use_threads(threads)  # a frozen file's first parse: one more kind of blocking work, shared fairly
    path = CallPath(layer, threads)
    admission = Admission(
        settings.limits.max_in_flight_per_client,
        max_queued_bytes=settings.limits.max_queued_bytes,
        queue_timeout_s=settings.limits.queue_timeout_s,
    )
    if mcp_front is not None:
        mcp_front.mount(app, path, admission)
    app.front = Front(
        app.routed,
        path=path,
        layer=layer,
        token=token,
        admission=admission,
        max_body=settings.limits.max_body_bytes,
        body_timeout_s=settings.limits.body_timeout_s,
        proxies=ForwardedFor(settings.limits.trusted_proxies) if settings.limits.trusted_proxies else None,
    )
    # /v1 takes the same way in as /virtual (body limits, reservation, a client's slots): the front's own
    app.front.models = ModelFront(model_calls, settings, app.routed, app.front)
    if mcp_front is not None:
        app.front.mcp = mcp_front.endpoint  # /mcp ahead of FastAPI's middleware stack too (its bearer token checked above)

    @app.get("/health")
    async def health() -> JSONResponse:
        # "degraded" while the store cannot be read or written (answers are served unrecorded)
        return JSONResponse(
            {
                **layer.health.report(),
                "version": __version__,
                "mode": layer.mode,
                "store": layer.store.kind,
                "frozen_caches": len(layer.frozen),
                "responders": [r.source for r in layer.responders],
                "simulator_prompt": _simulator_prompt(layer),
            }
        )

    worker = {"x-stm-worker": str(os.getpid())}

    @app.get("/stats")
    async def stats() -> JSONResponse:
        # with --workers N the counts of every worker are read from their shared files: off the loop
        snapshot = await anyio.to_thread.run_sync(layer.stats.snapshot)
        # the responders' own counters (simulator: parse retries; shadow: shadow answers)
        for responder in layer.event_counters:
            snapshot.update(responder.stats())
        return JSONResponse(snapshot, headers=worker)

    @app.get("/metrics")
    async def metrics() -> Response:
        """Every counter in the Prometheus text format, summed over all workers."""
        body = await anyio.to_thread.run_sync(layer.stats.exposition)
        return Response(body, media_type=METRICS_CONTENT_TYPE, headers=worker)

    _add_session_routes(app, layer, settings)
    add_model_routes(app, settings, layer)
    _answer_unknown_routes(app)
    return app


def _live_front(settings: Settings, layer: MirrorLayer, mcp_front: Any, run: str, threads: FairLimiter) -> Any:
    """The live MCP servers' front (``None`` without any), set on the MCP front; :class:`ConfigError` when ``/mcp``
    would offer no tool at all (neither tool docs nor live servers, nor a snapshot's)."""
    from stabletoolbench_mirror.serving.mcp_live_front import LiveFront

    live = mcp_front.live = LiveFront.build(settings, layer, run, threads)
    if live is None and not mcp_front.catalog.everything and not settings.tools_folder and settings.apibank is None:
        from stabletoolbench_mirror.serving.mcp_catalog import NEEDS_DOCS

        raise ConfigError(NEEDS_DOCS)
    return live


def _simulator_prompt(layer: MirrorLayer) -> dict[str, str] | None:
    """The simulator's style and system prompt source and sha256 (``None`` without a simulator)."""
    for responder in layer.responders:
        if isinstance(responder, Prompted):
            return {"style": responder.style, **responder.prompt.describe()}
    return None


# -- unknown routes ------------------------------------------------------------------------------

#: what an unknown route answers: StableToolBench's client must post to ``.../virtual``
NO_ROUTE_HINT = "StableToolBench's client must POST /virtual (does SERVICE_URL end in /virtual?)"


def _answer_unknown_routes(app: FastAPI) -> None:
    """A JSON ``{"error", "response"}`` answer naming ``POST /virtual`` for a route that does not exist.

    The first such request of a process is also logged once, as a WARNING (a misconfigured
    ``SERVICE_URL`` sends every call there).
    """
    logged = [False]  # the handler runs on the event loop: no lock needed

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        where = f"{request.method} {clip(request.url.path)}"
        if exc.status_code == 404:
            message = f"no route {where}: {NO_ROUTE_HINT}"
            if not logged[0]:
                logged[0] = True
                log.warning("a request to %s found no route (later ones are not logged): %s", where, NO_ROUTE_HINT)
        elif exc.status_code == 405:
            message = f"method not allowed: {where}; {NO_ROUTE_HINT}"
        else:
            message = str(exc.detail)
        return JSONResponse(protocol.answer(message, ""), status_code=exc.status_code, headers=exc.headers)


def _add_session_routes(app: FastAPI, layer: MirrorLayer, settings: Settings) -> None:
    """``POST /sessions``, ``GET /sessions/{id}``, ``DELETE /sessions/{id}`` (see :mod:`.sessions`)."""
    from stabletoolbench_mirror.stores import StoreError

    def fail(status: int, message: str) -> JSONResponse:
        return JSONResponse(protocol.answer(message, ""), status_code=status)

    def run(fn: Any, *args: Any) -> JSONResponse:
        if layer.sessions is None:
            return fail(404, "sessions are not available on this server")
        try:
            return fn(layer.sessions, *args)
        except sessions.SessionError as exc:
            return fail(exc.status, exc.message)
        except StoreError as exc:
            return fail(503, f"stabletoolbench-mirror: the response store is unavailable: {exc}")

    @app.post("/sessions")
    async def create_session(request: Request) -> JSONResponse:
        body = await _read_capped(request, settings.limits.max_body_bytes)
        if isinstance(body, JSONResponse):
            return body
        task = ""
        if body.strip():
            try:
                data = json.loads(body.decode("utf-8"))
            except (UnicodeDecodeError, ValueError, RecursionError):
                return fail(400, "request body is not JSON")
            if not isinstance(data, dict) or set(data) - {"task"} or not isinstance(data.get("task", ""), str):
                return fail(422, 'the body of POST /sessions is {"task": "<free text>"} (optional)')
            task = data.get("task", "")
            if not protocol.is_encodable(task):
                return fail(422, "task contains a lone UTF-16 surrogate")

        def create(s: sessions.Sessions) -> JSONResponse:
            doc = s.create(task)
            return JSONResponse({"id": doc["id"], "task": doc["task"]}, status_code=201)

        return await anyio.to_thread.run_sync(run, create)

    @app.get("/sessions/{session_id:path}")
    def get_session(session_id: str) -> JSONResponse:
        return run(lambda s: JSONResponse(sessions.public_view(s.get(session_id))))

    @app.delete("/sessions/{session_id:path}")
    def delete_session(session_id: str) -> JSONResponse:
        def delete(s: sessions.Sessions) -> JSONResponse:
            s.delete(session_id)
            return JSONResponse({"id": session_id, "deleted": True})

        return run(delete)


async def _read_capped(request: Any, limit: int) -> bytes | JSONResponse:
    """The request body, or a 413 answer when it is larger than ``limit`` bytes."""
    too_large = JSONResponse(protocol.answer(f"request body larger than {limit} bytes", ""), status_code=413)
    length = request.headers.get("content-length")
    if length is not None and (not length.isdigit() or int(length) > limit):
        return too_large
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            return too_large
    return bytes(body)


def app_from_environment() -> FastAPI:
    """The app of a ``serve --workers N`` worker process (settings handed over in a private file, see :mod:`.handoff`)."""
    from stabletoolbench_mirror.core.logs import setup_logging
    from stabletoolbench_mirror.serving.handoff import ENV, read_settings_file

    try:
        settings = read_settings_file(os.environ[ENV])
        setup_logging(settings.log_level, settings.secrets(), settings.resolve(settings.log_file) if settings.log_file else None)
        app = create_app(settings)
    except Exception:
        # uvicorn's supervisor restarts a dead worker forever, but stops on this exit code
        from uvicorn.config import STARTUP_FAILURE

        log.exception("worker %d cannot start", os.getpid())
        raise SystemExit(STARTUP_FAILURE) from None
    freeze_startup_objects()
    return app


def freeze_startup_objects() -> None:
    """Leave the objects of imports and app setup out of later garbage collections.

    A full collection otherwise walks them all (tens of ms), which is most of a busy
    server's latency tail.  For server processes only: objects frozen here are never collected.
    """
    import gc

    gc.collect()
    gc.freeze()
