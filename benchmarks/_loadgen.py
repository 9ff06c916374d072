"""A small keep-alive HTTP/1.1 load generator over asyncio streams (loopback only, bounded in time).

Lean on purpose: the client's own cost per request should stay well below the server's.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


@dataclass
class LoadResult:
    latencies_s: list[float] = field(default_factory=list)
    errors: int = 0
    statuses: dict[int, int] = field(default_factory=dict)
    elapsed_s: float = 0.0

    @property
    def requests(self) -> int:
        return len(self.latencies_s)

    @property
    def rps(self) -> float:
        return self.requests / self.elapsed_s if self.elapsed_s else 0.0

    def pct(self, q: float) -> float:
        if not self.latencies_s:
            return float("nan")
        ordered = sorted(self.latencies_s)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    @property
    def p50_ms(self) -> float:
        return statistics.median(self.latencies_s) * 1000 if self.latencies_s else float("nan")

    @property
    def p99_ms(self) -> float:
        return self.pct(0.99) * 1000


def _request_bytes(host: str, port: int, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    head = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}", "Content-Type: application/json", f"Content-Length: {len(body)}"]
    head += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, payload: bytes, result: LoadResult) -> bytes:
    """One request and its response on a keep-alive connection, recorded in ``result``; the response's body."""
    start = time.perf_counter()
    writer.write(payload)
    status_line = await reader.readline()
    length = 0
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b""):
            break
        name, _, value = line.decode("latin-1").partition(":")
        if name.lower() == "content-length":
            length = int(value.strip())
    body = await reader.readexactly(length)
    result.latencies_s.append(time.perf_counter() - start)
    status = int(status_line.split()[1]) if status_line else 0
    result.statuses[status] = result.statuses.get(status, 0) + 1
    if status != 200:
        result.errors += 1
    return body


async def _one_connection(host: str, port: int, path: str, bodies: Callable[[int], bytes], deadline: float,
                          max_requests: int, result: LoadResult, worker: int, headers: dict[str, str]) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    n = 0
    try:
        while time.perf_counter() < deadline and n < max_requests:
            payload = _request_bytes(host, port, path, bodies(worker * 1_000_003 + n), headers)
            n += 1
            await _exchange(reader, writer, payload, result)
    except (ConnectionError, asyncio.IncompleteReadError, OSError):
        result.errors += 1
    finally:
        writer.close()


def run_load(url: str, bodies: Callable[[int], bytes], *, concurrency: int, duration_s: float,
             max_requests: int = 10_000_000, headers: dict[str, str] | None = None) -> LoadResult:
    """Drive ``url`` with ``concurrency`` keep-alive connections for ``duration_s`` seconds."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    host, port, path = parts.hostname or "127.0.0.1", parts.port or 80, parts.path or "/"
    assert host in ("127.0.0.1", "localhost", "::1"), "load only ever goes to loopback"
    result = LoadResult()

    async def main() -> None:
        deadline = time.perf_counter() + duration_s
        start = time.perf_counter()
        await asyncio.gather(*(
            _one_connection(host, port, path, bodies, deadline, max_requests, result, i, headers or {})
            for i in range(concurrency)
        ))
        result.elapsed_s = time.perf_counter() - start

    asyncio.run(main())
    return result


def json_bodies(payloads: Sequence[dict]) -> Callable[[int], bytes]:
    encoded = [json.dumps(p).encode() for p in payloads]
    return lambda i: encoded[i % len(encoded)]



def run_list(url: str, bodies: Sequence[bytes], *, concurrency: int, headers: dict[str, str] | None = None,
             answers: dict[int, bytes] | None = None) -> LoadResult:
    """Send each of ``bodies`` once, over ``concurrency`` keep-alive connections that take the next one in turn
    (``answers``: filled with each body's response body, by its index)."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    host, port, path = parts.hostname or "127.0.0.1", parts.port or 80, parts.path or "/"
    assert host in ("127.0.0.1", "localhost", "::1"), "load only ever goes to loopback"
    result = LoadResult()
    todo = iter(enumerate(bodies))

    async def one() -> None:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            for i, body in todo:
                answer = await _exchange(reader, writer, _request_bytes(host, port, path, body, headers or {}), result)
                if answers is not None:
                    answers[i] = answer
        except (ConnectionError, asyncio.IncompleteReadError, OSError):
            result.errors += 1
        finally:
            writer.close()

    async def main() -> None:
        start = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(concurrency)))
        result.elapsed_s = time.perf_counter() - start

    asyncio.run(main())
    return result
