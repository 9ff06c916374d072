"""One replay server's app alone: an MCP session's ``tools/call`` s handed to its ASGI app in process, no socket.

``benchmarks/live_mcp.py`` runs it once per replayer, each in its own venv (the standard library only here), so
the figure is the server's own work per call, without the HTTP client, the kernel and the HTTP parser that
the over-the-wire figures share::

    python benchmarks/_asgi_calls.py mirror CONFIG.yml CALLS      # this project's app (create_app)
    python benchmarks/_asgi_calls.py mcp-recorder CASSETTE CALLS  # mcp-recorder 0.5's replay app

It prints one JSON line: the per-call seconds of the calls, each answered once (``mcp-recorder`` uses each
recorded interaction once per process) and checked to be a result.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any


def arguments(i: int) -> dict[str, Any]:
    """The ``i``-th recorded call's arguments (as ``live_mcp.py`` records them)."""
    return {"text": f"call {i}: " + "lorem ipsum " * 20}


class Session:
    """Posts to ``/mcp`` of an ASGI app, keeping the ``mcp-session-id`` it hands out."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.sid: str | None = None

    async def post(self, message: dict[str, Any]) -> bytes:
        body = json.dumps(message).encode()
        headers = [(b"host", b"127.0.0.1"), (b"accept", b"application/json, text/event-stream"),
                   (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        if self.sid is not None:
            headers.append((b"mcp-session-id", self.sid.encode()))
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
                 "path": "/mcp", "raw_path": b"/mcp", "query_string": b"", "root_path": "", "headers": headers,
                 "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8080), "state": {}}
        sent: list[dict[str, Any]] = []
        done = asyncio.Event()
        unread = [True]

        async def receive() -> dict[str, Any]:
            if unread[0]:
                unread[0] = False
                return {"type": "http.request", "body": body, "more_body": False}
            await done.wait()
            return {"type": "http.disconnect"}

        async def send(event: dict[str, Any]) -> None:
            sent.append(event)
            if event["type"] == "http.response.body" and not event.get("more_body"):
                done.set()

        await self.app(scope, receive, send)
        for event in sent:
            if event["type"] == "http.response.start":
                self.sid = next((v.decode() for k, v in event["headers"] if k == b"mcp-session-id"), self.sid)
        return b"".join(event.get("body", b"") for event in sent if event["type"] == "http.response.body")


async def _lifespan(app: Any) -> Any:
    """The app's lifespan started (the mirror starts its live servers' listings there); the task that holds it."""
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    started = asyncio.Event()

    async def send(event: dict[str, Any]) -> None:
        if event["type"].startswith("lifespan.startup"):
            started.set()

    task = asyncio.ensure_future(app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, queue.get, send))
    await queue.put({"type": "lifespan.startup"})
    await asyncio.wait_for(started.wait(), 60)
    return task


async def measure(app: Any, calls: int) -> list[float]:
    task = await _lifespan(app)
    session = Session(app)
    await session.post({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "mcp-recorder", "version": "0.1.0"}}})
    await session.post({"jsonrpc": "2.0", "method": "notifications/initialized", "params": {}})
    seconds = []
    for i in range(calls):
        message = {"jsonrpc": "2.0", "id": i + 1, "method": "tools/call", "params": {"name": "echo", "arguments": arguments(i)}}
        started = time.perf_counter()
        answer = await session.post(message)
        seconds.append(time.perf_counter() - started)
        text = answer.decode()
        if text.startswith("event:") or text.startswith("data:"):
            text = next(line[5:].strip() for line in text.splitlines() if line.startswith("data:"))
        if "result" not in json.loads(text):
            raise RuntimeError(f"call {i}: no result: {text[:200]}")
    task.cancel()
    return seconds


def _app(kind: str, path: str) -> Any:
    if kind == "mirror":
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from stabletoolbench_mirror.config import load_settings
        from stabletoolbench_mirror.serving.server import create_app

        return create_app(load_settings(path, environ={}))
    from mcp_recorder._utils import load_cassette
    from mcp_recorder.matcher import create_matcher
    from mcp_recorder.replayer import create_replay_app

    loaded = load_cassette(Path(path))
    return create_replay_app(loaded, create_matcher("method_params", loaded.interactions))


if __name__ == "__main__":
    import logging

    logging.disable(logging.WARNING)
    print(json.dumps(asyncio.run(measure(_app(sys.argv[1], sys.argv[2]), int(sys.argv[3])))))
