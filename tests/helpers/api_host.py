"""A real scripted HTTP server on 127.0.0.1 standing in for the ToolBench relay or a RapidAPI host.

Every request is recorded as a :class:`Received` (method, path, query, headers,
body).  A *script* function gets each :class:`Received` and returns a
:class:`HostReply`:

* ``HostReply(body={...})``: a JSON answer (any non-``str``/``bytes`` body is JSON-encoded);
* ``HostReply(body="text", content_type="text/plain")``: a text answer;
* ``HostReply(status=503, body=...)``: an error status;
* ``HostReply(delay_s=1.0)``: answer late;
* ``HostReply(hang=True)``: accept the request and never answer (a dead upstream);
* ``HostReply(close=True)``: drop the connection mid-answer.

``relay_reply(error, response)`` is the relay's ``{"error", "response"}`` answer.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

from tests.helpers.live import ScriptedApp, free_port, read_body


@dataclass
class HostReply:
    body: Any = ""
    status: int = 200
    content_type: str | None = None
    """Defaults to ``application/json`` for a JSON body and ``text/plain; charset=utf-8`` for text."""
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    hang: bool = False
    close: bool = False


@dataclass(frozen=True)
class Received:
    method: str
    path: str
    """The raw (still percent-encoded) request path."""
    raw_query: str
    headers: dict[str, str]
    """Lower-cased header names."""
    body: bytes

    @property
    def query(self) -> dict[str, list[str]]:
        return parse_qs(self.raw_query, keep_blank_values=True)

    def json(self) -> Any:
        return json.loads(self.body)


Script = Callable[[Received], HostReply]


def relay_reply(error: str = "", response: Any = "ok", **extra: Any) -> HostReply:
    """A relay answer ``{"error": error, "response": response}``."""
    return HostReply(body={"error": error, "response": response, **extra})


def ok_script(received: Received) -> HostReply:
    return relay_reply("", {"echo_path": received.path})


class ApiHost(ScriptedApp):
    """The scripted server; use as a context manager.  ``url`` is ``http://127.0.0.1:PORT``."""

    def __init__(self, script: Script = ok_script, *, port: int | None = None) -> None:
        self.script = script
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.received: list[Received] = []
        self._lock = threading.Lock()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = await read_body(receive)
        received = Received(
            method=scope["method"],
            path=scope.get("raw_path", scope["path"].encode()).decode("latin-1").split("?")[0],
            raw_query=scope.get("query_string", b"").decode("latin-1"),
            headers={k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]},
            body=body,
        )
        with self._lock:
            self.received.append(received)
        reply = self.script(received)
        if reply.delay_s:
            await asyncio.sleep(reply.delay_s)
        if reply.hang:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                pass
            return
        if reply.close:
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"1000")]})
            await send({"type": "http.response.body", "body": b"{", "more_body": False})
            return
        if isinstance(reply.body, bytes):
            payload, default_type = reply.body, "application/octet-stream"
        elif isinstance(reply.body, str):
            payload, default_type = reply.body.encode("utf-8"), "text/plain; charset=utf-8"
        else:
            payload, default_type = json.dumps(reply.body).encode("utf-8"), "application/json"
        headers = [
            (b"content-type", (reply.content_type or default_type).encode("latin-1")),
            (b"content-length", str(len(payload)).encode()),
        ]
        headers += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in reply.headers.items()]
        await send({"type": "http.response.start", "status": reply.status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})

    @property
    def count(self) -> int:
        with self._lock:
            return len(self.received)

    @property
    def last(self) -> Received:
        with self._lock:
            return self.received[-1]
