"""Send many ``/virtual`` requests over loopback at a fixed concurrency and keep every answer.

A lean asyncio HTTP/1.1 keep-alive client (the Python cost per request stays well below
the server's).  Each request's outcome is kept: status, the ``X-STM-Outcome`` header and
the body, or the connection error that ended it, so a test can tell exactly which
answers were acknowledged.  A connection that breaks is reopened for the next request.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit


@dataclass
class Answer:
    index: int
    status: int
    """0 when the connection failed before a complete answer."""
    outcome: str = ""
    body: bytes = b""
    error: str = ""
    finished_at: float = 0.0
    """``time.monotonic()`` when the answer was complete (or the connection failed)."""

    @property
    def ok(self) -> bool:
        return self.status == 200

    def json(self) -> Any:
        return json.loads(self.body)


async def _read_answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    status_line = await reader.readline()
    if not status_line:
        raise ConnectionError("connection closed")
    headers: dict[str, str] = {}
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b""):
            break
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return int(status_line.split()[1]), headers, body


def send_all(
    urls: str | Sequence[str],
    payloads: Sequence[Any],
    *,
    concurrency: int = 64,
    timeout_s: float = 60.0,
    stop: threading.Event | None = None,
    seen: list[Answer] | None = None,
) -> list[Answer]:
    """POST every payload (JSON) once, ``concurrency`` at a time, spread round robin over ``urls``.

    With ``stop``, requests not started once it is set are skipped (their answers are absent).  ``seen`` gets each
    answer as it completes, so another thread can watch the progress (and set ``stop``) without timing guesses.
    """
    targets = [urls] if isinstance(urls, str) else list(urls)
    parsed = [urlsplit(u) for u in targets]
    for p in parsed:
        assert p.hostname in ("127.0.0.1", "localhost"), "load only ever goes to loopback"
    bodies = [json.dumps(p).encode() for p in payloads]
    answers: list[Answer | None] = [None] * len(bodies)

    async def worker(wid: int, queue: asyncio.Queue[int]) -> None:
        target = parsed[wid % len(parsed)]
        host, port = target.hostname or "127.0.0.1", target.port or 80
        reader = writer = None
        while True:
            try:
                i = queue.get_nowait()
            except asyncio.QueueEmpty:
                break
            if stop is not None and stop.is_set():
                continue
            body = bodies[i]
            head = (f"POST {target.path or '/'} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\n\r\n").encode()
            try:
                if writer is None:
                    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
                writer.write(head + body)
                status, headers, data = await asyncio.wait_for(_read_answer(reader), timeout_s)  # type: ignore[arg-type]
                answers[i] = Answer(i, status, headers.get("x-stm-outcome", ""), data, finished_at=time.monotonic())
                if seen is not None:
                    seen.append(answers[i])  # type: ignore[arg-type]
                if headers.get("connection", "").lower() == "close":
                    writer.close()
                    reader = writer = None
            except (TimeoutError, OSError, ConnectionError, asyncio.IncompleteReadError, ValueError, IndexError) as exc:
                answers[i] = Answer(i, 0, error=f"{type(exc).__name__}: {exc}", finished_at=time.monotonic())
                if writer is not None:
                    writer.close()
                reader = writer = None
        if writer is not None:
            writer.close()

    async def main() -> None:
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(len(bodies)):
            queue.put_nowait(i)
        await asyncio.gather(*(worker(w, queue) for w in range(concurrency)))

    asyncio.run(main())
    return [a for a in answers if a is not None]
