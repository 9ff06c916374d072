"""POSTs to a model server: a small typed seam (:class:`Transport`), httpcore behind it.

The simulator's chat client, and whatever else calls a model, sends JSON POSTs to one or a few
servers through a :class:`Transport`: ``post(path, body, headers)`` gives an :class:`Reply`
(status, lower-case headers, body) or raises one of four :class:`TransportError` kinds:

* :class:`ConnectFailed` -- no connection (refused, timed out, TLS refused), or it closed before
  any byte of an answer came back; the request may be sent again;
* :class:`SendFailed` -- the request could not be sent whole (the server stopped reading, the
  connection broke, or the deadline passed while sending); it may be sent again too;
* :class:`AnswerTimedOut` -- the request went out and no complete answer came back in time: the
  server took it and may still be working on it (not retried);
* :class:`BrokenAnswer` -- an answer began but was cut off, was not HTTP (or not a final
  answer, e.g. a ``101 Switching Protocols``), or was larger than allowed.

:class:`HttpcoreTransport` is the real one.  HTTP/1.1 is httpcore's, parsed by h11: kept-alive
connections per endpoint shared by threads (a kept connection the server closed is dropped
before use), chunked and read-to-close bodies, interim ``1xx`` answers skipped, a header block
capped (100 KiB), TLS verified against the default authorities (``SSL_CERT_FILE`` honoured: the
context is made when the transport is built), and proxies taken from the environment as
``requests`` takes them (``HTTP_PROXY``, ``HTTPS_PROXY``, ``ALL_PROXY``, ``NO_PROXY``), decided
once per endpoint.

Why httpcore and not httpx (issue 39 asked for httpx's async streaming API with the deadline and the
bounded decoding as a layer over it): every caller of a transport is a worker thread (the simulator's
responder, model calls handed to ``anyio.to_thread``), so an ``httpx.AsyncClient`` needs a loop of its own
and a hop to it per request, and httpx's request and response models come on top of the same httpcore
pool.  Measured on 127.0.0.1 (2 shared cores, one run each): a POST cost the client 0.32 ms of CPU here,
0.54-0.58 ms through ``httpx.Client.stream``, 0.9-1.1 ms through ``httpx.AsyncClient.stream`` on a loop
thread; ``benchmarks/miss_path.py --quick`` with that async transport against this one, in one run (load average 7),
added 8.3 vs 6.2 ms per miss at c=1 and 393 vs 110 ms at c=32, 46 vs 187 misses/s, 8.4 vs 3.1 ms of
server CPU per miss.  httpx also exposes no network backend, which the deadline and the checks of a
kept connection below need (bytes read per try, as they arrive).

Three small pieces are written here by hand, because no library offers them:

* **an overall deadline**: httpcore's timeouts, like every client library's, bound each read and
  write, so a server that trickles a byte now and then holds a request for ever.  A
  :class:`httpcore.NetworkBackend` wraps the sync one; its streams clamp every read and write to
  the time left until the request's deadline (``answer_timeout_s`` from its first byte sent, kept
  in a context variable around the request) and raise a timeout once it has passed (a write goes
  in 64 KiB pieces, each clamped: a server that takes one piece in many small steps can stretch
  that piece, never the answer);
* **a bounded decoder**: requests ask for no compression; an answer compressed all the same
  (``gzip``, ``deflate``) is unpacked with ``zlib``'s ``max_length``, never past the size cap
  (httpx's decoders have no bound: a small gzip bomb unpacks whole);
* **two checks of a kept connection**: a request whose kept connection turns out closed before
  any byte of an answer came back is sent again (the server's keep-alive ran out as it went
  out; httpcore drops such a connection but does not resend), and an answer that needed no read
  at all was sent before the request (bytes a server sent after its previous answer, which h11
  keeps buffered and httpcore would read as the next answer): it is never taken as the answer,
  the connection is dropped and the request sent again.  Each such try drops the connection it
  used; after three the request fails as :class:`ConnectFailed`.
"""

from __future__ import annotations

import contextvars
import re
import ssl
import time
import urllib.parse
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpcore
import requests.utils

#: largest answer body read by default
MAX_ANSWER_BYTES = 16 * 1024 * 1024


class TransportError(Exception):
    """A request that got no complete answer (``timed_out``: a connection or a send that ran out of time)."""

    def __init__(self, detail: str, *, timed_out: bool = False) -> None:
        super().__init__(detail)
        self.timed_out = timed_out


class ConnectFailed(TransportError):
    """No connection to the server, or it closed before any byte of the answer came back."""


class SendFailed(TransportError):
    """The request could not be sent whole: nothing of an answer came back."""


class AnswerTimedOut(TransportError):
    """The request was sent and no complete answer came back before the deadline."""


class BrokenAnswer(TransportError):
    """An answer began but was cut off, was not a final HTTP answer, or was larger than allowed."""

    def __init__(self, detail: str, *, status: int | None = None) -> None:
        super().__init__(detail)
        self.status = status


@dataclass(frozen=True)
class Reply:
    status: int
    headers: Mapping[str, str]
    """Lower-case names; a repeated header keeps its last value."""
    body: bytes


@dataclass(frozen=True)
class TransportOptions:
    """How a transport to one endpoint is built."""

    headers: Mapping[str, str] = field(default_factory=dict)
    """Sent with every request (a request's own headers come after them)."""
    pool_size: int = 64
    """Idle kept-alive connections kept (more may be open at once)."""
    connect_timeout_s: float = 3.0
    """For the TCP connection and the TLS handshake."""
    answer_timeout_s: float = 120.0
    """For the whole exchange, from the request's first byte sent to the answer's last byte."""
    max_answer_bytes: int = MAX_ANSWER_BYTES
    user_agent: str = "stabletoolbench-mirror"


class Transport(Protocol):
    """POSTs to one endpoint."""

    def post(self, path: str, body: bytes, headers: Mapping[str, str] | None = None, *,
             answer_timeout_s: float | None = None) -> Reply:
        """POST ``body`` to ``path`` (e.g. ``/v1/chat/completions``); the answer, whatever its status."""
        ...  # pragma: no cover - a protocol

    def close(self) -> None:
        """Close the idle connections; those in use close when their request ends."""
        ...  # pragma: no cover - a protocol


TransportFactory = Callable[[str, TransportOptions], Transport]
"""Builds the transport of an endpoint (its base URL, ``http(s)://host:port/...``)."""


# -- the deadline -------------------------------------------------------------------------------------


class _Exchange:
    """One try of one request, as the network streams see it (in :data:`_CURRENT` while it runs)."""

    __slots__ = ("budget", "deadline", "connected", "bytes_read", "eof", "send_error", "head")

    def __init__(self, budget: float) -> None:
        self.budget = budget
        self.deadline: float | None = None
        """Set when the first byte is sent."""
        self.connected = False
        """Whether a new connection was made for it (else it went over a kept one)."""
        self.bytes_read = 0
        self.eof = False
        """Whether a read found the connection closed."""
        self.send_error: Exception | None = None
        self.head = b""
        """The first bytes read (to name the status of an answer h11 refused)."""

    def time_left(self, timeout: float | None, error: type[Exception]) -> float | None:
        """``timeout`` clamped to the time left; ``error`` once it is gone."""
        if self.deadline is None:
            return timeout
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise error(f"the deadline of {self.budget:g} s has passed")
        return left if timeout is None else min(timeout, left)

    def saw(self, data: bytes) -> None:
        if not data:
            self.eof = True
        elif len(self.head) < 32:
            self.head += data[: 32 - len(self.head)]
        self.bytes_read += len(data)


_CURRENT: contextvars.ContextVar[_Exchange | None] = contextvars.ContextVar("stabletoolbench_mirror_http_exchange", default=None)

#: a write is sent in pieces of this size, each clamped to the time left
_PIECE = 64 * 1024


class _DeadlineStream(httpcore.NetworkStream):
    """A network stream whose reads and writes end by the deadline of the request in :data:`_CURRENT`."""

    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        exchange = _CURRENT.get()
        if exchange is None:
            return self._inner.read(max_bytes, timeout)
        data = self._inner.read(max_bytes, exchange.time_left(timeout, httpcore.ReadTimeout))
        exchange.saw(data)
        return data

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        exchange = _CURRENT.get()
        if exchange is None:
            self._inner.write(buffer, timeout)
            return
        if exchange.deadline is None:
            exchange.deadline = time.monotonic() + exchange.budget
        try:
            for start in range(0, len(buffer), _PIECE):
                piece = buffer if len(buffer) <= _PIECE else buffer[start:start + _PIECE]
                self._inner.write(piece, exchange.time_left(timeout, httpcore.WriteTimeout))
        except (httpcore.WriteError, httpcore.WriteTimeout) as exc:
            exchange.send_error = exc  # (httpcore goes on to read an answer after a write error)
            raise

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        try:
            inner = self._inner.start_tls(ssl_context, server_hostname, timeout)
        except httpcore.ConnectTimeout:
            raise httpcore.ConnectTimeout(f"TLS handshake with {server_hostname} timed out") from None
        except httpcore.ConnectError as exc:
            raise httpcore.ConnectError(f"TLS handshake with {server_hostname} failed: {exc}") from None
        return _DeadlineStream(inner)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    """httpcore's sync backend, its TCP streams wrapped in :class:`_DeadlineStream` (no Unix sockets; no retries, so no sleeps)."""

    def __init__(self) -> None:
        self._inner = httpcore.SyncBackend()

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        exchange = _CURRENT.get()
        if exchange is not None:
            exchange.connected = True
        try:
            stream = self._inner.connect_tcp(host, port, timeout, local_address, socket_options)
        except httpcore.ConnectTimeout:
            raise httpcore.ConnectTimeout(f"connection to {host}:{port} timed out") from None
        except httpcore.ConnectError as exc:
            raise httpcore.ConnectError(f"cannot connect to {host}:{port}: {exc}") from None
        return _DeadlineStream(stream)


# -- proxies ------------------------------------------------------------------------------------------


def proxy_for(url: str) -> str | None:
    """The proxy ``requests`` would use for ``url`` (``HTTP_PROXY``, ``HTTPS_PROXY``, ``ALL_PROXY``, ``NO_PROXY``)."""
    proxy = requests.utils.select_proxy(url, requests.utils.get_environ_proxies(url))
    if not proxy:
        return None
    return proxy if "://" in proxy else "http://" + proxy


def _proxy_pool(proxy: str, ssl_context: ssl.SSLContext | None, **pool: Any) -> httpcore.HTTPProxy:
    parsed = urllib.parse.urlsplit(proxy)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError(f"proxy {_without_auth(parsed)!r} from the environment: only http:// and https:// proxies are supported")
    auth = (urllib.parse.unquote(parsed.username), urllib.parse.unquote(parsed.password or "")) if parsed.username else None
    return httpcore.HTTPProxy(proxy_url=_without_auth(parsed), proxy_auth=auth, ssl_context=ssl_context, **pool)


def _without_auth(parsed: urllib.parse.SplitResult) -> str:
    host = f"[{parsed.hostname}]" if parsed.hostname and ":" in parsed.hostname else parsed.hostname or ""
    port = f":{parsed.port}" if parsed.port else ""
    return f"{parsed.scheme}://{host}{port}"


# -- the httpcore transport ---------------------------------------------------------------------------


class _Stale(Exception):
    """The kept connection gave nothing of an answer to this request: it is sent once more."""


#: tries of a request whose kept connections give nothing of an answer (each drops its connection, so the
#: next one is a new connection unless other kept ones are idle)
_STALE_TRIES = 3


class HttpcoreTransport:
    """Kept-alive HTTP/1.1 connections to the server of ``base``, through httpcore; thread-safe."""

    def __init__(self, base: str, options: TransportOptions | None = None) -> None:
        options = options or TransportOptions()
        parsed = urllib.parse.urlsplit(base)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"not an http(s) URL: {base!r}")
        self.options = options
        self._scheme = parsed.scheme.encode("ascii")
        self._host = parsed.hostname.encode("idna")
        self._port = parsed.port or (443 if parsed.scheme == "https" else 80)
        fixed = {"User-Agent": options.user_agent, "Accept-Encoding": "identity", **options.headers}
        self._headers = _header_list(fixed)
        ssl_context = ssl.create_default_context() if parsed.scheme == "https" else None
        pool: dict[str, Any] = {"max_connections": None, "max_keepalive_connections": options.pool_size, "retries": 0,
                                "network_backend": _DeadlineBackend()}
        self.proxy = proxy_for(base)
        self._pool: httpcore.ConnectionPool = (
            _proxy_pool(self.proxy, ssl_context, **pool) if self.proxy else httpcore.ConnectionPool(ssl_context=ssl_context, **pool)
        )

    def post(self, path: str, body: bytes, headers: Mapping[str, str] | None = None, *,
             answer_timeout_s: float | None = None) -> Reply:
        if not path.startswith("/") or any(c in path for c in "\r\n "):
            raise ValueError(f"not a request path: {path!r}")
        url = httpcore.URL(scheme=self._scheme, host=self._host, port=self._port, target=path.encode("ascii"))
        request_headers = self._headers + (_header_list(headers) if headers else [])
        budget = self.options.answer_timeout_s if answer_timeout_s is None else answer_timeout_s
        answer = self._tries(url, request_headers, body, budget)
        encoding = answer.headers.get("content-encoding", "identity").strip().lower()
        if encoding in ("", "identity"):
            return answer
        # asked for identity; a server that compresses all the same is still understood (within the cap)
        return Reply(answer.status, answer.headers, _decoded(answer.body, encoding, self.options.max_answer_bytes))

    def _tries(self, url: httpcore.URL, headers: list[tuple[bytes, bytes]], body: bytes, budget: float) -> Reply:
        for _ in range(_STALE_TRIES):
            try:
                return self._exchange(url, headers, body, budget)
            except _Stale:
                # the kept connection gave nothing of an answer (the server closed it as the request went
                # out, or had sent something unasked before): once more, the pool dropped that connection
                continue
        raise ConnectFailed(f"{_STALE_TRIES} kept connections in a row gave no answer")

    def _exchange(self, url: httpcore.URL, headers: list[tuple[bytes, bytes]], body: bytes, budget: float) -> Reply:
        exchange = _Exchange(budget)
        timeouts = {"connect": self.options.connect_timeout_s, "read": budget, "write": budget, "pool": None}
        token = _CURRENT.set(exchange)
        try:
            with self._pool.stream("POST", url, headers=headers, content=body, extensions={"timeout": timeouts}) as response:
                if exchange.bytes_read == 0:
                    # its head was in the buffer before the request went out: sent unasked, after the last answer
                    raise _Stale()
                if response.status < 200:
                    raise BrokenAnswer(f"HTTP {response.status} is not a final answer", status=response.status)
                answer_headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in response.headers}
                data = self._body(response.iter_stream(), answer_headers.get("content-length"))
        except (httpcore.TimeoutException, httpcore.NetworkError, httpcore.RemoteProtocolError, httpcore.ProxyError) as exc:
            raise _failure(exc, exchange) from None
        finally:
            _CURRENT.reset(token)
        return Reply(response.status, answer_headers, data)

    def _body(self, chunks: Iterator[bytes], length: str | None) -> bytes:
        limit = self.options.max_answer_bytes
        if length is not None and length.strip().isdigit() and int(length) > limit:
            raise BrokenAnswer(f"answer larger than {limit} bytes")
        parts: list[bytes] = []
        size = 0
        for chunk in chunks:
            size += len(chunk)
            if size > limit:
                raise BrokenAnswer(f"answer larger than {limit} bytes")
            parts.append(chunk)
        return b"".join(parts)

    def close(self) -> None:
        self._pool.close()


def _header_list(headers: Mapping[str, str]) -> list[tuple[bytes, bytes]]:
    if any(c in "\r\n\0" for item in headers.items() for c in "".join(item)):
        raise ValueError("a request header holds a line break")
    return [(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers.items()]


_STATUS = re.compile(rb"HTTP/\d\.\d (\d{3})")


def _failure(exc: Exception, exchange: _Exchange) -> Exception:
    """What ``exc`` (httpcore's) means for this try: a :class:`TransportError`, or :class:`_Stale`."""
    if isinstance(exc, httpcore.ConnectTimeout):
        return ConnectFailed(str(exc), timed_out=True)
    if isinstance(exc, (httpcore.ConnectError, httpcore.ProxyError)):
        return ConnectFailed(str(exc) if isinstance(exc, httpcore.ConnectError) else f"the proxy refused: {exc}")
    if isinstance(exc, httpcore.WriteTimeout):
        return SendFailed(f"sending the request timed out after {exchange.budget:g} s", timed_out=True)
    if isinstance(exc, httpcore.TimeoutException):  # a read, or the deadline
        return AnswerTimedOut(f"no answer within {exchange.budget:g} s")
    if exchange.bytes_read == 0:
        return _nothing_came(exc, exchange)
    match = _STATUS.match(exchange.head)
    if match and match.group(1) == b"101":
        return BrokenAnswer("the server switched protocols (HTTP 101) instead of answering", status=101)
    if isinstance(exc, httpcore.NetworkError):
        return BrokenAnswer(f"connection lost during the answer: {exc}")
    if exchange.eof:
        return BrokenAnswer("the server closed the connection before the answer was complete")
    return BrokenAnswer(f"not an HTTP answer: {exc}")


def _nothing_came(exc: Exception, exchange: _Exchange) -> Exception:
    if not exchange.connected:
        return _Stale()  # a kept connection the server had closed
    if exchange.send_error is not None:
        return SendFailed(f"sending the request failed: {exchange.send_error}")
    if isinstance(exc, httpcore.RemoteProtocolError):
        return ConnectFailed("the server closed the connection without answering")
    return ConnectFailed(f"connection lost before an answer: {exc}")


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
