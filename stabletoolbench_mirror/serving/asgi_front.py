"""The pure-ASGI front of ``POST /virtual`` (and of ``/v1``), ahead of FastAPI's routing, and the limits it keeps.

:class:`Front` checks the bearer token on every route, then for ``/virtual`` reads the body under
``limits.max_body_bytes`` and ``limits.body_timeout_s`` (its bytes counted against
``limits.max_queued_bytes`` until it has a slot, :class:`_Reservation`), takes a slot
(:mod:`.admission`), hands the body to :class:`.call_path.CallPath` and sends the answer with its
``X-STM-*`` headers.  A refused request is answered here, counted once, and logged at most once a
minute per limit (:class:`_RefusalLog`).  ``/v1`` and ``/run/<name>/v1`` go to the model-call front
(:class:`~.model_front.ModelFront`), whose posts take the same way in (:meth:`Front.admit`: the same body
read, reservation and slot, under ``llm.max_body_bytes``).  The app around it is :mod:`.server`'s.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from stabletoolbench_mirror.core import fair
from stabletoolbench_mirror.core.outcomes import Outcome, OutcomeKind
from stabletoolbench_mirror.engine import sessions
from stabletoolbench_mirror.engine.faults import wants_no_faults
from stabletoolbench_mirror.engine.layer import MirrorLayer
from stabletoolbench_mirror.serving.admission import REQUEST_OVERHEAD, Admission, ForwardedFor, Refused
from stabletoolbench_mirror.serving.call_path import CallPath

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

    def __init__(self) -> None:
        self._last: dict[str, float] = {}
        self._since: dict[str, int] = {}

    def refused(self, status: int, reason: str, setting: str) -> None:
        now = time.monotonic()
        self._since[setting] = self._since.get(setting, 0) + 1
        last = self._last.get(setting)
        if last is None or now - last >= 60.0:
            count = self._since.pop(setting)
            self._last[setting] = now
            log.warning(
                "refused %d request(s) with HTTP %d: %s; raise %s if clients really send this much",
                count, status, reason, setting,
            )

class Front:
    """Pure ASGI front: bearer token on every route, then ``/virtual``: body read, admission, answer (and
    ``/v1/...`` and ``/run/<name>/v1/...``, handed to the model-call front)."""

    def __init__(
        self, app: ASGIApp, layer: MirrorLayer, token: bytes | None, admission: Admission, max_body: int, body_timeout_s: float,
        path: CallPath, proxies: ForwardedFor | None = None,
    ) -> None:
        self.app = app
        self.models: ASGIApp | None = None
        """``/v1``'s handler (:class:`~.model_front.ModelFront`), ahead of the app as ``/virtual`` is."""
        self.mcp: ASGIApp | None = None
        """``/mcp``'s handler (:class:`~.mcp_front.McpFront`), ahead of the app as ``/virtual`` is."""
        self.proxies = proxies
        """``limits.trusted_proxies``: who the client behind them is (``None``: the connecting address)."""
        self.layer = layer
        self.path = path
        """The path from a parsed payload to its counted answer (shared with the MCP front)."""
        self.token = token
        self.admission = admission
        self.max_body = max_body
        self.body_timeout_s = body_timeout_s
        self.refusals = _RefusalLog()

    async def _other(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Every route but ``/virtual``: ``/v1`` and ``/mcp`` to their fronts, the rest to the app."""
        path = scope["path"]
        if self.models is not None and path.startswith(("/v1/", "/run/")):
            await self.models(scope, receive, send)
        elif self.mcp is not None and (path == "/mcp" or path.startswith("/mcp/")):
            await self.mcp(scope, receive, send)
        else:
            await self.app(scope, receive, send)

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
            await self._other(scope, receive, send)
            return
        if scope["method"] != "POST":
            await self._finish(send, Outcome.error(405, "use POST /virtual"), ((b"allow", b"POST"),))
            return
        client = scope["client"][0] if scope.get("client") else "?"
        body = await self.admit(scope, receive, client, self.max_body)
        if isinstance(body, Outcome):
            await self._finish(send, body, stop_headers(body))
            return
        try:
            faults = self.layer.faults is not None and not wants_no_faults(scope.get("headers", ()))
            await _send(send, await self.path.answer_body(body, _session_header(scope), faults))  # counted there
        finally:
            self.admission.leave(client)

    async def admit(self, scope: Scope, receive: Receive, client: str, max_body: int, setting: str | None = None) -> bytes | Outcome:
        """The body of a request that now holds one of ``client``'s slots (give it back with ``admission.leave(client)``),
        or the answer that ends it (too large, too slow, gone, or over a limit: logged, not counted, no slot held).

        The body is read before a slot is taken: a client that stalls mid-body holds no slot, and is cut off
        after ``limits.body_timeout_s``; its bytes count against ``limits.max_queued_bytes`` from its headers
        until it has a slot.  ``max_body``: the size limit (``setting`` names it in the 413's message).
        """
        fair.CLIENT.set(client)  # this request's task (and its worker threads) work for this client
        reservation = _Reservation(self.admission)
        try:
            body = await self._read_body(scope, receive, reservation, max_body, setting)
            if isinstance(body, Outcome):
                return body
            try:
                await self.admission.enter(client)
            except Refused as refusal:
                return self._refused(refusal)
        finally:
            reservation.release()
        return body

    def _refused(self, refusal: Refused) -> Outcome:
        """The HTTP 503 answer to a request over a limit (logged at most once a minute per limit)."""
        self.refusals.refused(503, str(refusal), refusal.limit)
        return Outcome.error(503, refusal.message, OutcomeKind.REFUSED, refusal.limit)

    async def _finish(self, send: Send, outcome: Outcome, extra_headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
        """Send the final answer of a ``/virtual`` request, counted here: once, by its outcome.

        (A request without the right bearer token is refused before it counts.)
        """
        self.layer.stats.count(outcome)
        await _send(send, outcome, extra_headers)

    @staticmethod
    def _too_large(max_body: int, setting: str | None) -> Outcome:
        return Outcome.error(413, f"request body larger than {max_body} bytes" + (f" ({setting})" if setting else ""))

    def _authorized(self, scope: Scope) -> bool:
        assert self.token is not None
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                scheme, _, given = value.partition(b" ")
                return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), self.token)
        return False

    async def _read_body(self, scope: Scope, receive: Receive, reservation: _Reservation, max_body: int,
                         setting: str | None) -> bytes | Outcome:
        """The body, or the answer that ends the request: too large, gone, too slow, or over ``max_queued_bytes``.

        The body's bytes (its ``Content-Length`` at once, else each chunk as it comes) are counted in
        ``reservation`` before they are read.
        """
        length: int | None = None
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                if not value.isdigit() or int(value) > max_body:
                    return self._too_large(max_body, setting)
                length = int(value)
        try:
            reservation.add(REQUEST_OVERHEAD + (length or 0))
        except Refused as refusal:
            return self._refused(refusal)
        if arrived(receive):  # the whole body is in: one receive, which cannot wait (no timer to set)
            return self._whole_body(await receive(), length, reservation, max_body, setting)
        return await self._body_in_chunks(receive, length, reservation, max_body, setting)

    async def _body_in_chunks(self, receive: Receive, length: int | None, reservation: _Reservation, max_body: int,
                              setting: str | None) -> bytes | Outcome:
        """:meth:`_read_body` for a body still arriving: each chunk counted as it comes, under ``limits.body_timeout_s``."""
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
                        if size > max_body:
                            return self._too_large(max_body, setting)
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


    def _whole_body(self, message: Any, length: int | None, reservation: _Reservation, max_body: int,
                    setting: str | None) -> bytes | Outcome:
        """:meth:`_read_body` for a body that had all arrived: the same checks, in one message."""
        if message["type"] == "http.disconnect":
            return Outcome.error(400, "the client went away")
        whole: bytes = message.get("body", b"")
        if len(whole) > max_body:
            return self._too_large(max_body, setting)
        if length is None or len(whole) > length:
            try:
                reservation.add(len(whole))
            except Refused as refusal:
                return self._refused(refusal)
        return whole


def arrived(receive: Receive) -> bool:
    """Whether a request's whole body has arrived: its next ``receive`` returns all of it at once.

    Only uvicorn's own cycle says so (its ``receive`` is a bound method); anything else is read
    chunk by chunk under ``limits.body_timeout_s``.
    """
    cycle = getattr(receive, "__self__", None)
    event = getattr(cycle, "message_event", None)
    return (event is not None and event.is_set() and getattr(cycle, "more_body", True) is False
            and not getattr(cycle, "waiting_for_100_continue", True))


_REFUSAL_HEADERS = ((b"retry-after", b"5"),)
_CLOSE_HEADERS = ((b"connection", b"close"),)


def stop_headers(outcome: Outcome) -> tuple[tuple[bytes, bytes], ...]:
    """The headers of an answer :meth:`Front.admit` ended a request with: ``Retry-After`` on a 503, ``Connection:
    close`` on a 408 (the rest of a slow body is not read)."""
    if outcome.kind is OutcomeKind.REFUSED and outcome.status == 503:
        return _REFUSAL_HEADERS
    return _CLOSE_HEADERS if outcome.status == 408 else ()


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

