"""uvicorn's connection layer as the server runs it: its httptools protocol with a header timeout, a send
timeout and an answer's head joined to its body (:class:`GuardedHttpProtocol`, :class:`JoinedWrites`),
and the uvicorn options that guard connections (:func:`uvicorn_options`: the timeouts below and
``limits.send_timeout_s``, no ``X-Forwarded-For`` believed by uvicorn itself).
"""

from __future__ import annotations

import asyncio
import fcntl
import functools
import logging
import struct
import termios
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from stabletoolbench_mirror.config import Settings

log = logging.getLogger(__name__)

HEADER_TIMEOUT_S = 10.0  # a connection whose request headers are not complete this long after it opened (or answered) is closed
KEEP_ALIVE_TIMEOUT_S = 5.0  # an idle kept-alive connection is closed after this long (uvicorn's timeout_keep_alive)


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol plus a header timeout and a send timeout.

    uvicorn closes idle keep-alive connections (``timeout_keep_alive``) but waits forever for a
    request whose headers never finish; this closes such a connection after :data:`HEADER_TIMEOUT_S`.

    uvicorn hands a whole answer to the transport, which keeps what the socket does not take in
    its write buffer until the client reads it, and closing the connection waits for that buffer to
    drain: a client that never reads holds its answer for as long as it stays connected.  While the
    buffer holds anything, the unsent bytes are looked at every fifth of ``send_timeout_s``; a client
    that has read nothing for ``send_timeout_s`` is dropped (the connection aborted, its buffer freed).
    """

    def __init__(self, *args: Any, send_timeout_s: float = 30.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.header_timeout_s = HEADER_TIMEOUT_S
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
        self._headers_since = None
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
        self._headers_since = None
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
        "http": functools.partial(GuardedHttpProtocol, send_timeout_s=limits.send_timeout_s),
        "timeout_keep_alive": KEEP_ALIVE_TIMEOUT_S,
        # uvicorn believes X-Forwarded-For from 127.0.0.1 by default, and takes a malformed hop as a client:
        # any local client could then pose as others (limits.max_in_flight_per_client, fair sharing).
        # _Front reads it instead, from limits.trusted_proxies only (admission.ForwardedFor)
        "proxy_headers": False,
        # uvicorn builds each access line's arguments (client, quoted path) before its logger drops it:
        # below log_level info no access line is written, so none is built
        "access_log": settings.log_level in ("debug", "info"),
    }
