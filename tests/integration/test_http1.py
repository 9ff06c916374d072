"""The simulator's HTTP/1.1 transport against real sockets on 127.0.0.1.

A scripted TCP server (:class:`RawServer`) answers each connection with exactly the bytes a test
gives, so each way a model server can frame, cut or close an answer is played out on a real
socket: kept-alive reuse, chunked and read-to-close bodies, a server that closed an idle
connection, truncated, oversized and non-HTTP answers, timeouts, refused connections, TLS.
"""

from __future__ import annotations

import socket
import ssl
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterator

import pytest
import trustme

from stabletoolbench_mirror.responders.simulator import http1
from tests.helpers.live import free_port
from tests.helpers.openai_stub import OpenAIStub

Handler = Callable[["RawServer", socket.socket, int], None]
"""Serves one accepted connection of the server (and its number, from 0)."""


class RawServer:
    """Accepts connections on 127.0.0.1 and hands each to ``handler`` in its own thread."""

    def __init__(self, handler: Handler, tls: ssl.SSLContext | None = None) -> None:
        self.handler = handler
        self.tls = tls
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections = 0
        self.requests: list[bytes] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def __enter__(self) -> "RawServer":
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
            with self._lock:
                number = self.connections
                self.connections += 1
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
        with self._lock:
            self.requests.append(head + b"\r\n\r\n" + body)
        return body


def answer(body: bytes, *extra: str, status: str = "200 OK") -> bytes:
    head = "".join(f"{h}\r\n" for h in extra)
    return f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n{head}\r\n".encode() + body


def keep_answering(reply: Callable[[bytes], bytes]) -> Handler:
    """Answer every request on the connection with ``reply(body)`` until the client closes."""

    def handler(server: RawServer, conn: socket.socket, number: int) -> None:
        while (body := server.read_request(conn)) is not None:
            conn.sendall(reply(body))

    return handler


@pytest.fixture
def raw() -> Iterator[Callable[[Handler], RawServer]]:
    servers: list[RawServer] = []

    def start(handler: Handler, tls: ssl.SSLContext | None = None) -> RawServer:
        server = RawServer(handler, tls).__enter__()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.__exit__()


def pool(port: int, scheme: str = "http", **options: object) -> http1.Pool:
    settings: dict = {"maxsize": 4, "connect_timeout_s": 1.0, "read_timeout_s": 2.0, "max_answer_bytes": 1 << 20}
    settings.update(options)
    return http1.Pool(f"{scheme}://127.0.0.1:{port}/v1", {"Content-Type": "application/json", "Authorization": "Bearer k"}, **settings)


def echo_server(raw, reply: Callable[[bytes], bytes] = lambda body: answer(b'{"echo": ' + body + b"}")) -> RawServer:
    return raw(keep_answering(reply))


# -- requests and kept-alive connections --------------------------------------------------------------


def test_the_request_is_one_post_with_length_host_and_the_given_headers(raw) -> None:
    server = echo_server(raw)
    response = pool(server.port).post("/v1/chat/completions", b'{"a": 1}')
    assert (response.status, response.body) == (200, b'{"echo": {"a": 1}}')
    assert response.headers["content-type"] == "application/json"
    (request,) = server.requests
    head, _, body = request.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /v1/chat/completions HTTP/1.1"
    assert {"Host: 127.0.0.1:%d" % server.port, "Content-Length: 8", "Authorization: Bearer k", "Content-Type: application/json",
            "Accept-Encoding: identity"} <= set(lines[1:])
    assert body == b'{"a": 1}'


def test_one_connection_serves_one_request_after_another(raw) -> None:
    server = echo_server(raw)
    client = pool(server.port)
    for i in range(20):
        assert client.post("/v1/x", b"%d" % i).body == b'{"echo": %d}' % i
    assert server.connections == 1


def test_many_threads_share_the_pool_and_keep_at_most_maxsize_idle(raw) -> None:
    server = echo_server(raw, lambda body: (time.sleep(0.01), answer(b'{"echo": ' + body + b"}"))[1])
    client = pool(server.port, maxsize=3)
    with ThreadPoolExecutor(16) as workers:
        bodies = list(workers.map(lambda i: client.post("/v1/x", b"%d" % i).body, range(160)))
    assert bodies == [b'{"echo": %d}' % i for i in range(160)]
    assert len(client._idle) <= 3  # noqa: SLF001 - what the pool keeps
    assert 3 <= server.connections <= 160


def test_connection_close_is_honoured(raw) -> None:
    server = echo_server(raw, lambda body: answer(b"{}", "Connection: close"))
    client = pool(server.port)
    for _ in range(3):
        assert client.post("/v1/x", b"1").body == b"{}"
    assert server.connections == 3


def test_an_idle_connection_the_server_closed_is_not_used_again(raw) -> None:
    # a keep-alive timeout as some servers end it: an unasked 408 and the close; the next request must
    # not read that 408 as its answer
    def once(server: RawServer, conn: socket.socket, number: int) -> None:
        server.read_request(conn)
        conn.sendall(answer(b'{"n": %d}' % number))
        time.sleep(0.05)
        conn.sendall(b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")

    server = raw(once)
    client = pool(server.port)
    assert client.post("/v1/x", b"1").body == b'{"n": 0}'
    time.sleep(0.2)  # the 408 and the close have arrived
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
            if ending == "reset":  # an RST instead of a FIN: the client's recv raises ConnectionResetError
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    server = raw(handler)
    client = pool(server.port)
    assert client.post("/v1/x", b"1").body == b'{"n": 0}'
    assert client.post("/v1/x", b"2").body == b'{"n": 1}'
    assert server.connections == 2 and len(server.requests) == 3


def test_a_new_connection_closed_without_an_answer_is_a_connect_failure(raw) -> None:
    server = raw(lambda server, conn, number: server.read_request(conn) and None)
    with pytest.raises(http1.ConnectFailed, match="closed the connection without answering"):
        pool(server.port).post("/v1/x", b"1")
    assert server.connections == 1  # a new connection is not tried again here (the chat client's retries decide)


# -- how an answer is framed ------------------------------------------------------------------------


def test_a_chunked_answer_is_read_whole_and_the_connection_kept(raw) -> None:
    def reply(body: bytes) -> bytes:
        return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"

    server = echo_server(raw, reply)
    client = pool(server.port)
    assert [client.post("/v1/x", b"1").body for _ in range(2)] == [b"hello world"] * 2
    assert server.connections == 1


def test_an_answer_without_a_length_ends_with_the_connection(raw) -> None:
    def handler(server: RawServer, conn: socket.socket, number: int) -> None:
        server.read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n")
        time.sleep(0.05)
        conn.sendall(b'{"until": "close"}')

    server = raw(handler)
    client = pool(server.port)
    assert client.post("/v1/x", b"1").body == b'{"until": "close"}'
    assert client.post("/v1/x", b"1").body == b'{"until": "close"}'
    assert server.connections == 2


def test_an_error_status_comes_back_with_its_headers_and_body(raw) -> None:
    server = echo_server(raw, lambda body: answer(b'{"error": "slow down"}', "Retry-After: 2", status="429 Too Many Requests"))
    response = pool(server.port).post("/v1/x", b"1")
    assert (response.status, response.headers["retry-after"], response.body) == (429, "2", b'{"error": "slow down"}')


def test_a_cut_off_answer_is_broken(raw) -> None:
    def handler(server: RawServer, conn: socket.socket, number: int) -> None:
        server.read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"half")

    server = raw(handler)
    with pytest.raises(http1.BrokenAnswer, match="before the answer was complete"):
        pool(server.port).post("/v1/x", b"1")


def test_an_answer_over_the_cap_is_refused(raw) -> None:
    server = echo_server(raw, lambda body: answer(b"x" * 5000))
    with pytest.raises(http1.BrokenAnswer, match="larger than 4096 bytes"):
        pool(server.port, max_answer_bytes=4096).post("/v1/x", b"1")
    assert pool(server.port, max_answer_bytes=5000).post("/v1/x", b"1").body == b"x" * 5000


def test_a_chunked_answer_over_the_cap_is_refused(raw) -> None:
    chunk = b"1000\r\n" + b"y" * 4096 + b"\r\n"
    server = echo_server(raw, lambda body: b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk * 3 + b"0\r\n\r\n")
    with pytest.raises(http1.BrokenAnswer, match="larger than 10000 bytes"):
        pool(server.port, max_answer_bytes=10_000).post("/v1/x", b"1")


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_a_compressed_answer_is_uncompressed_within_the_cap(raw, encoding: str) -> None:
    import gzip
    import zlib

    text = b'{"choices": [' + b'{"n": 1}, ' * 500 + b'{"n": 2}]}'
    packed = gzip.compress(text) if encoding == "gzip" else zlib.compress(text)
    server = echo_server(raw, lambda body: answer(packed, f"Content-Encoding: {encoding}"))
    assert pool(server.port).post("/v1/x", b"1").body == text
    with pytest.raises(http1.BrokenAnswer, match="larger than 1000 bytes once uncompressed"):
        pool(server.port, max_answer_bytes=1000).post("/v1/x", b"1")  # a small packed body cannot unpack past the cap


def test_a_compression_bomb_is_not_unpacked_past_the_cap(raw) -> None:
    import tracemalloc
    import zlib

    packer = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    bomb = b"".join(packer.compress(b"\0" * 1_000_000) for _ in range(200)) + packer.flush()  # 200 MB in ~200 KB
    server = echo_server(raw, lambda body: answer(bomb, "Content-Encoding: gzip"))
    client = pool(server.port, max_answer_bytes=1 << 20)
    tracemalloc.start()
    try:
        with pytest.raises(http1.BrokenAnswer, match="once uncompressed"):
            client.post("/v1/x", b"1")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20_000_000, f"{peak} bytes allocated for a 1 MiB cap"


def test_an_answer_in_an_unknown_encoding_is_broken(raw) -> None:
    server = echo_server(raw, lambda body: answer(b"\x00\x01", "Content-Encoding: br"))
    with pytest.raises(http1.BrokenAnswer, match="encoding this client does not read: 'br'"):
        pool(server.port).post("/v1/x", b"1")


def test_an_answer_that_is_not_http_is_broken(raw) -> None:
    server = echo_server(raw, lambda body: b"SSH-2.0-OpenSSH_9.2\r\n\r\n")
    with pytest.raises(http1.BrokenAnswer, match="not an HTTP answer"):
        pool(server.port).post("/v1/x", b"1")


def test_bytes_after_the_answer_retire_the_connection(raw) -> None:
    server = echo_server(raw, lambda body: answer(b"{}") + answer(b'{"unasked": 1}'))
    client = pool(server.port)
    assert client.post("/v1/x", b"1").body == b"{}"
    assert client.post("/v1/x", b"1").body == b"{}"
    assert server.connections == 2


# -- timeouts, refusals, TLS, bad arguments ----------------------------------------------------------


def test_a_silent_server_is_a_read_timeout(raw) -> None:
    server = raw(lambda server, conn, number: (server.read_request(conn), time.sleep(3)) and None)
    start = time.monotonic()
    with pytest.raises(http1.ReadTimedOut, match="no answer within 0.3 s"):
        pool(server.port, read_timeout_s=0.3).post("/v1/x", b"1")
    assert 0.3 <= time.monotonic() - start < 2
    assert server.connections == 1


def test_a_refused_connection_is_a_connect_failure() -> None:
    with pytest.raises(http1.ConnectFailed, match="refused") as caught:
        pool(free_port()).post("/v1/x", b"1")
    assert not caught.value.timed_out


def test_tls_is_verified_against_the_trusted_authorities(raw, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    authority = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("127.0.0.1").configure_cert(server_context)
    server = raw(keep_answering(lambda body: answer(b'{"tls": true}')), tls=server_context)
    with pytest.raises(http1.ConnectFailed, match="certificate verify failed"):
        pool(server.port, scheme="https").post("/v1/x", b"1")
    bundle = tmp_path / "ca.pem"
    authority.cert_pem.write_to_path(str(bundle))
    monkeypatch.setenv("SSL_CERT_FILE", str(bundle))  # as a user trusts a private authority
    client = pool(server.port, scheme="https")
    assert [client.post("/v1/x", b"1").body for _ in range(3)] == [b'{"tls": true}'] * 3
    assert server.connections == 2  # the refused handshake, then one kept connection


def test_line_breaks_in_headers_or_path_are_refused() -> None:
    with pytest.raises(ValueError, match="line break"):
        http1.Pool("http://127.0.0.1:1/v1", {"Authorization": "Bearer k\r\nX-Injected: 1"}, maxsize=1,
                   connect_timeout_s=1, read_timeout_s=1, max_answer_bytes=10)
    with pytest.raises(ValueError, match="not a request path"):
        pool(1).post("/v1/x HTTP/1.1\r\nX: y", b"")


def test_it_speaks_to_uvicorn_as_a_model_server_does() -> None:
    # the OpenAI stub runs on uvicorn, as vLLM's server does: many calls, one connection
    with OpenAIStub() as stub:
        client = pool(stub.port)
        for i in range(5):
            response = client.post("/v1/chat/completions", b'{"model": "m", "messages": [{"role": "user", "content": "%d"}]}' % i)
            assert response.status == 200 and b"chat.completion" in response.body
        assert len(client._idle) == 1  # noqa: SLF001
        client.close()
        assert client._idle == []  # noqa: SLF001
