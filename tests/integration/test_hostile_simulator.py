"""A hostile model server behind the simulator, through the real server in ``record`` mode (Integrity IV).

A scripted TCP server on 127.0.0.1 answers each chat call with exactly the bytes a test gives. What
the agent is served and what the store records must be the call's own answer or a failure record:
an interim ``100 Continue`` never shifts answers between calls, an answer trickled byte by byte ends
at ``read_timeout_s``, an endless header ends at the header cap, ``101`` is a failure, never an HTTP
500.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from stabletoolbench_mirror.engine.layer import MirrorLayer
from stabletoolbench_mirror.factory import build_layer
from stabletoolbench_mirror.responders import simulator as simulator_module
from stabletoolbench_mirror.stores.base import StoreError

API = "Tools/t_for_Tools/a"
Handler = Callable[[socket.socket, bytes], None]
"""Answers one request (its body given) on the connection."""


def completion(text: str, finish_reason: str = "stop") -> bytes:
    return json.dumps({"id": "c", "object": "chat.completion", "model": "m", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": json.dumps({"error": "", "response": text})},
         "finish_reason": finish_reason}]}).encode()


def http_answer(body: bytes, status: str = "200 OK") -> bytes:
    return f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body


class ScriptedModelServer:
    """Reads each request on 127.0.0.1 and hands it to ``handler``, connection by connection."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.api_base = f"http://127.0.0.1:{self.listener.getsockname()[1]}/v1"
        self.bodies: list[dict[str, Any]] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            while (body := self._read(conn)) is not None:
                self.bodies.append(json.loads(body))
                self.handler(conn, body)
        except OSError:
            pass
        finally:
            conn.close()

    @staticmethod
    def _read(conn: socket.socket) -> bytes | None:
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
        return body

    def close(self) -> None:
        self.listener.close()


def asked(body: bytes) -> str:
    """The call's input as the simulator's prompt names it (its last message holds the tool input)."""
    return json.loads(body)["messages"][-1]["content"]


@pytest.fixture
def mirror(serve, settings_factory, tmp_path: Path, monkeypatch) -> Iterator[Callable[..., Any]]:
    started: list[tuple[ScriptedModelServer, MirrorLayer]] = []
    monkeypatch.setattr(simulator_module, "BACKOFF_S", 0.01)

    def start(handler: Handler, **simulator: Any):
        model = ScriptedModelServer(handler)
        cfg = {"enabled": True, "api_base": model.api_base, "model": "m", "max_retries": 0,
               "read_timeout_s": 3.0, "connect_timeout_s": 1.0, "allow_without_docs": True, "validity": "off", **simulator}
        settings = settings_factory(mode="record", simulator=cfg)
        layer = build_layer(settings)
        started.append((model, layer))
        return serve(settings, layer), layer, model

    yield start
    for model, layer in started:
        layer.close()
        model.close()


def call(server, n: int):
    return server.post({"category": "Tools", "tool_name": "t", "api_name": "a", "tool_input": json.dumps({"n": n}),
                        "strip": "", "toolbench_key": ""})


def recorded(layer: MirrorLayer, n: int):
    try:
        return layer.store.get(API, str({"n": n}))
    except StoreError:  # pragma: no cover - a local store does not fail here
        return None


@pytest.mark.parametrize("interim", [b"HTTP/1.1 100 Continue\r\n\r\n", b"HTTP/1.1 103 Early Hints\r\nLink: </x>; rel=preload\r\n\r\n"],
                         ids=["100", "103"])
def test_an_interim_answer_never_shifts_answers_between_calls(mirror, interim: bytes) -> None:
    def handler(conn: socket.socket, body: bytes) -> None:
        prompt = asked(body)
        text = "answer to n=1" if ('"n": 1' in prompt or "'n': 1" in prompt) else "answer to another call"
        conn.sendall(interim + http_answer(completion(text)))

    server, layer, model = mirror(handler)
    first, second = call(server, 1), call(server, 2)
    assert (first.status_code, second.status_code) == (200, 200)
    assert first.json()["response"] == "answer to n=1"
    assert second.json()["response"] == "answer to another call"
    assert json.loads(recorded(layer, 1).body)["response"] == "answer to n=1"
    assert json.loads(recorded(layer, 2).body)["response"] == "answer to another call"
    assert len(model.bodies) == 2


def test_an_answer_trickled_byte_by_byte_ends_at_the_read_timeout_as_a_failure_record(mirror) -> None:
    def handler(conn: socket.socket, body: bytes) -> None:
        for byte in http_answer(completion("too slow")):
            conn.sendall(bytes([byte]))
            time.sleep(0.2)

    server, layer, _ = mirror(handler, read_timeout_s=2.0)
    started = time.monotonic()
    served = call(server, 1)
    took = time.monotonic() - started
    assert served.status_code == 200 and served.headers["x-stm-outcome"] != "recorded"
    assert 1.0 <= took <= 3.0 + 2.0, took  # the deadline (2 s), give or take a second, and the server's own work
    record = recorded(layer, 1)
    assert record is not None and record.is_failure and "no answer within 2 s" in record.reason


def test_an_endless_header_ends_at_the_cap_as_a_failure_record(mirror) -> None:
    def handler(conn: socket.socket, body: bytes) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nX-Endless: ")
        chunk = b"a" * 65536
        for _ in range(64):  # 4 MiB of one header line, far past the cap
            conn.sendall(chunk)

    server, layer, _ = mirror(handler)
    served = call(server, 1)
    assert served.status_code == 200
    record = recorded(layer, 1)
    assert record is not None and record.is_failure and "broken answer" in record.reason


def test_switching_protocols_is_a_failure_record_not_a_500(mirror) -> None:
    def handler(conn: socket.socket, body: bytes) -> None:
        conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")

    server, layer, _ = mirror(handler)
    served = call(server, 1)
    assert served.status_code == 200, served.text
    record = recorded(layer, 1)
    assert record is not None and record.is_failure and "101" in record.reason


def test_a_completion_cut_at_max_tokens_is_a_failure_record(mirror) -> None:
    server, layer, _ = mirror(lambda conn, body: conn.sendall(http_answer(completion("cut", finish_reason="length"))))
    served = call(server, 1)
    assert served.status_code == 200
    record = recorded(layer, 1)
    assert record is not None and record.is_failure and "finish_reason length" in record.reason
