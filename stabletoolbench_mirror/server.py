"""The HTTP server: StableToolBench's ``POST /virtual`` plus ``GET /health`` and ``GET /stats``."""

from __future__ import annotations

import hmac
import json
import logging
import threading
from collections import Counter
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from . import __version__, protocol
from .config import Settings
from .layer import MirrorLayer, Outcome

log = logging.getLogger(__name__)
JSON = "application/json"


class _ClientLimiter:
    """Caps the requests one client address has in flight; more are refused at once (HTTP 429)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._in_flight: Counter[str] = Counter()

    def enter(self, client: str) -> bool:
        with self._lock:
            if self._in_flight[client] >= self.limit:
                return False
            self._in_flight[client] += 1
            return True

    def leave(self, client: str) -> None:
        with self._lock:
            self._in_flight[client] -= 1
            if self._in_flight[client] <= 0:
                del self._in_flight[client]


def _error(status: int, message: str) -> Response:
    return Response(protocol.encode_answer(protocol.answer(message, "")), status_code=status, media_type=JSON)


def _serve(outcome: Outcome) -> Response:
    headers = {"X-STM-Outcome": outcome.kind}
    if outcome.source:
        headers["X-STM-Source"] = outcome.source
    return Response(outcome.body, status_code=outcome.status, media_type=JSON, headers=headers)


def create_app(settings: Settings, layer: MirrorLayer | None = None) -> FastAPI:
    """The FastAPI app serving ``layer`` (built from ``settings`` when not given)."""
    owned = layer is None

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        import anyio.to_thread

        # misses wait on the real API or the simulator in worker threads
        anyio.to_thread.current_default_thread_limiter().total_tokens = max(
            40, settings.limits.max_pending_misses + 32
        )
        try:
            yield
        finally:
            if owned:
                app.state.layer.close()

    app = FastAPI(title="stabletoolbench-mirror", version=__version__, lifespan=lifespan)
    app.state.layer = layer if layer is not None else MirrorLayer.from_settings(settings)
    app.state.settings = settings
    token = settings.auth_token.get_secret_value().encode() if settings.auth_token else None
    limiter = _ClientLimiter(settings.limits.max_in_flight_per_client)
    max_body = settings.limits.max_body_bytes

    @app.middleware("http")
    async def guard(request: Request, call_next: Any) -> Response:
        if token is not None:
            given = request.headers.get("authorization", "")
            scheme, _, value = given.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(value.strip().encode(), token):
                return _error(401, "missing or wrong bearer token")
        client = request.client.host if request.client else "?"
        if not limiter.enter(client):
            return _error(429, "too many requests in flight from this client")
        try:
            return await call_next(request)
        finally:
            limiter.leave(client)

    @app.post("/virtual")
    async def virtual(request: Request) -> Response:
        declared = request.headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > max_body):
            return _error(413, f"request body larger than {max_body} bytes")
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > max_body:
                return _error(413, f"request body larger than {max_body} bytes")
        try:
            payload = json.loads(bytes(body).decode("utf-8"))
        except UnicodeDecodeError:
            return _error(400, "request body is not UTF-8")
        except (ValueError, RecursionError):
            return _error(400, "request body is not JSON")
        if not isinstance(payload, dict):
            return _error(422, "request body must be a JSON object")
        outcome = await run_in_threadpool(app.state.layer.handle_payload, payload)
        return _serve(outcome)

    @app.get("/health")
    async def health() -> JSONResponse:
        layer_: MirrorLayer = app.state.layer
        return JSONResponse(
            {
                "status": "ok",
                "version": __version__,
                "mode": layer_.mode,
                "store": layer_.store.kind,
                "frozen_caches": len(layer_.frozen),
                "responders": [r.source for r in layer_.responders],
            }
        )

    @app.get("/stats")
    async def stats() -> JSONResponse:
        return JSONResponse(app.state.layer.stats.snapshot())

    return app


def app_from_environment() -> FastAPI:
    """The app of a ``serve --workers N`` worker process (settings passed through the environment)."""
    import os

    from .cli import deserialize_settings
    from .logs import setup_logging

    settings = deserialize_settings(os.environ["STM_SERVE_SETTINGS_JSON"])
    setup_logging(settings.log_level, settings.secrets())
    return create_app(settings)
