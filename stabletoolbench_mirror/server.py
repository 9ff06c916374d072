"""The HTTP server: StableToolBench's ``POST /virtual`` plus ``GET /health`` and ``GET /stats``.

``/virtual`` is the hot path and is served by a small pure-ASGI front (:class:`_Front`)
ahead of FastAPI's routing: hits on a local store are answered on the event loop,
misses wait for the real API or the simulator in worker threads.  Every other route
is a plain FastAPI route.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import json
import logging
import os
import time
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

import anyio
import anyio.to_thread
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from . import __version__, protocol
from .admission import Admission, Refused
from .config import Settings
from .layer import MirrorLayer, Outcome

log = logging.getLogger(__name__)


def _error(status: int, message: str) -> Outcome:
    return _rejected(status, message)


def _rejected(status: int, message: str, kind: str = "rejected") -> Outcome:
    return Outcome(protocol.encode_answer(protocol.answer(message, "")), kind, status=status)


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


class _RefusalLog:
    """Logs the first refusal for each limit, then at most one summary a minute: never a line per request."""

    def __init__(self, interval_s: float = 60.0) -> None:
        self.interval_s = interval_s
        self._last: dict[str, float] = {}
        self._since: dict[str, int] = {}

    def refused(self, status: int, reason: str, setting: str) -> None:
        now = time.monotonic()
        self._since[setting] = self._since.get(setting, 0) + 1
        last = self._last.get(setting)
        if last is None or now - last >= self.interval_s:
            count = self._since.pop(setting)
            self._last[setting] = now
            log.warning(
                "refused %d request(s) with HTTP %d: %s; raise %s if clients really send this much",
                count, status, reason, setting,
            )


class _Front:
    """Pure ASGI front: bearer token on every route, then ``/virtual``: body read, admission, answer."""

    def __init__(self, app: Any, layer: MirrorLayer, token: bytes | None, admission: Admission, max_body: int, body_timeout_s: float) -> None:
        self.app = app
        self.layer = layer
        self.token = token
        self.admission = admission
        self.max_body = max_body
        self.body_timeout_s = body_timeout_s
        self.refusals = _RefusalLog()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.token is not None and not self._authorized(scope):
            await _send(send, _error(401, "missing or wrong bearer token"))
            return
        if scope["path"] != "/virtual":
            await self.app(scope, receive, send)
            return
        if scope["method"] != "POST":
            await _send(send, _error(405, "use POST /virtual"), ((b"allow", b"POST"),))
            return
        # the body is read before a slot is taken: a client that stalls mid-body holds no slot,
        # and is cut off after limits.body_timeout_s
        body = await self._read_body(scope, receive)
        if isinstance(body, Outcome):
            await _send(send, body, ((b"connection", b"close"),) if body.status == 408 else ())
            return
        client = scope["client"][0] if scope.get("client") else "?"
        try:
            await self.admission.enter(client, len(body))
        except Refused as refusal:
            self.layer.stats.count_refusal(refusal.setting)
            self.refusals.refused(503, str(refusal), refusal.setting)
            message = f"stabletoolbench-mirror is overloaded ({refusal}); the server's {refusal.setting} setting bounds this"
            await _send(send, _rejected(503, message, "overloaded"), ((b"retry-after", b"5"),))
            return
        try:
            try:
                outcome = await self._virtual(body)
            except Exception:  # a bug, never bad input: still a JSON answer, and logged with its trace
                log.exception("internal error while answering /virtual")
                outcome = _error(500, "stabletoolbench-mirror: internal error (see the server log)")
            await _send(send, outcome)
        finally:
            self.admission.leave(client)

    def _authorized(self, scope: dict[str, Any]) -> bool:
        assert self.token is not None
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                scheme, _, given = value.partition(b" ")
                return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), self.token)
        return False

    async def _read_body(self, scope: dict[str, Any], receive: Any) -> bytes | Outcome:
        too_large = _error(413, f"request body larger than {self.max_body} bytes")
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and (not value.isdigit() or int(value) > self.max_body):
                return too_large
        body = bytearray()
        try:
            with anyio.fail_after(self.body_timeout_s):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return _error(400, "the client went away")
                    body += message.get("body", b"")
                    if len(body) > self.max_body:
                        return too_large
                    if not message.get("more_body"):
                        return bytes(body)
        except TimeoutError:
            self.layer.stats.count_refusal("limits.body_timeout_s")
            self.refusals.refused(408, "the request body did not arrive in time", "limits.body_timeout_s")
            return _error(408, f"the request body did not arrive within {self.body_timeout_s:g} s (limits.body_timeout_s)")

    async def _virtual(self, body: bytes) -> Outcome:
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


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol plus a header timeout.

    uvicorn closes idle keep-alive connections (``timeout_keep_alive``) but waits forever for a
    request whose headers never finish; this closes such a connection after ``header_timeout_s``.
    """

    def __init__(self, *args: Any, header_timeout_s: float = 10.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.header_timeout_s = header_timeout_s
        self._header_timer: asyncio.TimerHandle | None = None

    def _arm_header_timer(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._header_timed_out)

    def _disarm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timed_out(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing():
            self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_timer()  # a connection that sends nothing at all

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm_header_timer()  # the next request on a kept-alive connection

    def on_headers_complete(self) -> None:
        self._disarm_header_timer()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_timer()
        super().connection_lost(exc)


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """The uvicorn settings that guard connections: the header timeout and the keep-alive timeout."""
    limits = settings.limits
    return {
        "http": functools.partial(GuardedHttpProtocol, header_timeout_s=limits.header_timeout_s),
        "timeout_keep_alive": limits.keep_alive_timeout_s,
    }


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
        admission=Admission(
            settings.limits.max_in_flight_per_client,
            max_queued=settings.limits.max_queued_requests,
            max_queued_bytes=settings.limits.max_queued_bytes,
            queue_timeout_s=settings.limits.queue_timeout_s,
        ),
        max_body=settings.limits.max_body_bytes,
        body_timeout_s=settings.limits.body_timeout_s,
    )

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
