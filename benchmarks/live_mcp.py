"""Replaying a recorded MCP session: this project's ``/mcp`` (a live MCP server recorded, ``mode: replay``) beside ``mcp-recorder`` 0.5.

Both record the same session of one real stdio MCP server (``tests/helpers/rogue_mcp_server.py``, its ``echo`` tool,
``--calls`` distinct calls): ``mcp-recorder record-scenarios`` into a cassette, and ``serve`` with
``mcp_servers`` in ``record`` mode into its store.  Then each replays it with the server gone, each in its own
process on 127.0.0.1: ``mcp-recorder``'s replay app (its ``method_params`` matcher; run through uvicorn on
127.0.0.1, as its ``replay`` command runs it on 0.0.0.0) and ``serve`` in ``replay``.  One client, the same for
both: plain JSON-RPC over streamable HTTP (``httpx``, keep-alive), one ``initialize``, then the calls, every answer
checked against what the server answered when recorded:

* **c=1**: the calls one at a time; the median and p99 latency of a call;
* **c=8**: the same calls shared by 8 threads in one session; calls/s;
* **HTTP floor**: the same client against a bare ASGI app with a fixed answer (``_bare_app.py``), what any
  replayer over HTTP costs at least on this machine;
* **the lean client**: the same calls, checked the same way, sent by ``_loadgen.py`` (raw keep-alive HTTP/1.1
  over asyncio; the floor answers 7-10k calls/s to it), so the figures are the servers', not the client's: the
  ``httpx`` client's 8 threads are what bounds every c=8 figure above, the floor's included;
* **app alone**: each replayer's app handed the session's calls in process (``_asgi_calls.py``, no socket, no
  client), its own work per call (median, µs).

Each replay server is started fresh for each measurement (``mcp-recorder``'s matchers use each recorded
interaction once per process).  ``mcp-recorder`` needs its own venv (it pins the MCP SDK 1.x, and its proxy needs Starlette before 1.0)::

    python3 -m venv .venv-recorder && .venv-recorder/bin/pip install 'mcp-recorder==0.5.*' 'starlette<1'
    python benchmarks/live_mcp.py [--calls 400] [--rounds 3] [--recorder-venv .venv-recorder]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _asgi_calls import arguments as _arguments  # noqa: E402
from _loadgen import run_list  # noqa: E402
from _procs import REPO, clean_env, free_port, process, serve_args  # noqa: E402

ROGUE = [sys.executable, str(REPO / "tests" / "helpers" / "rogue_mcp_server.py")]
HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
RECORDER_APP = """
import sys, uvicorn
from pathlib import Path
from mcp_recorder._utils import load_cassette
from mcp_recorder.matcher import create_matcher
from mcp_recorder.replayer import create_replay_app
loaded = load_cassette(Path(sys.argv[1]))
uvicorn.run(create_replay_app(loaded, create_matcher("method_params", loaded.interactions)), host="127.0.0.1",
            port=int(sys.argv[2]), log_level="warning")
"""


class JsonRpc:
    """A minimal streamable-HTTP MCP client: JSON-RPC posts, the answer read from JSON or the first SSE event."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.http = httpx.Client(timeout=60, limits=httpx.Limits(max_connections=16, max_keepalive_connections=16))
        self.headers = dict(HEADERS)
        self.ids = iter(range(1, 1 << 30))
        self.lock = threading.Lock()

    def post(self, method: str, params: dict[str, Any] | None = None, notify: bool = False) -> Any:
        body: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params or {}}
        if not notify:
            with self.lock:
                body["id"] = next(self.ids)
        reply = self.http.post(self.url, json=body, headers=self.headers)
        reply.raise_for_status()
        if "mcp-session-id" in reply.headers:
            self.headers["mcp-session-id"] = reply.headers["mcp-session-id"]
        if notify:
            return None
        text = reply.text
        if reply.headers.get("content-type", "").startswith("text/event-stream"):
            text = next(line[5:].strip() for line in text.splitlines() if line.startswith("data:"))
        answer = json.loads(text)
        if "error" in answer:
            raise RuntimeError(f"{method}: {answer['error']}")
        return answer["result"]

    def start(self) -> None:
        # mcp-recorder's own client's initialize, which its replay matches by its params
        self.post("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                 "clientInfo": {"name": "mcp-recorder", "version": "0.1.0"}})
        self.post("notifications/initialized", notify=True)

    def call(self, i: int) -> str:
        result = self.post("tools/call", {"name": "echo", "arguments": _arguments(i)})
        return str(result["content"][0]["text"])


def _wait_port(port: int, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        time.sleep(0.05)
    raise RuntimeError(f"port {port} did not open")


@contextlib.contextmanager
def recorder_replay(venv: Path, cassette: Path) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen([str(venv / "bin" / "python"), "-c", RECORDER_APP, str(cassette), str(port)], env=clean_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        _wait_port(port, proc)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(30)


def mirror_config(work: Path, mode: str) -> Path:
    """The mirror's config in ``mode``: the rogue server's echo, matched exactly (each call is distinct)."""
    config = work / f"mirror-{mode}.yml"
    config.write_text(yaml.safe_dump({"mode": mode, "store": {"path": str(work / "store")}, "log_level": "warning",
                                      "mcp_servers": {"rogue": {"command": ROGUE[0], "args": ROGUE[1:], "matcher": "exact"}}}))
    return config


@contextlib.contextmanager
def mirror(work: Path, mode: str) -> Iterator[str]:
    port = free_port()
    config = mirror_config(work, mode)
    with process(serve_args(config, "--host", "127.0.0.1", "--port", str(port)), f"http://127.0.0.1:{port}/health"):
        yield f"http://127.0.0.1:{port}/mcp"


def record(work: Path, venv: Path, calls: int) -> tuple[Path, list[str]]:
    """The session recorded by both; the cassette and what the server answered."""
    scenarios = {"schema_version": "1.0", "target": {"command": ROGUE[0], "args": ROGUE[1:]},
                 "scenarios": {"session": {"description": "echo calls", "actions": [
                     "list_tools", *({"call_tool": {"name": "echo", "arguments": _arguments(i)}} for i in range(calls))]}}}
    (work / "scenarios.yml").write_text(yaml.safe_dump(scenarios))
    subprocess.run([str(venv / "bin" / "mcp-recorder"), "record-scenarios", str(work / "scenarios.yml"), "--output-dir",
                    str(work / "cassettes")], check=True, env=clean_env(), capture_output=True, timeout=600)
    with mirror(work, "record") as url:
        client = JsonRpc(url)
        client.start()
        expected = [client.call(i) for i in range(calls)]
    return work / "cassettes" / "session.json", expected


@contextlib.contextmanager
def floor() -> Iterator[str]:
    """The HTTP floor: a bare ASGI app (``_bare_app.py``, a fixed answer) on the mirror's uvicorn and httptools."""
    port = free_port()
    with process([sys.executable, str(REPO / "benchmarks" / "_bare_app.py"), "--port", str(port)], f"http://127.0.0.1:{port}/"):
        yield f"http://127.0.0.1:{port}/mcp"


def measure(url: str, expected: list[str] | None, concurrency: int, calls: int) -> tuple[float, list[float]]:
    """(calls/s, per-call latencies) of the session's ``calls`` calls over ``concurrency`` threads; each answer
    checked against ``expected`` (``None``: the floor, whose fixed answer is only read)."""
    client = JsonRpc(url)
    if expected is not None:
        client.start()

    def call(i: int) -> str:
        if expected is not None:
            return client.call(i)
        body = {"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {"name": "echo", "arguments": _arguments(i)}}
        return client.http.post(url, json=body, headers=client.headers).text

    latencies: list[float] = []
    wrong: list[int] = []
    order = iter(range(calls))
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                i = next(order, None)
            if i is None:
                return
            started = time.perf_counter()
            text = call(i)
            latencies.append(time.perf_counter() - started)
            if expected is not None and text != expected[i]:
                wrong.append(i)

    started = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    if wrong:
        raise RuntimeError(f"{url}: {len(wrong)} answers differ from the recorded session (first: call {wrong[0]})")
    return calls / wall, latencies


def lean(url: str, expected: list[str] | None, concurrency: int) -> tuple[float, float]:
    """(calls/s, median ms) of the session's calls sent by the lean asyncio client (``_loadgen.run_list``: raw
    keep-alive HTTP/1.1, so the client is never what bounds the figure), each answer checked as :func:`measure` does."""
    client = JsonRpc(url)
    if expected is not None:
        client.start()
    headers = {k: v for k, v in client.headers.items() if k in ("accept", "mcp-session-id")}
    bodies = [json.dumps({"jsonrpc": "2.0", "id": i + 1, "method": "tools/call", "params": {"name": "echo", "arguments": _arguments(i)}}).encode()
              for i in range(len(expected or [None] * 400))]
    answers: dict[int, bytes] = {}
    result = run_list(url, bodies, concurrency=concurrency, headers=headers, answers=answers)
    if result.errors:
        raise RuntimeError(f"{url}: {result.errors} failed calls ({result.statuses})")
    if expected is not None:
        wrong = [i for i, text in enumerate(expected) if json.loads(answers[i])["result"]["content"][0]["text"] != text]
        if wrong:
            raise RuntimeError(f"{url}: {len(wrong)} answers differ from the recorded session (first: call {wrong[0]})")
    return result.rps, result.p50_ms


def in_process(python: Path, kind: str, source: Path, calls: int) -> list[float]:
    """Per-call seconds of a replayer's app alone, driven in process (``_asgi_calls.py``) in its own venv."""
    done = subprocess.run([str(python), str(REPO / "benchmarks" / "_asgi_calls.py"), kind, str(source), str(calls)],
                          capture_output=True, text=True, check=True, env=clean_env(), cwd=REPO, timeout=600)
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3, help="fresh replay servers per tool and concurrency, taken in turn")
    parser.add_argument("--recorder-venv", type=Path, default=REPO / ".venv-recorder")
    args = parser.parse_args()
    names = ("HTTP floor", "mcp-recorder", "mirror")
    with tempfile.TemporaryDirectory(prefix="stm-live-mcp-") as tmp:
        work = Path(tmp)
        cassette, expected = record(work, args.recorder_venv, args.calls)
        replay_config = mirror_config(work, "replay")
        results: dict[tuple[str, int], list[tuple[float, list[float]]]] = {}
        alone: dict[str, list[float]] = {}
        leaner: dict[tuple[str, int], list[tuple[float, float]]] = {}
        for _ in range(args.rounds):
            for concurrency in (1, 8):
                for name in names:
                    server = (floor() if name == "HTTP floor" else recorder_replay(args.recorder_venv, cassette)
                              if name == "mcp-recorder" else mirror(work, "replay"))
                    with server as url:
                        results.setdefault((name, concurrency), []).append(
                            measure(url, None if name == "HTTP floor" else expected, concurrency, args.calls))
                    server = (floor() if name == "HTTP floor" else recorder_replay(args.recorder_venv, cassette)
                              if name == "mcp-recorder" else mirror(work, "replay"))
                    with server as url:
                        leaner.setdefault((name, concurrency), []).append(lean(url, None if name == "HTTP floor" else expected, concurrency))
            alone.setdefault("mcp-recorder", []).append(statistics.median(
                in_process(args.recorder_venv / "bin" / "python", "mcp-recorder", cassette, args.calls)))
            alone.setdefault("mirror", []).append(statistics.median(in_process(Path(sys.executable), "mirror", replay_config, args.calls)))
    print(f"{args.calls} recorded echo calls replayed, {args.rounds} rounds (medians of the rounds)")
    print(f"{'replayer':<14} {'c=1 median ms':>14} {'c=1 p99 ms':>11} {'c=1 calls/s':>12} {'c=8 calls/s':>12} {'app alone us':>13}")
    for name in names:
        one = results[(name, 1)]
        median = statistics.median(statistics.median(lat) for _, lat in one) * 1000
        p99 = statistics.median(sorted(lat)[int(len(lat) * 0.99) - 1] for _, lat in one) * 1000
        rate1 = statistics.median(rate for rate, _ in one)
        rate8 = statistics.median(rate for rate, _ in results[(name, 8)])
        own = f"{statistics.median(alone[name]) * 1e6:>13.0f}" if name in alone else f"{'-':>13}"
        print(f"{name:<14} {median:>14.2f} {p99:>11.2f} {rate1:>12.0f} {rate8:>12.0f} {own}")
    print("the same calls from the lean client (raw keep-alive HTTP/1.1 over asyncio, benchmarks/_loadgen.py)")
    print(f"{'replayer':<14} {'c=1 median ms':>14} {'c=1 calls/s':>12} {'c=8 median ms':>14} {'c=8 calls/s':>12}")
    for name in names:
        one, eight = leaner[(name, 1)], leaner[(name, 8)]
        print(f"{name:<14} {statistics.median(ms for _, ms in one):>14.2f} {statistics.median(r for r, _ in one):>12.0f} "
              f"{statistics.median(ms for _, ms in eight):>14.2f} {statistics.median(r for r, _ in eight):>12.0f}")


if __name__ == "__main__":
    main()
