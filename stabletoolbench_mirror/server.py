"""The HTTP server: StableToolBench's ``POST /virtual`` plus ``GET /health`` and ``GET /stats``.

``/virtual`` is the hot path and is served by a small pure-ASGI front (:class:`_Front`)
ahead of FastAPI's routing: hits on a local store are answered on the event loop,
misses wait for the real API or the simulator in worker threads.  Every other route
is a plain FastAPI route.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import threading
from collections import Counter
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

import anyio.to_thread
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from . import __version__, protocol
from .config import Settings
from .layer import MirrorLayer, Outcome

log = logging.getLogger(__name__)


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


def _error(status: int, message: str) -> Outcome:
    return Outcome(protocol.encode_answer(protocol.answer(message, "")), "rejected", status=status)


async def _send(send: Any, outcome: Outcome, extra_headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    body = outcome.body.encode("utf-8")
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"x-stm-outcome", outcome.kind.encode()),
        *extra_headers,
    ]
    if outcome.source:
        headers.append((b"x-stm-source", outcome.source.encode()))
    if outcome.failure:
        headers.append((b"x-stm-failure", b"true"))
    await send({"type": "http.response.start", "status": outcome.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class _Front:
    """Pure ASGI front: bearer token and per-client in-flight limit on every route, then ``/virtual``."""

    def __init__(self, app: Any, layer: MirrorLayer, token: bytes | None, limiter: _ClientLimiter, max_body: int) -> None:
        self.app = app
        self.layer = layer
        self.token = token
        self.limiter = limiter
        self.max_body = max_body

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.token is not None and not self._authorized(scope):
            await _send(send, _error(401, "missing or wrong bearer token"))
            return
        client = scope["client"][0] if scope.get("client") else "?"
        if not self.limiter.enter(client):
            await _send(send, _error(429, "too many requests in flight from this client"))
            return
        try:
            if scope["path"] != "/virtual":
                await self.app(scope, receive, send)
            elif scope["method"] != "POST":
                await _send(send, _error(405, "use POST /virtual"), ((b"allow", b"POST"),))
            else:
                try:
                    outcome = await self._virtual(scope, receive)
                except Exception:  # a bug, never bad input: still a JSON answer, and logged with its trace
                    log.exception("internal error while answering /virtual")
                    outcome = _error(500, "stabletoolbench-mirror: internal error (see the server log)")
                await _send(send, outcome)
        finally:
            self.limiter.leave(client)

    def _authorized(self, scope: dict[str, Any]) -> bool:
        assert self.token is not None
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                scheme, _, given = value.partition(b" ")
                return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), self.token)
        return False

    async def _virtual(self, scope: dict[str, Any], receive: Any) -> Outcome:
        too_large = _error(413, f"request body larger than {self.max_body} bytes")
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and (not value.isdigit() or int(value) > self.max_body):
                return too_large
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return _error(400, "the client went away")
            body += message.get("body", b"")
            if len(body) > self.max_body:
                return too_large
            if not message.get("more_body"):
                break
        try:
            payload = json.loads(body.decode("utf-8"))
        except UnicodeDecodeError:
            return _error(400, "request body is not UTF-8")
        except (ValueError, RecursionError):
            return _error(400, "request body is not JSON")
        if not isinstance(payload, dict):
            return _error(422, "request body must be a JSON object")
        layer = self.layer
        prepared = layer.prepare(payload)
        if isinstance(prepared, Outcome):
            return prepared
        if layer.lookups_are_local:
            # a hit on a local store costs microseconds: answer it without a thread hop
            hit = layer.cached(prepared)
            if hit is not None:
                return hit
        else:
            # a remote store (Redis) is read on the event loop too: no thread hop for a hit
            hit = await layer.cached_async(prepared)
            if hit is not None:
                return hit
        return await anyio.to_thread.run_sync(layer.handle_call, prepared)


def create_app(settings: Settings, layer: MirrorLayer | None = None) -> FastAPI:
    """The app serving ``layer`` (built from ``settings`` when not given; then closed with the app)."""
    owned = layer is None
    layer = layer if layer is not None else MirrorLayer.from_settings(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # misses wait on the real API or the simulator in worker threads
        anyio.to_thread.current_default_thread_limiter().total_tokens = max(40, settings.limits.max_pending_misses + 32)
        try:
            yield
        finally:
            if owned:
                layer.close()

    app = FastAPI(title="stabletoolbench-mirror", version=__version__, lifespan=lifespan)
    app.state.layer = layer
    app.state.settings = settings
    token = settings.auth_token.get_secret_value().encode() if settings.auth_token else None
    app.add_middleware(
        _Front,
        layer=layer,
        token=token,
        limiter=_ClientLimiter(settings.limits.max_in_flight_per_client),
        max_body=settings.limits.max_body_bytes,
    )

    @app.get("/health")
    async def health() -> JSONResponse:
        return JSONResponse(
            {
                "status": "ok",
                "version": __version__,
                "mode": layer.mode,
                "store": layer.store.kind,
                "frozen_caches": len(layer.frozen),
                "responders": [r.source for r in layer.responders],
            }
        )

    @app.get("/stats")
    async def stats() -> JSONResponse:
        return JSONResponse(layer.stats.snapshot())

    return app


def app_from_environment() -> FastAPI:
    """The app of a ``serve --workers N`` worker process (settings passed through the environment)."""
    from .cli import deserialize_settings
    from .logs import setup_logging

    settings = deserialize_settings(os.environ["STM_SERVE_SETTINGS_JSON"])
    setup_logging(settings.log_level, settings.secrets())
    try:
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
