"""Benchmark: ``/virtual`` hits while two clients post 15.6 MiB ``/v1`` bodies of many small values (issue 48).

Starts ``stabletoolbench-mirror serve`` (replay, one recorded tool answer) on 127.0.0.1, measures the latency of
``/virtual`` hits one at a time for ``--seconds`` alone, then for ``--seconds`` again while two clients (127.0.0.2
and 127.0.0.3) post 15.6 MiB ``/v1/chat/completions`` bodies in a loop, and prints p50, p99, the slowest hit
and how many took over 100 ms, with the bodies posted and the statuses they got.  The bodies' shapes
(``--shape``): ``messages`` (480,000 messages of one character, the issue's), ``numbers`` (one list of 8
million ``1``), ``lists`` (one list of 5 million ``[]``): each a parse of 0.2 to 1 s in one C call; and
``most``, the most messages a body may hold (:data:`~stabletoolbench_mirror.engine.model_requests.MAX_BODY_VALUES`),
2.1 MiB, which is read.

    python benchmarks/v1_bodies.py [--seconds 6] [--shape messages]

The bodies are 15.6 MiB but for ``most``. A run takes about twice ``--seconds`` plus the server's start.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from stabletoolbench_mirror.core.records import Record  # noqa: E402
from stabletoolbench_mirror.engine.model_requests import MAX_BODY_VALUES  # noqa: E402
from stabletoolbench_mirror.stores import DiskcacheStore  # noqa: E402
from tests.helpers.processes import ServeProcess  # noqa: E402

SIZE = int(15.6 * 1024 * 1024)
TOOL = {"category": "Data", "tool_name": "Fast Tool", "api_name": "hit", "tool_input": '{"n": 1}', "strip": "", "toolbench_key": ""}


def body_of(shape: str) -> bytes:
    """A 15.6 MiB chat request of ``shape`` (see the module's docstring)."""
    one = b'{"role":"user","content":"m"},'
    if shape in ("messages", "most"):
        count = SIZE // len(one) if shape == "messages" else MAX_BODY_VALUES // 3 - 1
        items = b"[" + one * count + b'{"role":"user","content":"m"}]'
        return b'{"model":"gpt-4o-mini","messages":' + items + b"}"
    filler = {"numbers": b"1,", "lists": b"[],"}[shape]
    return b'{"model":"gpt-4o-mini","messages":[{"role":"user","content":"m"}],"x":[' + filler * (SIZE // len(filler)) + b"1]}"


def latencies(url: str, seconds: float) -> list[float]:
    """``/virtual`` hits one after another for ``seconds``: each one's seconds."""
    out: list[float] = []
    session = requests.Session()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        started = time.perf_counter()
        got = session.post(url, json=TOOL, timeout=60)
        out.append(time.perf_counter() - started)
        assert got.status_code == 200 and got.headers.get("x-stm-outcome") == "hit", got.text[:200]
    return out


def post_loop(port: int, source: str, body: bytes, stop: threading.Event, statuses: Counter[str]) -> None:
    """Post ``body`` from ``source`` until ``stop``, counting the statuses."""
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            f"Connection: close\r\n\r\n").encode()
    while not stop.is_set():
        with socket.create_connection(("127.0.0.1", port), source_address=(source, 0), timeout=120) as sock:
            sock.sendall(head + body)
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
        statuses[answer.split(b" ", 2)[1].decode() if answer.count(b" ") >= 2 else "none"] += 1


def percentile(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))] * 1000


def figures(values: list[float]) -> str:
    return (f"{len(values)} hits, p50 {percentile(values, .5):.1f} ms, p99 {percentile(values, .99):.1f} ms, "
            f"slowest {max(values) * 1000:.0f} ms, {sum(v > 0.1 for v in values)} over 100 ms")


def measure(tmp: Path, shape: str, seconds: float) -> None:
    store = tmp / "store"
    with DiskcacheStore(store) as opened:
        opened.add(Record.from_answer("Data/fast_tool_for_Data/hit", "{'n': 1}", {"error": "", "response": "fast"}, "imported"), None)
    config = {"mode": "replay", "store": {"path": str(store)}, "limits": {"max_queued_bytes": 256 * 1024 * 1024}}
    body = body_of(shape)
    with ServeProcess(tmp, config) as server:
        url = server.url + "/virtual"
        latencies(url, 1.0)  # warmed up
        alone = latencies(url, seconds)
        stop, statuses = threading.Event(), Counter[str]()
        clients = [threading.Thread(target=post_loop, args=(server.port, f"127.0.0.{i}", body, stop, statuses), daemon=True)
                   for i in (2, 3)]
        for client in clients:
            client.start()
        try:
            time.sleep(1.0)
            beside = latencies(url, seconds)
        finally:
            stop.set()
            for client in clients:
                client.join(120)
    print(f"alone: {figures(alone)}")
    print(f"beside two clients posting {len(body) / 2**20:.1f} MiB bodies ({shape}): {figures(beside)}; "
          f"bodies answered {dict(statuses)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=6.0, help="how long each series of hits runs (default 6)")
    parser.add_argument("--shape", choices=("messages", "numbers", "lists", "most"), default="messages")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory() as tmp:
        measure(Path(tmp), args.shape, args.seconds)
    print(f"load average {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
