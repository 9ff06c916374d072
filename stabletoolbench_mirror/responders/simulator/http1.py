"""HTTP/1.1 POSTs to one model server over kept-alive sockets, parsed by httptools.

The simulator's chat client sends one request shape (a JSON POST) to one or a few servers, once per
cache miss.  urllib3 spent about 160 µs of CPU on such a call against a local server, most of it in
``http.client``'s e-mail header parser; this module writes the request in one ``sendall`` and
parses the answer with httptools (llhttp, the parser uvicorn serves with), about 30 µs.

:class:`Pool` keeps up to ``maxsize`` idle connections per server (more may be open at once, as
urllib3's non-blocking pools allow).  A kept connection is checked before it is used again: one the
server has closed (an idle keep-alive ran out) is dropped, and a request that finds its kept
connection closed before any byte of an answer came back is sent once more on a new one.  Errors are
three kinds: :class:`ConnectFailed` (no connection, or it broke before an answer began),
:class:`ReadTimedOut` (the server took the request and said nothing within the read timeout) and
:class:`BrokenAnswer` (an answer began but is cut off, malformed or too large).  Requests ask for
no compression; an answer compressed all the same (``gzip``, ``deflate``) is unpacked, never past the
size cap.
"""

from __future__ import annotations

import select
import socket
import ssl
import threading
import urllib.parse
import zlib
from dataclasses import dataclass
from typing import Mapping

import httptools


class TransportError(Exception):
    """A request that got no complete answer."""


class ConnectFailed(TransportError):
    """No connection to the server, or it broke before any byte of the answer came back."""

    def __init__(self, detail: str, *, timed_out: bool = False) -> None:
        super().__init__(detail)
        self.timed_out = timed_out


class ReadTimedOut(TransportError):
    """The request was sent and no (complete) answer came back within the read timeout."""


class BrokenAnswer(TransportError):
    """An answer began but was cut off, was not HTTP, or was larger than allowed."""


@dataclass(frozen=True)
class Response:
    status: int
    headers: Mapping[str, str]
    """Lower-case names; a repeated header keeps its last value."""
    body: bytes


class _Reader:
    """httptools' callbacks for one answer."""

    __slots__ = ("headers", "chunks", "size", "limit", "too_large", "begun", "headed", "status", "keep_alive", "complete", "extra", "parser")

    def __init__(self, limit: int) -> None:
        self.headers: dict[str, str] = {}
        self.chunks: list[bytes] = []
        self.size = 0
        self.limit = limit
        self.too_large = False
        self.begun = False
        self.headed = False
        """Whether the status line and headers are in."""
        self.status = 0
        self.keep_alive = False
        """Whether the server keeps the connection open after this answer (known with the headers)."""
        self.complete = False
        self.extra = False
        """Bytes after the answer (a second message): the connection is not used again."""
        self.parser = httptools.HttpResponseParser(self)

    def on_message_begin(self) -> None:
        if self.complete:
            self.extra = True
        self.begun = True

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.complete:
            return
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        if self.complete:
            return
        self.headed = True
        self.status = self.parser.get_status_code()
        self.keep_alive = self.parser.should_keep_alive()  # (llhttp forgets it once the answer is complete)

    def on_body(self, body: bytes) -> None:
        if self.complete:
            return
        self.size += len(body)
        if self.size > self.limit:
            self.too_large = True
        elif not self.too_large:
            self.chunks.append(body)

    def on_message_complete(self) -> None:
        self.complete = True

    def reads_until_close(self) -> bool:
        """Whether the answer's body ends only when the server closes (no length, not chunked)."""
        return "content-length" not in self.headers and "chunked" not in self.headers.get("transfer-encoding", "").lower()


class _Connection:
    __slots__ = ("sock", "used")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.used = False
        """Whether a request went over it already (a kept connection the server may have closed)."""

    def dropped(self) -> bool:
        """Whether the server closed this idle connection (or sent something unasked: it is not used again)."""
        try:
            if hasattr(select, "poll"):
                poller = select.poll()
                poller.register(self.sock, select.POLLIN)
                return bool(poller.poll(0))
            return bool(select.select([self.sock], [], [], 0)[0])
        except (OSError, ValueError):
            return True

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:  # pragma: no cover - closing a socket does not fail
            pass


class Pool:
    """Kept-alive connections to the server of ``base`` (``http://host:port/...`` or ``https://``); thread-safe."""

    def __init__(
        self,
        base: str,
        headers: Mapping[str, str],
        *,
        maxsize: int,
        connect_timeout_s: float,
        read_timeout_s: float,
        max_answer_bytes: int,
        user_agent: str = "stabletoolbench-mirror",
    ) -> None:
        parsed = urllib.parse.urlsplit(base)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"not an http(s) URL: {base!r}")
        self.scheme = parsed.scheme
        self.host = parsed.hostname
        self.port = parsed.port or (443 if parsed.scheme == "https" else 80)
        self.maxsize = maxsize
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.max_answer_bytes = max_answer_bytes
        host = f"[{self.host}]" if ":" in self.host else self.host
        default_port = 443 if self.scheme == "https" else 80
        fixed = {"Host": host if self.port == default_port else f"{host}:{self.port}", "User-Agent": user_agent,
                 "Accept-Encoding": "identity", **headers}
        if any(c in "\r\n" for item in fixed.items() for c in "".join(item)):
            raise ValueError("a request header holds a line break")
        self._fixed = "".join(f"{name}: {value}\r\n" for name, value in fixed.items())
        self._tls = ssl.create_default_context() if self.scheme == "https" else None
        self._idle: list[_Connection] = []
        self._lock = threading.Lock()
        self._closed = False

    # -- connections ----------------------------------------------------------------------------

    def _get(self) -> _Connection:
        while True:
            with self._lock:
                kept = self._idle.pop() if self._idle else None
            if kept is None:
                return self._connect()
            if not kept.dropped():
                return kept
            kept.close()

    def _put(self, conn: _Connection) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < self.maxsize:
                self._idle.append(conn)
                return
        conn.close()

    def _connect(self) -> _Connection:
        try:
            sock = socket.create_connection((self.host, self.port), timeout=self.connect_timeout_s)
        except TimeoutError:
            raise ConnectFailed(f"connection to {self.host}:{self.port} timed out", timed_out=True) from None
        except OSError as exc:
            raise ConnectFailed(f"cannot connect to {self.host}:{self.port}: {exc}") from None
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._tls is not None:
                sock = self._tls.wrap_socket(sock, server_hostname=self.host)
        except TimeoutError:
            sock.close()
            raise ConnectFailed(f"TLS handshake with {self.host}:{self.port} timed out", timed_out=True) from None
        except OSError as exc:  # ssl.SSLError included
            sock.close()
            raise ConnectFailed(f"TLS handshake with {self.host}:{self.port} failed: {exc}") from None
        sock.settimeout(self.read_timeout_s)
        return _Connection(sock)

    def close(self) -> None:
        """Close the idle connections; those in use close when their request ends."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    # -- a request ------------------------------------------------------------------------------

    def post(self, path: str, body: bytes) -> Response:
        """POST ``body`` to ``path``; the answer, whatever its status."""
        if any(c in path for c in "\r\n "):
            raise ValueError(f"not a request path: {path!r}")
        request = f"POST {path} HTTP/1.1\r\n{self._fixed}Content-Length: {len(body)}\r\n\r\n".encode("latin-1") + body
        conn = self._get()
        try:
            response = self._exchange(conn, request)
        except _Stale:
            # the server closed the kept connection as the request went out: once more, on a new one
            response = self._exchange(self._connect(), request)
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if encoding in ("", "identity"):
            return response
        # asked for identity; a server that compresses all the same is still understood (within the cap)
        return Response(response.status, response.headers, _decoded(response.body, encoding, self.max_answer_bytes))

    def _exchange(self, conn: _Connection, request: bytes) -> Response:
        reused, conn.used = conn.used, True
        keep = False
        try:
            response, keep = self._send_and_read(conn, request, reused)
            return response
        finally:
            if keep:
                self._put(conn)
            else:
                conn.close()

    def _send_and_read(self, conn: _Connection, request: bytes, reused: bool) -> tuple[Response, bool]:
        reader = _Reader(self.max_answer_bytes)
        parser = reader.parser
        sock = conn.sock
        try:
            sock.sendall(request)
            while not reader.complete:
                chunk = sock.recv(65536)
                if not chunk:
                    if reader.headed and reader.reads_until_close():
                        break  # a body that ends with the connection
                    if not reader.begun:
                        raise _Stale() if reused else ConnectFailed("the server closed the connection without answering")
                    raise BrokenAnswer("the server closed the connection before the answer was complete")
                parser.feed_data(chunk)
                if reader.too_large:
                    raise BrokenAnswer(f"answer larger than {self.max_answer_bytes} bytes")
        except TimeoutError:
            raise ReadTimedOut(f"no answer within {self.read_timeout_s:g} s") from None
        except httptools.HttpParserError as exc:
            raise BrokenAnswer(f"not an HTTP answer: {exc}") from None
        except OSError as exc:
            if reader.begun:
                raise BrokenAnswer(f"connection lost during the answer: {exc}") from None
            if reused and isinstance(exc, (ConnectionResetError, BrokenPipeError)):
                raise _Stale() from None
            raise ConnectFailed(f"connection lost before an answer: {exc}") from None
        keep = reader.complete and reader.keep_alive and not reader.extra
        return Response(reader.status, reader.headers, b"".join(reader.chunks)), keep


def _decoded(body: bytes, encoding: str, limit: int) -> bytes:
    """``body`` uncompressed (``gzip`` or ``deflate``), at most ``limit`` bytes of it."""
    if encoding not in ("gzip", "x-gzip", "deflate"):
        raise BrokenAnswer(f"answer in an encoding this client does not read: {encoding[:40]!r}")
    # gzip: its header; deflate: zlib's (most servers) or raw
    modes = (zlib.MAX_WBITS | 16,) if "gzip" in encoding else (zlib.MAX_WBITS, -zlib.MAX_WBITS)
    for wbits in modes:
        inflater = zlib.decompressobj(wbits)
        try:
            out = inflater.decompress(body, limit + 1)
        except zlib.error:
            continue
        if len(out) > limit:
            raise BrokenAnswer(f"answer larger than {limit} bytes once uncompressed")
        return out
    raise BrokenAnswer(f"answer not valid {encoding}")


class _Stale(Exception):
    """A kept connection the server had closed: nothing of an answer came back."""

