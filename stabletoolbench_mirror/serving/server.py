"""The HTTP server: StableToolBench's ``POST /virtual`` plus ``GET /health`` and ``GET /stats``.

``/virtual`` is the hot path and is served by a small pure-ASGI front (:class:`_Front`)
ahead of FastAPI's routing: hits on a local store are answered on the event loop,
misses wait for the real API or the simulator in worker threads.  Every other route
is a plain FastAPI route.
"""

from __future__ import annotations

import asyncio
import fcntl
import functools
import hmac
import json
import logging
import os
import struct
import termios
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, cast

import anyio
import anyio.to_thread
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from stabletoolbench_mirror import __version__
from stabletoolbench_mirror.config import Settings
from stabletoolbench_mirror.core import fair, protocol
from stabletoolbench_mirror.core.call import ToolCall
from stabletoolbench_mirror.core.fair import FairLimiter
from stabletoolbench_mirror.core.logs import clip
from stabletoolbench_mirror.core.outcomes import Outcome, OutcomeKind
from stabletoolbench_mirror.engine import sessions
from stabletoolbench_mirror.engine.faults import wants_no_faults
from stabletoolbench_mirror.engine.layer import MirrorLayer
from stabletoolbench_mirror.engine.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from stabletoolbench_mirror.engine.responders import Prompted
from stabletoolbench_mirror.factory import build_layer
from stabletoolbench_mirror.serving.admission import REQUEST_OVERHEAD, Admission, ForwardedFor, Refused
from stabletoolbench_mirror.serving.memory import tune_malloc
from stabletoolbench_mirror.serving.prepared import PreparedCalls

log = logging.getLogger(__name__)


_CONTENT_TYPE = (b"content-type", b"application/json")
#: the header pairs an answer names its outcome and source with, made once (the same bytes every time)
_OUTCOME_HEADERS = {kind: (b"x-stm-outcome", kind.encode()) for kind in OutcomeKind}
_SOURCE_HEADERS: dict[str, tuple[bytes, bytes]] = {}


def _source_header(source: str) -> tuple[bytes, bytes]:
    header = _SOURCE_HEADERS.get(source)
    if header is None:
        header = (b"x-stm-source", source.encode())
        if len(_SOURCE_HEADERS) < 64:  # a handful of sources: bounded all the same
            _SOURCE_HEADERS[source] = header
    return header


async def _send(send: Send, outcome: Outcome, extra_headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    body = outcome.body.encode("utf-8")
    headers = [_CONTENT_TYPE, (b"content-length", b"%d" % len(body)), _OUTCOME_HEADERS[outcome.kind], *extra_headers]
    if outcome.source:
        headers.append(_source_header(outcome.source))
    if outcome.failure:
        headers.append((b"x-stm-failure", b"true"))
    if outcome.fault is not None:
        headers.append((b"x-stm-fault", outcome.fault.encode()))
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


class _App(FastAPI):
    """FastAPI with :class:`_Front` ahead of its own middleware stack (error, telemetry and body-limit
    layers that cost a hit more than the rest of its path); lifespan events go to FastAPI itself."""

    front: _Front | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.front is None or scope["type"] != "http":
            await super().__call__(scope, receive, send)
        else:
            await self.front(scope, receive, send)

    async def routed(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Every route but ``/virtual``: FastAPI's middleware stack and routing."""
        await super().__call__(scope, receive, send)


class _Front:
    """Pure ASGI front: bearer token on every route, then ``/virtual``: body read, admission, answer."""

    def __init__(
        self, app: ASGIApp, layer: MirrorLayer, token: bytes | None, admission: Admission, max_body: int, body_timeout_s: float,
        threads: FairLimiter | None = None, path: CallPath | None = None, proxies: ForwardedFor | None = None,
    ) -> None:
        self.app = app
        self.proxies = proxies
        """``limits.trusted_proxies``: who the client behind them is (``None``: the connecting address)."""
        self.layer = layer
        self.path = path or CallPath(layer, threads or FairLimiter(40))
        """The path from a parsed payload to its counted answer (shared with the MCP front)."""
        self.threads = self.path.threads
        self.token = token
        self.admission = admission
        self.max_body = max_body
        self.body_timeout_s = body_timeout_s
        self.refusals = _RefusalLog()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.proxies is not None and scope.get("client"):  # for every route: /virtual's limits and /mcp's
            scope["client"] = (self.proxies.client(scope["client"][0], scope["headers"]), scope["client"][1])
        if self.token is not None and not self._authorized(scope):
            await _send(send, Outcome.error(401, "missing or wrong bearer token"))
            return
        if scope["path"] != "/virtual":
            await self.app(scope, receive, send)
            return
        if scope["method"] != "POST":
            await self._finish(send, Outcome.error(405, "use POST /virtual"), ((b"allow", b"POST"),))
            return
        # the body is read before a slot is taken: a client that stalls mid-body holds no slot,
        # and is cut off after limits.body_timeout_s; its bytes count against limits.max_queued_bytes
        # from its headers until it has a slot
        client = scope["client"][0] if scope.get("client") else "?"
        fair.CLIENT.set(client)  # this request's task (and its worker threads) work for this client
        reservation = _Reservation(self.admission)
        try:
            body = await self._read_body(scope, receive, reservation)
            if isinstance(body, Outcome):
                await self._finish(send, body, _REFUSAL_HEADERS if body.kind is OutcomeKind.REFUSED and body.status == 503
                                   else ((b"connection", b"close"),) if body.status == 408 else ())
                return
            try:
                await self.admission.enter(client)
            except Refused as refusal:
                await self._finish(send, self._refused(refusal), _REFUSAL_HEADERS)
                return
        finally:
            reservation.release()
        try:
            faults = self.layer.faults is not None and not wants_no_faults(scope.get("headers", ()))
            await _send(send, await self.path.answer_body(body, _session_header(scope), faults))  # counted there
        finally:
            self.admission.leave(client)

    def _refused(self, refusal: Refused) -> Outcome:
        """The HTTP 503 answer to a request over a limit (logged at most once a minute per limit)."""
        self.refusals.refused(503, str(refusal), refusal.setting)
        message = f"stabletoolbench-mirror is overloaded ({refusal}); the server's {refusal.setting} setting bounds this"
        return Outcome.error(503, message, OutcomeKind.REFUSED, refusal.setting)

    async def _finish(self, send: Send, outcome: Outcome, extra_headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
        """Send the final answer of a ``/virtual`` request, counted here: once, by its outcome.

        (A request without the right bearer token is refused before it counts.)
        """
        self.layer.stats.count(outcome)
        await _send(send, outcome, extra_headers)

    def _too_large(self) -> Outcome:
        return Outcome.error(413, f"request body larger than {self.max_body} bytes")

    def _authorized(self, scope: Scope) -> bool:
        assert self.token is not None
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                scheme, _, given = value.partition(b" ")
                return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), self.token)
        return False

    async def _read_body(self, scope: Scope, receive: Receive, reservation: _Reservation) -> bytes | Outcome:
        """The body, or the answer that ends the request: too large, gone, too slow, or over ``max_queued_bytes``.

        The body's bytes (its ``Content-Length`` at once, else each chunk as it comes) are counted in
        ``reservation`` before they are read.
        """
        length: int | None = None
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                if not value.isdigit() or int(value) > self.max_body:
                    return self._too_large()
                length = int(value)
        try:
            reservation.add(REQUEST_OVERHEAD + (length or 0))
        except Refused as refusal:
            return self._refused(refusal)
        if _arrived(receive):  # the whole body is in: one receive, which cannot wait (no timer to set)
            return self._whole_body(await receive(), length, reservation)
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self.body_timeout_s):  # anyio's fail_after costs a hit ~10 us more
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return Outcome.error(400, "the client went away")
                    chunk = message.get("body", b"")
                    if chunk:
                        size += len(chunk)
                        if size > self.max_body:
                            return self._too_large()
                        if length is None or size > length:
                            reservation.add(len(chunk))
                        chunks.append(chunk)
                    if not message.get("more_body"):
                        return chunks[0] if len(chunks) == 1 else b"".join(chunks)
        except Refused as refusal:
            return self._refused(refusal)
        except TimeoutError:
            self.refusals.refused(408, "the request body did not arrive in time", "limits.body_timeout_s")
            late = f"the request body did not arrive within {self.body_timeout_s:g} s (limits.body_timeout_s)"
            return Outcome.error(408, late, OutcomeKind.REFUSED, "limits.body_timeout_s")


    def _whole_body(self, message: Any, length: int | None, reservation: _Reservation) -> bytes | Outcome:
        """:meth:`_read_body` for a body that had all arrived: the same checks, in one message."""
        if message["type"] == "http.disconnect":
            return Outcome.error(400, "the client went away")
        whole: bytes = message.get("body", b"")
        if len(whole) > self.max_body:
            return self._too_large()
        if length is None or len(whole) > length:
            try:
                reservation.add(len(whole))
            except Refused as refusal:
                return self._refused(refusal)
        return whole


def _arrived(receive: Receive) -> bool:
    """Whether a request's whole body has arrived: its next ``receive`` returns all of it at once.

    Only uvicorn's own cycle says so (its ``receive`` is a bound method); anything else is read
    chunk by chunk under ``limits.body_timeout_s``.
    """
    cycle = getattr(receive, "__self__", None)
    event = getattr(cycle, "message_event", None)
    return (event is not None and event.is_set() and getattr(cycle, "more_body", True) is False
            and not getattr(cycle, "waiting_for_100_continue", True))


def _parse_body(body: bytes) -> Any:
    """The decoded ``/virtual`` body, or the 400 answer to one that is not UTF-8 JSON."""
    try:
        return json.loads(body.decode("utf-8"))
    except UnicodeDecodeError:
        return Outcome.error(400, "request body is not UTF-8")
    except (ValueError, RecursionError):
        return Outcome.error(400, "request body is not JSON")


def _internal_error() -> Outcome:
    """The answer to a bug (never to bad input): still a JSON answer, and logged with its trace."""
    log.exception("internal error while answering /virtual")
    return Outcome.error(500, "stabletoolbench-mirror: internal error (see the server log)", OutcomeKind.ERROR)


class CallPath:
    """The one path from a ``/virtual`` call (and its session) to its answer, counted once.

    ``POST /virtual`` (:meth:`answer_body`) and the MCP front's tool calls (:meth:`answer`) both
    answer here: the same validation, keys, cache tiers, responders, records, sessions and faults,
    and one count in ``/stats`` and ``/metrics`` by the outcome.
    """

    def __init__(self, layer: MirrorLayer, threads: FairLimiter) -> None:
        self.layer = layer
        self.threads = threads
        # anyio only enters its limiter (``async with``), which a FairLimiter does as a CapacityLimiter would
        self._limiter = cast(anyio.CapacityLimiter, self.threads)
        """The worker threads of ``/virtual`` (local tools, sessions, store I/O, misses), shared fairly between clients."""
        self.calls = PreparedCalls()
        """The calls of bodies seen lately: a repeated body is not parsed again (:mod:`.prepared`)."""

    async def answer(self, payload: Any, session: str | None | Outcome = None, faults: bool = True) -> Outcome:
        """The answer to one decoded payload (a session id, ``None``, or the answer to a bad session id), counted.

        ``faults``: whether ``faults:`` may fault it (``check`` asks for clean answers with ``X-STM-Faults: off``).
        """
        try:
            prepared = self._prepare(payload, session)
            outcome = prepared if isinstance(prepared, Outcome) else await self._answer(prepared, session, faults)
        except Exception:
            outcome = _internal_error()
        self.layer.stats.count(outcome)
        return outcome

    async def answer_body(self, body: bytes, session: str | None | Outcome = None, faults: bool = True) -> Outcome:
        """:meth:`answer` for a ``/virtual`` body's bytes; a body seen lately skips its parse."""
        try:
            prepared: ToolCall | Outcome | None = self.calls.get(body)
            if prepared is None:
                payload = _parse_body(body)
                prepared = payload if isinstance(payload, Outcome) else self._prepare(payload, session)
                if isinstance(prepared, ToolCall):
                    self.calls.put(body, prepared)
            elif isinstance(session, Outcome):
                prepared = session
            outcome = prepared if isinstance(prepared, Outcome) else await self._answer(prepared, session, faults)
        except Exception:
            outcome = _internal_error()
        self.layer.stats.count(outcome)
        return outcome

    def _prepare(self, payload: Any, session: str | None | Outcome) -> ToolCall | Outcome:
        if not isinstance(payload, dict):
            return Outcome.error(422, "request body must be a JSON object")
        if isinstance(session, Outcome):
            return session
        return self.layer.prepare(payload)

    async def _answer(self, prepared: ToolCall, session: str | None | Outcome, faults: bool) -> Outcome:
        assert not isinstance(session, Outcome)  # answered by _prepare
        layer = self.layer
        if session is not None or layer.runs_locally(prepared):
            # a session's calls and local tools read and write state: always in a worker thread
            outcome = await anyio.to_thread.run_sync(layer.handle_call, prepared, session, limiter=self._limiter)
        else:
            # hits are answered on the event loop (a local store at once, Redis through its async
            # client); a frozen file not parsed yet is parsed in a thread while the loop goes on
            found = await layer.probe_async(prepared)
            if isinstance(found, Outcome):
                outcome = found
            else:  # a miss: what the lookup found goes along (the worker does not read the cache again)
                outcome = await anyio.to_thread.run_sync(layer.answer, prepared, {}, found, limiter=self._limiter)
        if layer.faults is not None and faults:
            # injected faults: on what is served, after the answer was recorded (see engine.faults)
            outcome = await layer.faults.serve(prepared, outcome, session is not None)
        return outcome


_REFUSAL_HEADERS = ((b"retry-after", b"5"),)


class _Reservation:
    """The bytes one request counts against ``limits.max_queued_bytes`` until it has a slot (see :mod:`.admission`)."""

    __slots__ = ("admission", "size")

    def __init__(self, admission: Admission) -> None:
        self.admission = admission
        self.size = 0

    def add(self, size: int) -> None:
        self.admission.reserve(size)  # Refused: nothing counted
        self.size += size

    def release(self) -> None:
        self.admission.release(self.size)
        self.size = 0


_SESSION_HEADER = sessions.HEADER.encode()


def _session_header(scope: Scope) -> str | None | Outcome:
    """The ``X-STM-Session`` id of a request, ``None`` without one, or the 422 answer to a bad one."""
    for name, value in scope.get("headers", ()):
        if name == _SESSION_HEADER:
            try:
                session_id = value.decode("utf-8")
            except UnicodeDecodeError:
                return Outcome.error(422, f"{sessions.HEADER}: not UTF-8")
            problem = sessions.id_problem(session_id)
            return Outcome.error(422, f"{sessions.HEADER}: {problem}") if problem else session_id
    return None


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol plus a header timeout and a send timeout.

    uvicorn closes idle keep-alive connections (``timeout_keep_alive``) but waits forever for a
    request whose headers never finish; this closes such a connection after ``header_timeout_s``.

    uvicorn hands a whole answer to the transport, which keeps what the socket does not take in
    its write buffer until the client reads it, and closing the connection waits for that buffer to
    drain: a client that never reads holds its answer for as long as it stays connected.  While the
    buffer holds anything, the unsent bytes are looked at every fifth of ``send_timeout_s``; a client
    that has read nothing for ``send_timeout_s`` is dropped (the connection aborted, its buffer freed).
    """

    def __init__(self, *args: Any, header_timeout_s: float = 10.0, send_timeout_s: float = 30.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.header_timeout_s = header_timeout_s
        self.send_timeout_s = send_timeout_s
        self._header_timer: asyncio.TimerHandle | None = None
        self._headers_since: float | None = None
        self._send_timer: asyncio.TimerHandle | None = None
        self._unsent = 0
        self._sent_at = 0.0

    def _arm_header_timer(self) -> None:
        # one timer per connection, not one per request: it is left running when the headers are
        # in, and on firing either closes the connection or waits for what is left of the next
        # request's header_timeout_s (a kept-alive connection's timer fires once a header_timeout_s)
        self._headers_since = self.loop.time()
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._header_check)

    def _disarm_header_timer(self) -> None:
        self._headers_since = None

    def _header_check(self) -> None:
        self._header_timer = None
        since = self._headers_since
        if since is None:
            return  # no request under way: the next one arms it again
        left = since + self.header_timeout_s - self.loop.time()
        if left > 0:
            self._header_timer = self.loop.call_later(left, self._header_check)
        elif not self.transport.is_closing():
            self.transport.close()

    def _watch_sending(self) -> None:
        """Look at the unsent bytes every fifth of ``send_timeout_s`` while the write buffer holds anything."""
        if self._send_timer is None and self.transport.get_write_buffer_size():
            self._unsent = self._unsent_bytes()
            self._sent_at = self.loop.time()
            self._send_timer = self.loop.call_later(self.send_timeout_s / 5, self._check_sending)

    def _unsent_bytes(self) -> int:
        """The answer bytes not yet taken by the client: the transport's buffer and the socket's send queue.

        The send queue counts: a client reading slowly drains the kernel's buffers long before the
        transport's buffer moves.  (Its size changes only when the client reads: uvicorn writes the
        next answer only once the buffer has drained.)
        """
        unsent = self.transport.get_write_buffer_size()
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            try:
                unsent += struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0]
            except (OSError, ValueError):
                pass
        return unsent

    def _check_sending(self) -> None:
        self._send_timer = None
        if not self.transport.get_write_buffer_size():
            return
        unsent = self._unsent_bytes()
        now = self.loop.time()
        if unsent != self._unsent:  # the client read some
            self._unsent, self._sent_at = unsent, now
        elif now - self._sent_at >= self.send_timeout_s * 0.999:
            log.debug("dropped a client that read nothing of its answer for %g s (%d bytes unsent; limits.send_timeout_s)",
                      self.send_timeout_s, unsent)
            self.transport.abort()
            return
        self._send_timer = self.loop.call_later(self.send_timeout_s / 5, self._check_sending)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_timer()  # a connection that sends nothing at all

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm_header_timer()  # the next request on a kept-alive connection

    def on_headers_complete(self) -> None:
        self._disarm_header_timer()
        existing = self.cycle
        super().on_headers_complete()
        if self.cycle is not None and self.cycle is not existing:
            JoinedWrites.wrap(self.cycle)  # its task has not run yet: nothing was written

    def pause_writing(self) -> None:
        super().pause_writing()
        self._watch_sending()  # the buffer went over the transport's high-water mark

    def on_response_complete(self) -> None:
        self._watch_sending()  # what is left of an answer below the high-water mark
        if self.cycle is not None and self.cycle.body:
            # the body of a request answered before it was read (refused, too large): uvicorn keeps
            # what had arrived (up to a read's worth, ~256 KB) for as long as the connection lasts, and
            # ignores the rest; nothing reads it after the answer
            self.cycle.body = bytearray()
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_timer()
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None
        super().connection_lost(exc)


class JoinedWrites:
    """The transport one request's uvicorn cycle writes through: an answer's status line and headers
    are written together with its body, in one ``write`` (one ``send`` and one TCP segment, not two).

    uvicorn writes the head of an answer at ``http.response.start`` and the body at
    ``http.response.body``; for a small answer the second write costs as much as the answer's own
    work.  The bytes on the wire are the same, in the same order.  Only the head of an answer with
    a ``Content-Length`` is held (a chunked stream's head goes out at once), and never past the
    next write, a close, or the end of the answer (a ``HEAD`` answer writes no body).
    """

    __slots__ = ("transport", "cycle", "held", "done", "on_response")

    def __init__(self, cycle: Any) -> None:
        self.transport = cycle.transport
        self.cycle = cycle
        self.held: bytes | None = None
        self.done = False
        self.on_response = cycle.on_response

    @classmethod
    def wrap(cls, cycle: Any) -> None:
        joined = cls(cycle)
        cycle.transport = joined
        cycle.on_response = joined.completed

    def write(self, data: bytes) -> None:
        if not self.done and self.cycle.response_started:  # the answer's head (a 100 Continue comes before it)
            self.done = True
            if self.cycle.chunked_encoding is False:
                self.held = data
                return
        held = self.held
        if held is not None:
            self.held = None
            data = held + data
        self.transport.write(data)

    def flush(self) -> None:
        held = self.held
        if held is not None:
            self.held = None
            self.transport.write(held)

    def close(self) -> None:
        self.flush()
        self.transport.close()

    def is_closing(self) -> bool:
        return bool(self.transport.is_closing())

    def completed(self) -> None:
        self.flush()
        self.on_response()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """The uvicorn settings that guard connections: the header, send and keep-alive timeouts, the trusted proxies."""
    limits = settings.limits
    return {
        "http": functools.partial(GuardedHttpProtocol, header_timeout_s=limits.header_timeout_s, send_timeout_s=limits.send_timeout_s),
        "timeout_keep_alive": limits.keep_alive_timeout_s,
        # uvicorn believes X-Forwarded-For from 127.0.0.1 by default, and takes a malformed hop as a client:
        # any local client could then pose as others (limits.max_in_flight_per_client, fair sharing).
        # _Front reads it instead, from limits.trusted_proxies only (admission.ForwardedFor)
        "proxy_headers": False,
        # uvicorn builds each access line's arguments (client, quoted path) before its logger drops it:
        # below log_level info no access line is written, so none is built
        "access_log": settings.log_level in ("debug", "info"),
    }


def create_app(settings: Settings, layer: MirrorLayer | None = None) -> FastAPI:
    """The app serving ``layer`` (built from ``settings`` when not given; then closed with the app)."""
    tune_malloc()  # before the worker threads that parse frozen files exist
    owned = layer is None
    mcp_front = None
    if settings.mcp.enabled:  # the MCP front (``mcp`` extra): its tool lists are read, or fail, before anything starts
        from stabletoolbench_mirror.serving.mcp_front import McpFront

        mcp_front = McpFront.from_settings(settings)
    layer = layer if layer is not None else build_layer(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # misses wait on the real API or the simulator in worker threads: /virtual's, shared fairly
        # between clients (threads), as are frozen files parsed; the other routes use anyio's default
        anyio.to_thread.current_default_thread_limiter().total_tokens = max(40, settings.limits.max_pending_misses + 32)
        try:
            if mcp_front is None:
                yield
            else:
                async with mcp_front.running():
                    yield
        finally:
            if owned:
                layer.close()

    app = _App(title="stabletoolbench-mirror", version=__version__, lifespan=lifespan)
    app.state.layer = layer
    app.state.settings = settings
    token = settings.auth_token.get_secret_value().encode() if settings.auth_token else None
    # 32 more threads only for clients with nothing running: threads held by other clients' misses
    # (waiting for the simulator) never keep a client's first call waiting for one to finish
    threads = FairLimiter(max(40, settings.limits.max_pending_misses + 32), reserve=32)
    for tier in layer.tiers:
        tier.use_threads(threads)  # a frozen file's first parse: one more kind of blocking work, shared fairly
    path = CallPath(layer, threads)
    admission = Admission(
        settings.limits.max_in_flight_per_client,
        max_queued=settings.limits.max_queued_requests,
        max_queued_bytes=settings.limits.max_queued_bytes,
        queue_timeout_s=settings.limits.queue_timeout_s,
    )
    if mcp_front is not None:
        mcp_front.mount(app, path, admission)
    app.front = _Front(
        app.routed,
        path=path,
        layer=layer,
        token=token,
        admission=admission,
        max_body=settings.limits.max_body_bytes,
        body_timeout_s=settings.limits.body_timeout_s,
        proxies=ForwardedFor(settings.limits.trusted_proxies) if settings.limits.trusted_proxies else None,
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
                "simulator_prompt": _simulator_prompt(layer),
            }
        )

    worker = {"x-stm-worker": str(os.getpid())}

    @app.get("/stats")
    async def stats() -> JSONResponse:
        # with --workers N the counts of every worker are read from their shared files: off the loop
        snapshot = await anyio.to_thread.run_sync(layer.stats.snapshot)
        return JSONResponse({**snapshot, **_responder_stats(layer)}, headers=worker)

    @app.get("/metrics")
    async def metrics() -> Response:
        """Every counter in the Prometheus text format, summed over all workers."""
        body = await anyio.to_thread.run_sync(layer.stats.exposition)
        return Response(body, media_type=METRICS_CONTENT_TYPE, headers=worker)

    _add_session_routes(app, layer, settings)
    _answer_unknown_routes(app)
    return app


def _responder_stats(layer: MirrorLayer) -> dict[str, Any]:
    """The responders' own counters (``simulator``: parse retries; ``shadow``: shadow answers)."""
    out: dict[str, Any] = {}
    for responder in layer.event_counters:
        out.update(responder.stats())
    return out


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
