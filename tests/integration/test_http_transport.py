"""The model calls' HTTP transport (httpcore behind ``http_transport.Transport``) against real sockets on 127.0.0.1.

A scripted TCP server (:class:`RawServer`) answers each connection with exactly the bytes a test
gives, so each way a model server can frame, cut, stall or close an answer is played out on a real
socket: kept-alive reuse, chunked and read-to-close bodies, a server that closed an idle
connection, truncated, oversized and non-HTTP answers, interim ``1xx`` answers and ``101``, an
answer trickled byte by byte (the overall deadline), an endless header line, a server that stops
reading, timeouts, refused connections, TLS, and a forward proxy named by ``HTTP_PROXY``.
"""

from __future__ import annotations

import json
import socket
import ssl
import struct
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import trustme

from stabletoolbench_mirror.responders import http_transport as ht
from stabletoolbench_mirror.responders.simulator.client import ChatClient, ChatError
from tests.helpers.live import free_port
from tests.helpers.openai_stub import OpenAIStub

Handler = Callable[["RawServer", socket.socket, int], None]
"""Serves one accepted connection of the server (and its number, from 0)."""

MESSAGES = [{"role": "user", "content": "hi"}]


class RawServer:
    """Accepts connections on 127.0.0.1 and hands each to ``handler`` in its own thread."""

    def __init__(self, handler: Handler, tls: ssl.SSLContext | None = None, receive_buffer: int | None = None) -> None:
        self.handler = handler
        self.tls = tls
        self.listener = socket.socket()
        if receive_buffer:
            self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self.connections = 0
        self.open = 0
        """Connections whose handler still runs (those the client closed end when it reads their end)."""
        self.requests: list[bytes] = []
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def __enter__(self) -> RawServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.listener.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with self._changed:
                number = self.connections
                self.connections += 1
                self.open += 1
            threading.Thread(target=self._serve, args=(conn, number), daemon=True).start()

    def _serve(self, conn: socket.socket, number: int) -> None:
        try:
            if self.tls is not None:
                conn = self.tls.wrap_socket(conn, server_side=True)
            self.handler(self, conn, number)
        except OSError:
            pass
        finally:
            conn.close()
            with self._changed:
                self.open -= 1
                self._changed.notify_all()

    def wait_open(self, at_most: int, timeout: float = 10.0) -> int:
        """Wait until at most ``at_most`` connections are open; how many are."""
        with self._changed:
            self._changed.wait_for(lambda: self.open <= at_most, timeout)
            return self.open

    def read_request(self, conn: socket.socket) -> bytes | None:
        """One request (head and ``Content-Length`` body), recorded; ``None`` when the client closed first."""
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return None
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:"))
        while len(body) < length:
            body += conn.recv(65536)
        with self._changed:
            self.requests.append(head + b"\r\n\r\n" + body)
            return body

    def request_count(self) -> int:
        with self._changed:
            return len(self.requests)


def answer(body: bytes, *extra: str, status: str = "200 OK") -> bytes:
    head = "".join(f"{h}\r\n" for h in extra)
    return f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n{head}\r\n".encode() + body


def completion(text: str) -> bytes:
    return json.dumps({"model": "m", "choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}).encode()


def keep_answering(reply: Callable[[bytes], bytes]) -> Handler:
    """Answer every request on the connection with ``reply(body)`` until the client closes."""

    def handler(server: RawServer, conn: socket.socket, number: int) -> None:
        while (body := server.read_request(conn)) is not None:
            conn.sendall(reply(body))

    return handler


@pytest.fixture
def raw() -> Iterator[Callable[..., RawServer]]:
    servers: list[RawServer] = []

    def start(handler: Handler, tls: ssl.SSLContext | None = None, **options: int) -> RawServer:
        server = RawServer(handler, tls, **options).__enter__()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.__exit__()


def transport(port: int, scheme: str = "http", host: str = "127.0.0.1", **options: object) -> ht.HttpcoreTransport:
    settings: dict = {"pool_size": 4, "connect_timeout_s": 1.0, "answer_timeout_s": 2.0, "max_answer_bytes": 1 << 20,
                      "headers": {"Content-Type": "application/json", "Authorization": "Bearer k"}}
    settings.update(options)
    return ht.HttpcoreTransport(f"{scheme}://{host}:{port}/v1", ht.TransportOptions(**settings))


def chat(port: int, **options: object) -> ChatClient:
    settings: dict = {"model": "m", "connect_timeout_s": 1.0, "read_timeout_s": 2.0, "max_retries": 0, "backoff_s": 0.0}
    settings.update(options)
    return ChatClient(f"http://127.0.0.1:{port}/v1", **settings)


def echo_server(raw, reply: Callable[[bytes], bytes] = lambda body: answer(b'{"echo": ' + body + b"}")) -> RawServer:
    return raw(keep_answering(reply))


@pytest.fixture
def no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    return monkeypatch


# -- requests and kept-alive connections --------------------------------------------------------------


def test_the_request_is_one_post_with_length_host_and_the_given_headers(raw) -> None:
    server = echo_server(raw)
    response = transport(server.port).post("/v1/chat/completions", b'{"a": 1}', {"X-Request": "r1"})
    assert (response.status, response.body) == (200, b'{"echo": {"a": 1}}')
    assert response.headers["content-type"] == "application/json"
    (request,) = server.requests
    head, _, body = request.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /v1/chat/completions HTTP/1.1"
    assert {f"Host: 127.0.0.1:{server.port}", "Content-Length: 8", "Authorization: Bearer k", "Content-Type: application/json",
            "Accept-Encoding: identity", "X-Request: r1"} <= set(lines[1:])
    assert body == b'{"a": 1}'


def test_one_connection_serves_one_request_after_another(raw) -> None:
    server = echo_server(raw)
    client = transport(server.port)
    for i in range(20):
        assert client.post("/v1/x", b"%d" % i).body == b'{"echo": %d}' % i
    assert server.connections == 1


def test_many_threads_share_the_pool_and_keep_at_most_pool_size_idle(raw) -> None:
    server = echo_server(raw, lambda body: (time.sleep(0.01), answer(b'{"echo": ' + body + b"}"))[1])
    client = transport(server.port, pool_size=3)
    with ThreadPoolExecutor(16) as workers:
        bodies = list(workers.map(lambda i: client.post("/v1/x", b"%d" % i).body, range(160)))
    assert bodies == [b'{"echo": %d}' % i for i in range(160)]
    assert 3 <= server.connections <= 160
    # the connections beyond the three kept are closed; the kept ones serve what comes next
    assert server.wait_open(at_most=3) == 3
    opened = server.connections
    for i in range(6):
        assert client.post("/v1/x", b"%d" % i).body == b'{"echo": %d}' % i
    assert server.connections == opened
    client.close()
    assert server.wait_open(at_most=0) == 0


def test_connection_close_is_honoured(raw) -> None:
    server = echo_server(raw, lambda body: answer(b"{}", "Connection: close"))
    client = transport(server.port)
    for _ in range(3):
        assert client.post("/v1/x", b"1").body == b"{}"
    assert server.connections == 3


def test_an_idle_connection_the_server_closed_is_not_used_again(raw) -> None:
    # a keep-alive timeout as some servers end it: an unasked 408 and the close; the next request must
    # not read that 408 as its answer
    closed = threading.Event()

    def once(server: RawServer, conn: socket.socket, number: int) -> None:
        server.read_request(conn)
        conn.sendall(answer(b'{"n": %d}' % number))
        if number == 0:
            time.sleep(0.05)
            conn.sendall(b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
            conn.shutdown(socket.SHUT_WR)
            closed.set()

    server = raw(once)
    client = transport(server.port)
    assert client.post("/v1/x", b"1").body == b'{"n": 0}'
    assert closed.wait(5)
    time.sleep(0.05)  # the FIN travels on the loopback (no event tells the client's kernel has it)
    response = client.post("/v1/x", b"1")
    assert (response.status, response.body) == (200, b'{"n": 1}')
    assert server.connections == 2 and len(server.requests) == 2


@pytest.mark.parametrize("ending", ["close", "reset"])
def test_a_kept_connection_closed_as_the_request_went_out_is_tried_once_on_a_new_one(raw, ending: str) -> None:
    # the server reads the second request on connection 0 and closes without a word, or resets it (a race
    # with its keep-alive timeout that the idle check cannot see): that request goes once more, on a new connection
    def handler(server: RawServer, conn: socket.socket, number: int) -> None:
        server.read_request(conn)
        conn.sendall(answer(b'{"n": %d}' % number))
        if number == 0:
            server.read_request(conn)  # and no answer
            if ending == "reset":  # an RST instead of a FIN: the client's read raises ConnectionResetError
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    server = raw(handler)
    client = transport(server.port)
    assert client.post("/v1/x", b"1").body == b'{"n": 0}'
    assert client.post("/v1/x", b"2").body == b'{"n": 1}'
    assert server.connections == 2 and len(server.requests) == 3


def test_a_new_connection_closed_without_an_answer_is_a_connect_failure(raw) -> None:
    server = raw(lambda server, conn, number: server.read_request(conn) and None)
    with pytest.raises(ht.ConnectFailed, match="closed the connection without answering"):
        transport(server.port).post("/v1/x", b"1")
    assert server.connections == 1  # a new connection is not tried again here (the chat client's retries decide)


# -- how an answer is framed ------------------------------------------------------------------------


def test_a_chunked_answer_is_read_whole_and_the_connection_kept(raw) -> None:
    def reply(body: bytes) -> bytes:
        return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"

    server = echo_server(raw, reply)
    client = transport(server.port)
    assert [client.post("/v1/x", b"1").body for _ in range(2)] == [b"hello world"] * 2
    assert server.connections == 1


def test_an_answer_without_a_length_ends_with_the_connection(raw) -> None:
    def handler(server: RawServer, conn: socket.socket, number: int) -> None:
        server.read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n")
        time.sleep(0.05)
        conn.sendall(b'{"until": "close"}')

    server = raw(handler)
    client = transport(server.port)
    assert client.post("/v1/x", b"1").body == b'{"until": "close"}'
    assert client.post("/v1/x", b"1").body == b'{"until": "close"}'
    assert server.connections == 2


def test_an_error_status_comes_back_with_its_headers_and_body(raw) -> None:
    server = echo_server(raw, lambda body: answer(b'{"error": "slow down"}', "Retry-After: 2", status="429 Too Many Requests"))
    response = transport(server.port).post("/v1/x", b"1")
    assert (response.status, response.headers["retry-after"], response.body) == (429, "2", b'{"error": "slow down"}')


def test_a_cut_off_answer_is_broken(raw) -> None:
    def handler(server: RawServer, conn: socket.socket, number: int) -> None:
        server.read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"half")

    server = raw(handler)
    with pytest.raises(ht.BrokenAnswer, match="before the answer was complete"):
        transport(server.port).post("/v1/x", b"1")


def test_an_answer_over_the_cap_is_refused(raw) -> None:
    server = echo_server(raw, lambda body: answer(b"x" * 5000))
    with pytest.raises(ht.BrokenAnswer, match="larger than 4096 bytes"):
        transport(server.port, max_answer_bytes=4096).post("/v1/x", b"1")
    assert transport(server.port, max_answer_bytes=5000).post("/v1/x", b"1").body == b"x" * 5000


def test_a_chunked_answer_over_the_cap_is_refused_as_it_streams(raw) -> None:
    chunk = b"1000\r\n" + b"y" * 4096 + b"\r\n"
    sent_all = threading.Event()

    def handler(server: RawServer, conn: socket.socket, number: int) -> None:
        server.read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk * 3)
        try:
            for _ in range(20_000):  # 80 MB more, unless the client stops reading
                conn.sendall(chunk)
            sent_all.set()
        except OSError:
            pass

    server = raw(handler)
    with pytest.raises(ht.BrokenAnswer, match="larger than 10000 bytes"):
        transport(server.port, max_answer_bytes=10_000).post("/v1/x", b"1")
    assert server.wait_open(at_most=0) == 0 and not sent_all.is_set()


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_a_compressed_answer_is_uncompressed_within_the_cap(raw, encoding: str) -> None:
    import gzip
    import zlib

    text = b'{"choices": [' + b'{"n": 1}, ' * 500 + b'{"n": 2}]}'
    packed = gzip.compress(text) if encoding == "gzip" else zlib.compress(text)
    server = echo_server(raw, lambda body: answer(packed, f"Content-Encoding: {encoding}"))
    assert transport(server.port).post("/v1/x", b"1").body == text
    with pytest.raises(ht.BrokenAnswer, match="larger than 1000 bytes once uncompressed"):
        transport(server.port, max_answer_bytes=1000).post("/v1/x", b"1")  # a small packed body cannot unpack past the cap


def test_a_compression_bomb_is_not_unpacked_past_the_cap(raw) -> None:
    import tracemalloc
    import zlib

    packer = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    bomb = b"".join(packer.compress(b"\0" * 1_000_000) for _ in range(200)) + packer.flush()  # 200 MB in ~200 KB
    server = echo_server(raw, lambda body: answer(bomb, "Content-Encoding: gzip"))
    client = transport(server.port, max_answer_bytes=1 << 20)
    tracemalloc.start()
    try:
        with pytest.raises(ht.BrokenAnswer, match="once uncompressed"):
            client.post("/v1/x", b"1")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20_000_000, f"{peak} bytes allocated for a 1 MiB cap"


def test_an_answer_in_an_unknown_encoding_is_broken(raw) -> None:
    server = echo_server(raw, lambda body: answer(b"\x00\x01", "Content-Encoding: br"))
    with pytest.raises(ht.BrokenAnswer, match="encoding this client does not read: 'br'"):
        transport(server.port).post("/v1/x", b"1")


def test_an_answer_that_is_not_http_is_broken(raw) -> None:
    server = echo_server(raw, lambda body: b"SSH-2.0-OpenSSH_9.2\r\n\r\n")
    with pytest.raises(ht.BrokenAnswer, match="not an HTTP answer"):
        transport(server.port).post("/v1/x", b"1")


def test_bytes_after_the_answer_are_never_read_as_the_next_answer(raw) -> None:
    # two answers in one write: the second, unasked, sits in the client's buffer when the next request goes out
    server = echo_server(raw, lambda body: answer(b'{"asked": ' + body + b"}") + answer(b'{"unasked": 1}'))
    client = transport(server.port)
    assert [client.post("/v1/x", b"%d" % i).body for i in range(3)] == [b'{"asked": %d}' % i for i in range(3)]
    assert server.connections >= 2


# -- interim answers, 101, a trickle, an endless head --------------------------------------------------


@pytest.mark.parametrize("interim", [b"HTTP/1.1 100 Continue\r\n\r\n", b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n"])
def test_an_interim_answer_is_skipped_and_each_call_gets_its_own_answer(raw, interim: bytes) -> None:
    counter = iter(range(1000))
    server = echo_server(raw, lambda body: interim + answer(completion(f"answer {next(counter)}")))
    client = chat(server.port)
    assert [client.complete(MESSAGES).content for _ in range(3)] == ["answer 0", "answer 1", "answer 2"]
    assert server.connections == 1


def test_switching_protocols_is_a_failure_with_its_status(raw) -> None:
    server = echo_server(raw, lambda body: b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
    with pytest.raises(ht.BrokenAnswer, match="HTTP 101") as caught:
        transport(server.port).post("/v1/x", b"1")
    assert caught.value.status == 101
    client = chat(server.port, max_retries=1)
    with pytest.raises(ChatError, match="broken answer: .*HTTP 101") as failed:
        client.complete(MESSAGES)
    assert failed.value.status == 101 and failed.value.retryable
    assert server.connections == 3  # a connection that switched is never used again


def test_an_answer_trickled_byte_by_byte_ends_at_the_deadline(raw) -> None:
    # every read gets a byte within the per-read timeout; only an overall deadline ends it
    stop = threading.Event()

    def handler(server: RawServer, conn: socket.socket, number: int) -> None:
        server.read_request(conn)
        for byte in answer(completion("x" * 200)):
            if stop.wait(0.2):
                return
            conn.sendall(bytes([byte]))

    server = raw(handler)
    client = chat(server.port, read_timeout_s=1.5, max_retries=2)
    start = time.monotonic()
    try:
        with pytest.raises(ChatError, match=r"no answer within 1.5 s \(read timeout\)") as caught:
            client.complete(MESSAGES)
        took = time.monotonic() - start
    finally:
        stop.set()
    assert not caught.value.retryable
    assert 1.5 - 0.05 <= took <= 1.5 + 1.0, took
    assert server.connections == 1


def test_an_endless_header_line_ends_at_the_head_cap(raw) -> None:
    import tracemalloc

    def handler(server: RawServer, conn: socket.socket, number: int) -> None:
        server.read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nX-Endless: ")
        for _ in range(10_000):  # 640 MB, unless the client gives up
            conn.sendall(b"a" * 65536)

    server = raw(handler)
    client = transport(server.port, answer_timeout_s=30.0)
    tracemalloc.start()
    start = time.monotonic()
    try:
        with pytest.raises(ht.BrokenAnswer, match="not an HTTP answer"):
            client.post("/v1/x", b"1")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert time.monotonic() - start < 10
    assert peak < 5_000_000, f"{peak} bytes allocated for a header line"
    with pytest.raises(ChatError, match="broken answer: not an HTTP answer") as caught:
        chat(server.port).complete(MESSAGES)
    assert caught.value.retryable


# -- timeouts, refusals, sending, TLS, bad arguments --------------------------------------------------


def test_a_silent_server_is_a_read_timeout(raw) -> None:
    stop = threading.Event()
    server = raw(lambda server, conn, number: (server.read_request(conn), stop.wait(5)) and None)
    start = time.monotonic()
    try:
        with pytest.raises(ht.AnswerTimedOut, match="no answer within 0.3 s"):
            transport(server.port, answer_timeout_s=0.3).post("/v1/x", b"1")
    finally:
        stop.set()
    assert 0.3 <= time.monotonic() - start < 2
    assert server.connections == 1


def test_a_refused_connection_is_a_connect_failure() -> None:
    with pytest.raises(ht.ConnectFailed, match="refused") as caught:
        transport(free_port()).post("/v1/x", b"1")
    assert not caught.value.timed_out


def test_a_connection_that_is_never_accepted_times_out_and_is_retried() -> None:
    # a listener whose accept queue is full: the kernel drops further SYNs, the connect hangs
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    try:
        for _ in range(4):
            filler = socket.socket()
            filler.setblocking(False)
            filler.connect_ex(("127.0.0.1", port))
            fillers.append(filler)
        with pytest.raises(ht.ConnectFailed, match="timed out") as caught:
            transport(port, connect_timeout_s=0.3).post("/v1/x", b"1")
        assert caught.value.timed_out
        with pytest.raises(ChatError, match="connection timed out after 0.3 s") as failed:
            chat(port, connect_timeout_s=0.3).complete(MESSAGES)
        assert failed.value.retryable
    finally:
        for filler in fillers:
            filler.close()
        listener.close()


def test_a_server_that_stops_reading_is_a_send_failure_and_retried(raw) -> None:
    # it reads a little and no more: a large body fills the socket buffers and the send times out
    release = threading.Event()

    def handler(server: RawServer, conn: socket.socket, number: int) -> None:
        conn.recv(1024)
        release.wait(30)

    server = raw(handler, receive_buffer=4096)
    try:
        with pytest.raises(ht.SendFailed, match="sending the request timed out") as caught:
            transport(server.port, answer_timeout_s=0.5).post("/v1/x", b"x" * (32 << 20))
        assert caught.value.timed_out
        client = chat(server.port, read_timeout_s=0.5, max_retries=1)
        with pytest.raises(ChatError, match="connection failed: sending the request timed out") as failed:
            client.complete([{"role": "user", "content": "x" * (32 << 20)}])
        assert failed.value.retryable
        assert server.connections == 3  # the transport's one, then the chat client's two tries
    finally:
        release.set()


def test_a_server_that_closes_while_the_request_goes_out_is_a_send_failure(raw) -> None:
    def handler(server: RawServer, conn: socket.socket, number: int) -> None:
        conn.recv(1024)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # and close: an RST

    server = raw(handler, receive_buffer=4096)
    with pytest.raises(ht.SendFailed, match="sending the request failed"):
        transport(server.port).post("/v1/x", b"x" * (32 << 20))


def test_tls_is_verified_against_the_trusted_authorities(raw, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    authority = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("127.0.0.1").configure_cert(server_context)
    server = raw(keep_answering(lambda body: answer(b'{"tls": true}')), tls=server_context)
    with pytest.raises(ht.ConnectFailed, match="certificate verify failed"):
        transport(server.port, scheme="https").post("/v1/x", b"1")
    bundle = tmp_path / "ca.pem"
    authority.cert_pem.write_to_path(str(bundle))
    monkeypatch.setenv("SSL_CERT_FILE", str(bundle))  # as a user trusts a private authority
    client = transport(server.port, scheme="https")
    assert [client.post("/v1/x", b"1").body for _ in range(3)] == [b'{"tls": true}'] * 3
    assert server.connections == 2  # the refused handshake, then one kept connection


class Relay:
    """Relays TCP connections on 127.0.0.1 to ``port``, counting them and those still open."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections = 0
        self.open = 0
        self._changed = threading.Condition()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with self._changed:
                self.connections += 1
                self.open += 1
            threading.Thread(target=self._relay, args=(conn,), daemon=True).start()

    def _relay(self, conn: socket.socket) -> None:
        upstream = socket.create_connection(("127.0.0.1", self.target))
        threading.Thread(target=_pump, args=(upstream, conn), daemon=True).start()
        _pump(conn, upstream)  # until the client closes
        with self._changed:
            self.open -= 1
            self._changed.notify_all()

    def wait_open(self, at_most: int, timeout: float = 10.0) -> int:
        with self._changed:
            self._changed.wait_for(lambda: self.open <= at_most, timeout)
            return self.open

    def close(self) -> None:
        self.listener.close()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for sock in (source, sink):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def test_it_speaks_to_uvicorn_as_a_model_server_does() -> None:
    # the OpenAI stub runs on uvicorn, as vLLM's server does: many calls, one connection, closed by close()
    with OpenAIStub() as stub:
        relay = Relay(stub.port)
        try:
            client = transport(relay.port)
            for i in range(5):
                response = client.post("/v1/chat/completions", b'{"model": "m", "messages": [{"role": "user", "content": "%d"}]}' % i)
                assert response.status == 200 and b"chat.completion" in response.body
            assert (relay.connections, relay.wait_open(at_most=1)) == (1, 1)
            client.close()
            assert relay.wait_open(at_most=0) == 0
        finally:
            relay.close()


# -- proxies from the environment ----------------------------------------------------------------------


class ForwardProxy:
    """A tiny HTTP forward proxy on 127.0.0.1: absolute-form requests, each forwarded on a new connection, counted.

    ``hosts`` maps names only the proxy knows to addresses (the client cannot resolve them)."""

    def __init__(self, hosts: dict[str, str]) -> None:
        self.hosts = hosts
        self.server = RawServer(self._serve).__enter__()
        self.url = f"http://127.0.0.1:{self.server.port}"
        self.targets: list[str] = []

    def _serve(self, server: RawServer, conn: socket.socket, number: int) -> None:
        while (body := server.read_request(conn)) is not None:
            head = server.requests[-1].partition(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")
            method, target, _version = head[0].split(" ")
            self.targets.append(target)
            url = urllib.parse.urlsplit(target)
            assert url.scheme == "http" and url.hostname, target  # the absolute form
            fields = [line for line in head[1:] if not line.lower().startswith(("connection:", "proxy-"))]
            request = "\r\n".join([f"{method} {url.path} HTTP/1.1", *fields, "Connection: close", "", ""]).encode("latin-1") + body
            with socket.create_connection((self.hosts.get(url.hostname, url.hostname), url.port or 80)) as upstream:
                upstream.sendall(request)
                reply = b""
                while data := upstream.recv(65536):
                    reply += data
            conn.sendall(reply)

    @property
    def count(self) -> int:
        return len(self.targets)

    def close(self) -> None:
        self.server.__exit__()


@pytest.fixture
def proxy(no_proxy_env) -> Iterator[ForwardProxy]:
    forward = ForwardProxy({"model.invalid": "127.0.0.1"})
    no_proxy_env.setenv("HTTP_PROXY", forward.url)
    yield forward
    forward.close()


def test_http_proxy_from_the_environment_is_used(proxy: ForwardProxy) -> None:
    # the model server's name resolves only at the proxy: an answer came through it
    with OpenAIStub() as stub:
        client = ChatClient(f"http://model.invalid:{stub.port}/v1", model="m", max_retries=0)
        assert [client.complete(MESSAGES).finish_reason for _ in range(3)] == ["stop"] * 3
        client.close()
    assert proxy.targets == [f"http://model.invalid:{stub.port}/v1/chat/completions"] * 3


def test_no_proxy_bypasses_the_proxy(proxy: ForwardProxy, no_proxy_env: pytest.MonkeyPatch) -> None:
    no_proxy_env.setenv("NO_PROXY", "127.0.0.1")
    with OpenAIStub() as stub:
        client = ChatClient(stub.api_base, model="m", max_retries=0)
        assert client.complete(MESSAGES).finish_reason == "stop"
        client.close()
        assert stub.count == 1
    assert proxy.count == 0


def test_a_local_endpoint_goes_through_the_proxy_unless_no_proxy_names_it(proxy: ForwardProxy) -> None:
    # as requests does it: 127.0.0.1 is not bypassed by itself
    assert ht.proxy_for("http://127.0.0.1:8000/v1") == proxy.url
    with OpenAIStub() as stub:
        client = ChatClient(stub.api_base, model="m", max_retries=0)
        assert client.complete(MESSAGES).finish_reason == "stop"
        client.close()
    assert proxy.count == 1
