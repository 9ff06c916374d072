"""Benchmark: memory and waiting under hostile or crowded clients (issue 18, items 3 and 4).

Each part starts a real ``stabletoolbench-mirror serve`` process (and, for the crowd, the OpenAI stub
as a slow simulator), all on 127.0.0.1, and prints its figures; resident memory is read from
``/proc/<pid>/status``.

1. **stalled bodies**: 1,000 connections each sending all but the last byte of a 1 MiB body, with
   ``limits.max_queued_bytes: 64 MiB`` (target: RSS grows by at most 160 MB);
2. **non-reading clients**: 200 clients of a 4 MiB cached answer that never read it, with the default
   ``limits.send_timeout_s`` (30 s) (target: RSS back within 100 MB of the start 45 s later);
3. **a crowd**: 199 loopback addresses (127.0.0.2-200) with 8 slow misses each (1,592 requests, a 3 s
   simulator, arriving over 3 s); then 127.0.0.1's local-tool call, session call, first hit of a frozen
   file and own miss (targets: 2 s, 2 s, 2 s, 5 s).  Its miss waits for the next simulator slot that a
   crowd miss frees, then its own answer: a crowd that arrived all at once against a stub of fixed
   latency finishes in lockstep, and the miss can then take up to twice the latency.

Hardening V (issue 32), each a real process on 127.0.0.1 and its figures:

4. **archives**: ``cache import`` of a small ``.tar.gz`` holding one 1 GiB member, then of one with 100,000
   members (peak RSS and seconds of the command; targets: refused, <= 300 MB, <= 5 s);
5. **manifests**: a snapshot of 2 answers and 2 failure records, its ``failure_entries`` emptied, or its
   ``failure_entries_hash`` removed, then ``cache import`` (target: refused, no failure record taken for an answer);
6. **downloads**: ``cache import`` of a URL with an endless body (stopped at ``download_max_mb``: bytes the
   server sent, seconds), of a URL sending 1 byte/s (stopped by the low-speed limit, 10 KB/s over 60 s, then by
   a ``download_deadline_s`` below 60 s: seconds), and what is left in ``download_dir``;
7. **MCP sessions**: 10,000 ``initialize`` from 127.0.0.1 (the defaults, no ``auth_token``), then the seconds
   another client (127.0.0.2) and a new one of 127.0.0.1 take to initialize, list the tools and call one
   with the official SDK (RSS before and after the flood);
8. **API-Bank**: one session's 120 KB Calculator formula, and meanwhile another session's 5 calls (target:
   each within 1 s; the long one answered as a timeout at ``local_tools_timeout_s``);
9. **trusted proxies**: with the README's ``trusted_proxies: [127.0.0.2]`` and ``max_in_flight_per_client: 2``,
   30 slow misses from 127.0.0.1 each with a new ``X-Forwarded-For``, then 30 malformed values and 30 forged
   leftmost entries through the proxy: how many reached the simulator at once (target: the limit, 2); for
   contrast, the same from 127.0.0.1 named a proxy itself (each value a client);
10. **escaped echo**: a simulator that echoes its key ``\\u``-escaped, ``\\/``-escaped, percent-encoded and in
    base64 inside the inner JSON: the forms of the key found in the served answers and the exported records
    (target: 0), and the seconds of that miss;
11. **MCP listing**: ``/mcp`` with ``mcp.queries`` set to every solvable query of the reference data, listed
    page by page (``nextCursor``) by the official SDK's ``ClientSession`` (target: every tool, no message over
    its 1 MiB limit).

Run from the repository root::

    python benchmarks/hardening.py            # all parts; --parts 1,3 for some; --parts 4,5,6,7,8,9,10,11 for Hardening V
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import requests

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from stabletoolbench_mirror.core.records import Record  # noqa: E402
from stabletoolbench_mirror.stores import DiskcacheStore  # noqa: E402
from stabletoolbench_mirror.upstream.failures import failure_entries_hash  # noqa: E402
from tests.helpers.archives import add_member as _add  # noqa: E402
from tests.helpers.crowd import close_all, crowd_of_requests, request_without_reading, rss_mb, stalled_bodies  # noqa: E402
from tests.helpers.openai_stub import OpenAIStub, Reply  # noqa: E402
from tests.helpers.processes import ServeProcess, StubProcess  # noqa: E402


def payload(category: str, tool: str, api: str, tool_input: dict) -> dict:
    return {"category": category, "tool_name": tool, "api_name": api, "tool_input": json.dumps(tool_input),
            "strip": "", "toolbench_key": ""}


def stalled(tmp: Path) -> None:
    config = {"mode": "replay", "store": {"kind": "diskcache", "path": str(tmp / "store1")},
              "limits": {"max_queued_bytes": 64 * 1024 * 1024, "body_timeout_s": 60}}
    with ServeProcess(tmp, config) as server:
        requests.post(server.url + "/virtual", json=payload("Data", "T", "a", {}), timeout=10)
        time.sleep(1)
        start = rss_mb(server.pid)
        t = time.monotonic()
        socks = stalled_bodies(server.port, 1000)
        sent = time.monotonic() - t
        time.sleep(1)
        peak = rss_mb(server.pid)
        refused = requests.get(server.url + "/stats", timeout=30).json()["refusals"].get("limits.max_queued_bytes", 0)
        close_all(socks)
    print(f"1. 1,000 stalled 1 MiB bodies (max_queued_bytes 64 MiB, sent in {sent:.1f} s): RSS {start:.0f} MB -> "
          f"{peak:.0f} MB, grew {peak - start:.0f} MB (target <= 160); {refused} refused at their headers")


def non_reading(tmp: Path, wait_s: float) -> None:
    with DiskcacheStore(tmp / "store2") as store:
        store.add(Record.from_answer("Data/big_for_Data/big", "{'n': 1}", {"error": "", "response": "x" * (4 << 20)}, "imported"), None)
    config = {"mode": "replay", "store": {"kind": "diskcache", "path": str(tmp / "store2")}}  # default send_timeout_s
    body = json.dumps(payload("Data", "big", "big", {"n": 1})).encode()
    with ServeProcess(tmp, config) as server:
        requests.post(server.url + "/virtual", json=payload("Data", "T", "a", {}), timeout=10)
        time.sleep(1)
        start = rss_mb(server.pid)
        socks = request_without_reading(server.port, 200, body)
        peak, t0 = start, time.monotonic()
        while time.monotonic() - t0 < wait_s:
            time.sleep(0.5)
            peak = max(peak, rss_mb(server.pid))
        after = rss_mb(server.pid)
        close_all(socks)
    print(f"2. 200 clients never reading a 4 MiB answer (send_timeout_s 30, the default): RSS {start:.0f} MB, "
          f"at most {peak:.0f} MB, {after:.0f} MB {wait_s:.0f} s later: {after - start:+.0f} MB (target <= 100)")


def crowd(tmp: Path, latency_s: float) -> None:
    tools = tmp / "tools.py"
    tools.write_text('def recall(tool_input, state):\n    return {"ok": True}\n\nTOOLS = {"Tools/Notes/Recall": recall}\n')
    frozen = tmp / "frozen" / "Data" / "cold_for_Data"
    frozen.mkdir(parents=True, exist_ok=True)
    (frozen / "hit.json").write_text(json.dumps({"{'q': 'x'}": {"error": "", "response": "frozen answer"}}))
    with StubProcess(tmp, latency_ms=latency_s * 1000, echo_prompt=False) as stub:
        config = {"mode": "record", "store": {"kind": "diskcache", "path": str(tmp / "store3")},
                  "frozen_caches": [str(tmp / "frozen")], "local_tools": [str(tools)],
                  "simulator": {"enabled": True, "api_base": stub.api_base, "max_retries": 0, "allow_without_docs": True}}
        with ServeProcess(tmp, config) as server:
            bodies = {f"127.0.0.{i}": [json.dumps(payload("Data", "Crowd", "slow", {"who": i, "n": n})).encode() for n in range(8)]
                      for i in range(2, 201)}
            socks = []
            for source, mine in bodies.items():  # arriving over one simulator latency, as a running crowd does
                socks += crowd_of_requests(server.port, {source: mine})
                time.sleep(latency_s / len(bodies))
            time.sleep(latency_s)
            url = server.url + "/virtual"
            times = {}
            for what, fn in (
                ("local tool", lambda: requests.post(url, json=payload("Tools", "Notes", "Recall", {}), timeout=300)),
                ("session call", lambda: requests.post(url, json=payload("Tools", "Notes", "Recall", {}), timeout=300, headers={
                    "X-STM-Session": requests.post(server.url + "/sessions", json={}, timeout=300).json()["id"]})),
                ("first frozen hit", lambda: requests.post(url, json=payload("Data", "cold", "hit", {"q": "x"}), timeout=300)),
                ("own miss", lambda: requests.post(url, json=payload("Data", "Own", "mine", {"q": 1}), timeout=300)),
            ):
                t = time.monotonic()
                fn().raise_for_status()
                times[what] = time.monotonic() - t
            answered = requests.get(server.url + "/stats", timeout=300).json()["requests"]
            close_all(socks)
            os.killpg(server.pid, signal.SIGKILL)  # the crowd's misses still wait: no graceful stop
    shown = ", ".join(f"{k} {v:.2f} s" for k, v in times.items())
    print(f"3. 199 addresses x 8 misses ({latency_s:g} s simulator; {answered} of 1,592 answered meanwhile): "
          f"127.0.0.1's {shown} (targets 2, 2, 2, 5 s)")


# -- Hardening V (issue 32) ---------------------------------------------------------------------------

#: run one CLI command as the child of a small wrapper: its exit status, output, peak RSS (KiB) and wall seconds;
#: the child may map at most 4 GiB, so a regression fails with an error instead of taking the machine's memory
_MEASURED = """
import json, resource, subprocess, sys, time
def bounded():
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
started = time.monotonic()
done = subprocess.run(sys.argv[1:], capture_output=True, text=True, preexec_fn=bounded)
print(json.dumps({"rc": done.returncode, "stderr": done.stderr, "elapsed_s": time.monotonic() - started,
                  "maxrss_kib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))
"""


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STM_")}
    env["PYTHONPATH"] = str(REPO)
    return env


def measured_cli(*args: str, cwd: Path) -> dict[str, Any]:
    """``stabletoolbench-mirror ARGS`` as a real process: rc, stderr, elapsed_s, maxrss_kib."""
    done = subprocess.run([sys.executable, "-c", _MEASURED, sys.executable, "-m", "stabletoolbench_mirror", *args],
                          cwd=cwd, env=_env(), capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(done.stderr)
    return json.loads(done.stdout)


def last_line(text: str) -> str:
    """The last line of a command's output, its temporary folder left out."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return (lines[-1] if lines else "").replace(tempfile.gettempdir() + "/", "")[:200]


def import_config(tmp: Path, name: str, **settings: Any) -> tuple[Path, Path]:
    """A config file naming a fresh ``download_dir`` (and ``settings``): (the file, the folder)."""
    downloads = tmp / f"downloads-{name}"
    config = tmp / f"{name}.yml"
    config.write_text(json.dumps({"download_dir": str(downloads), **settings}))
    return config, downloads


def left_in(folder: Path) -> int:
    return sum(1 for _ in folder.rglob("*")) if folder.exists() else 0


#: a manifest as ``snapshot`` writes one (its content hash never reached: the members are refused from their headers first)
_MANIFEST = json.dumps({"format": "stabletoolbench-mirror-snapshot", "format_version": 1, "created_by": "stabletoolbench-mirror 0.3.0",
                        "content_hash": "sha256:" + "0" * 64, "failure_entries": [],
                        "failure_entries_hash": failure_entries_hash("sha256:" + "0" * 64, set())}).encode()


def archives(tmp: Path, member_mib: int, members: int) -> None:
    bomb = tmp / "bomb.tar.gz"
    t = time.monotonic()
    with tarfile.open(bomb, "w:gz", compresslevel=1) as tar:
        _add(tar, "manifest.json", _MANIFEST)
        _add(tar, "Data/big_for_Data/lookup.json", zeros=member_mib << 20)
    built = time.monotonic() - t
    config, downloads = import_config(tmp, "bomb")
    one = measured_cli("cache", "import", str(bomb), "--config", str(config), "--store-path", str(tmp / "store-bomb"), "-q", cwd=tmp)
    junk = tmp / "junk.tar.gz"
    with tarfile.open(junk, "w:gz", compresslevel=1) as tar:
        _add(tar, "manifest.json", _MANIFEST)
        for i in range(members):
            _add(tar, f"Junk/j_for_Junk/{i}.txt", b"x")
    config2, downloads2 = import_config(tmp, "junk")
    many = measured_cli("cache", "import", str(junk), "--config", str(config2), "--store-path", str(tmp / "store-junk"), "-q", cwd=tmp)
    print(f"4. cache import of a {bomb.stat().st_size / 1e6:.1f} MB .tar.gz holding a {member_mib:,} MiB member (built in {built:.1f} s): "
          f"exit {one['rc']}, peak RSS {one['maxrss_kib'] / 1024:.0f} MB, {one['elapsed_s']:.2f} s, {left_in(downloads)} files left "
          f"(targets: refused, <= 300 MB, <= 5 s): {last_line(one['stderr'])}")
    print(f"   cache import of {members:,} one-byte members ({junk.stat().st_size / 1e6:.1f} MB): exit {many['rc']}, "
          f"peak RSS {many['maxrss_kib'] / 1024:.0f} MB, {many['elapsed_s']:.2f} s, {left_in(downloads2)} files left: {last_line(many['stderr'])}")


def manifests(tmp: Path) -> None:
    api = "Data/t_for_Data/lookup"
    with DiskcacheStore(tmp / "store5") as store:
        for n in range(2):
            store.add(Record.from_answer(api, json.dumps({"n": n}), {"error": "", "response": f"r{n}"}, "real", "r"), None)
        for n in (2, 3):
            store.add(Record.failure(api, json.dumps({"n": n}), {"error": "API not working", "response": ""}, "simulated", "s",
                                     reason="invalid"), None)
    made = measured_cli("snapshot", str(tmp / "snap5"), "--store-path", str(tmp / "store5"), "-q", cwd=tmp)
    assert made["rc"] == 0, made
    original = json.loads((tmp / "snap5" / "manifest.json").read_text())
    edits = {"as written": lambda m: None,
             "failure_entries emptied": lambda m: m.update(failure_entries=[], failures=0),
             "failure_entries_hash removed": lambda m: m.pop("failure_entries_hash"),
             "both": lambda m: (m.update(failure_entries=[], failures=0), m.pop("failure_entries_hash"))}
    shown = []
    for what, edit in edits.items():
        manifest = json.loads(json.dumps(original))
        edit(manifest)
        (tmp / "snap5" / "manifest.json").write_text(json.dumps(manifest, indent=2))
        name = "m" + str(len(shown))
        config, _ = import_config(tmp, name)
        done = measured_cli("cache", "import", str(tmp / "snap5"), "--config", str(config), "--store-path", str(tmp / f"into-{name}"), "-q",
                            cwd=tmp)
        taken = kept = 0
        if (tmp / f"into-{name}" / "cache.db").exists():
            with DiskcacheStore(tmp / f"into-{name}") as into:
                failed = [r.is_failure for r in into if r.key in (json.dumps({"n": 2}), json.dumps({"n": 3}))]
                taken, kept = failed.count(False), failed.count(True)
        shown.append(f"{what}: exit {done['rc']}, {kept} kept as failures, {taken} taken for answers, {done['elapsed_s']:.2f} s")
    print("5. cache import of a snapshot of 2 answers and 2 failure records (target: every changed manifest refused, 0 taken): "
          + "; ".join(shown))


class _Endless(http.server.BaseHTTPRequestHandler):
    """``/endless``: 1 MiB chunks with no end and no ``Content-Length``; ``/trickle``: 1 byte a second. Counts what it sent."""

    sent: dict[str, int] = {}

    def do_GET(self) -> None:  # noqa: N802 - the handler's name
        self.send_response(200)
        self.end_headers()
        chunk, pause = (bytes(1 << 20), 0.0) if self.path == "/endless" else (b"x", 1.0)
        try:
            while True:
                self.wfile.write(chunk)
                self.wfile.flush()
                _Endless.sent[self.path] = _Endless.sent.get(self.path, 0) + len(chunk)
                if pause:
                    threading.Event().wait(pause)
        except OSError:
            pass

    def log_message(self, *args: object) -> None:
        pass


def _amount(n: int) -> str:
    return f"{n / 1e6:,.1f} MB" if n >= 1e6 else f"{n:,} bytes"


def downloads(tmp: Path, max_mb: int, deadline_s: float) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Endless)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    shown = []
    try:
        for what, path, settings in (
            (f"endless body, download_max_mb {max_mb}", "/endless", {"download_max_mb": max_mb}),
            ("1 byte/s, the low-speed limit (10 KB/s over 60 s)", "/trickle", {}),
            (f"1 byte/s, download_deadline_s {deadline_s:g} (before the low-speed limit's 60 s)", "/trickle",
             {"download_deadline_s": deadline_s}),
        ):
            _Endless.sent.pop(path, None)
            config, folder = import_config(tmp, f"dl{len(shown)}", **settings)
            done = measured_cli("cache", "import", f"{base}{path}",
                                "--config", str(config), "--store-path", str(tmp / f"store-dl{len(shown)}"), "-q", cwd=tmp)
            time.sleep(0.2)
            shown.append(f"{what}: exit {done['rc']} after {done['elapsed_s']:.1f} s, {_amount(_Endless.sent.get(path, 0))} sent, "
                         f"peak RSS {done['maxrss_kib'] / 1024:.0f} MB, {left_in(folder)} files left ({last_line(done['stderr'])})")
    finally:
        server.shutdown()
        server.server_close()
    print("6. cache import of a URL:\n   " + "\n   ".join(shown))


def _mcp_tools(root: Path) -> Path:
    tools = root / "tools7" / "Data"
    tools.mkdir(parents=True, exist_ok=True)
    doc = {"tool_name": "Echo Tool", "tool_description": "", "api_list": [
        {"name": "echo", "description": "", "method": "GET", "required_parameters": [], "optional_parameters": []}]}
    (tools / "echo_tool.json").write_text(json.dumps(doc), encoding="utf-8")
    return root / "tools7"


_INIT = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "flood", "version": "0"}}})
_MCP_HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}


def _flood(port: int, count: int) -> tuple[int, int]:
    """``count`` initialize requests from 127.0.0.1 over 4 kept-alive connections, never closed: (answered 200, 503)."""
    def some(n: int) -> tuple[int, int]:
        ok = refused = 0
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        for _ in range(n):
            conn.request("POST", "/mcp", _INIT, _MCP_HEADERS)
            reply = conn.getresponse()
            reply.read()
            ok += reply.status == 200
            refused += reply.status == 503
        conn.close()
        return ok, refused

    with ThreadPoolExecutor(4) as pool:
        parts = list(pool.map(some, [count // 4] * 4))
    return sum(p[0] for p in parts), sum(p[1] for p in parts)


async def _sdk_client(url: str, source: str) -> tuple[float, int]:
    """The official SDK's client from ``source``: initialize, list the tools, call one: (seconds, tools listed)."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    started = time.monotonic()
    client = httpx2.AsyncClient(timeout=120, transport=httpx2.AsyncHTTPTransport(local_address=source))
    async with Client(streamable_http_client(url, http_client=client)) as mcp:
        tools = (await mcp.list_tools()).tools
        await mcp.call_tool(tools[0].name, {})
    return time.monotonic() - started, len(tools)


def mcp_sessions(tmp: Path, count: int) -> None:
    config = {"mode": "replay", "store": {"path": str(tmp / "store7")}, "tools_folder": str(_mcp_tools(tmp)), "mcp": {"enabled": True}}
    with ServeProcess(tmp, config) as server:
        before = {source: asyncio.run(_sdk_client(server.url + "/mcp", source))[0] for source in ("127.0.0.2", "127.0.0.1")}
        _flood(server.port, 400)  # the allocator and the SDK warmed, and the client at its 256
        start = rss_mb(server.pid)
        t = time.monotonic()
        ok, refused = _flood(server.port, count)
        flood_s = time.monotonic() - t
        after = rss_mb(server.pid)
        then = {source: asyncio.run(_sdk_client(server.url + "/mcp", source)) for source in ("127.0.0.2", "127.0.0.1")}
    shown = ", ".join(f"{source} {then[source][0]:.2f} s ({then[source][1]} tools; {before[source]:.2f} s before the flood)"
                      for source in then)
    print(f"7. {count:,} MCP initializes from 127.0.0.1 in {flood_s:.1f} s ({ok:,} answered 200, {refused:,} 503): RSS {start:.0f} MB -> "
          f"{after:.0f} MB ({after - start:+.0f} MB); then initialize + list + call with the SDK: {shown}")


def apibank(tmp: Path, timeout_s: float, repeats: int) -> None:
    bank = REPO.parent / "shared" / "reference" / "apibank"
    if not (bank / "apis").is_dir():
        print(f"8. skipped: API-Bank's reference copy not found at {bank}")
        return
    config = {"store": {"path": str(tmp / "store8")}, "apibank": {"path": str(bank)}, "local_tools_timeout_s": timeout_s}
    formula = "+".join(["(1+2)*3"] * repeats)

    def calc(expression: str) -> dict:
        return payload("APIBank", "API-Bank", "Calculator", {"formula": expression})

    with ServeProcess(tmp, config) as server, ThreadPoolExecutor(1) as side:
        def session() -> dict[str, str]:
            return {"X-STM-Session": requests.post(server.url + "/sessions", json={}, timeout=30).json()["id"]}

        hog, other = session(), session()
        url = server.url + "/virtual"
        requests.post(url, json=calc("1+1"), headers=other, timeout=60).raise_for_status()  # warmed
        t = time.monotonic()
        long_call = side.submit(requests.post, url, json=calc(formula), headers=hog, timeout=600)
        times, during = [], 0
        for i in range(5):
            started = time.monotonic()
            requests.post(url, json=calc(f"({i}+2)*3"), headers=other, timeout=60).raise_for_status()
            times.append(time.monotonic() - started)
            during += not long_call.done()
        hogged = long_call.result()
        long_s = time.monotonic() - t
    timed_out = f"did not answer within {timeout_s:g}s" in hogged.text
    print(f"8. a {len(formula) / 1000:.0f} KB Calculator formula in one API-Bank session (local_tools_timeout_s {timeout_s:g}): answered "
          f"after {long_s:.1f} s{' as a timeout' if timed_out else ''}; another session's 5 calls meanwhile ({during} while it ran): "
          f"at most {max(times):.3f} s, median {sorted(times)[2]:.3f} s (target <= 1 s)")


def _misses_with_forwarded(port: int, source: str, forwarded: list[str], first: int) -> int:
    """One miss per ``X-Forwarded-For`` value, all at once from ``source``: how many were answered 200."""
    def one(i: int) -> int:
        data = json.dumps(payload("Data", "Proxy", "slow", {"n": first + i})).encode()
        with socket.create_connection(("127.0.0.1", port), timeout=120, source_address=(source, 0)) as sock:
            sock.sendall(f"POST /virtual HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: {forwarded[i]}\r\nContent-Type: application/json\r\n"
                         f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
            reply = b""
            while chunk := sock.recv(65536):
                reply += chunk
        return int(reply.split()[1])

    with ThreadPoolExecutor(len(forwarded)) as pool:
        return sum(status == 200 for status in pool.map(one, range(len(forwarded))))


def proxies(tmp: Path, latency_s: float, count: int) -> None:
    arrivals: list[float] = []
    lock = threading.Lock()

    def slow(body: dict) -> Reply:
        with lock:
            arrivals.append(time.monotonic())
        return Reply(content=json.dumps({"error": "", "response": "slow answer"}), delay_s=latency_s)

    def at_once() -> int:
        """The most simulator calls in flight at one time: arrivals within one latency of each other."""
        with lock:
            seen = sorted(arrivals)
            arrivals.clear()
        return max((sum(1 for b in seen if a - latency_s < b <= a) for a in seen), default=0)

    with OpenAIStub(slow) as stub:
        config = {"mode": "record", "store": {"path": str(tmp / "store9")},
                  "limits": {"max_in_flight_per_client": 2, "trusted_proxies": ["127.0.0.2"]},
                  "simulator": {"enabled": True, "api_base": stub.api_base, "max_retries": 0, "allow_without_docs": True}}
        with ServeProcess(tmp, config) as server:
            shown = []
            kinds = ["client-{i}", "198.51.100.{i}:port", "unknown-{i}", "[::{i}", "1.2.3.{i}, junk{i}", "_hidden{i}", "1{i}" + "0" * 70]
            for what, source, forwarded in (
                ("127.0.0.1, a new X-Forwarded-For each", "127.0.0.1", [f"198.51.100.{i}" for i in range(count)]),
                ("the proxy 127.0.0.2, malformed values", "127.0.0.2", [kinds[i % len(kinds)].format(i=i) for i in range(count)]),
                ("the proxy 127.0.0.2, forged leftmost entries", "127.0.0.2", [f"203.0.113.{i}, 198.51.100.7" for i in range(count)]),
            ):
                t = time.monotonic()
                ok = _misses_with_forwarded(server.port, source, forwarded, 1000 * (len(shown) + 1))
                shown.append(f"{what}: {ok} of {count} answered in {time.monotonic() - t:.1f} s, at most {at_once()} at once")
        config["limits"] = {"max_in_flight_per_client": 2, "trusted_proxies": ["127.0.0.1"]}
        with ServeProcess(tmp, config) as server:  # for contrast: 127.0.0.1 itself named a proxy, each value is a client
            t = time.monotonic()
            ok = _misses_with_forwarded(server.port, "127.0.0.1", [f"198.51.100.{i}" for i in range(count)], 9000)
            shown.append(f"(for contrast, trusted_proxies [127.0.0.1]: {ok} of {count} answered in {time.monotonic() - t:.1f} s, "
                         f"at most {at_once()} at once)")
    print(f"9. {count} slow misses ({latency_s:g} s simulator) under trusted_proxies [127.0.0.2], max_in_flight_per_client 2 "
          "(target: at most 2 at once):\n   " + "\n   ".join(shown))


def escaped_echo(tmp: Path) -> None:
    from tests.integration.test_simulator_secrets import ESC_KEY, decoded_forms, encoded_echo

    work = tmp / "work10"
    work.mkdir()
    with OpenAIStub(encoded_echo, with_headers=True) as stub:
        config = {"store": {"path": str(work / "store")},
                  "simulator": {"enabled": True, "api_base": stub.api_base, "max_retries": 0, "allow_without_docs": True}}
        with ServeProcess(work, config, env={"STM_SIMULATOR__API_KEY": ESC_KEY}) as server:
            served, times = [], []
            for n in range(5):
                t = time.monotonic()
                reply = requests.post(server.url + "/virtual", json=payload("Data", "Echo", "Echo", {"n": n}), timeout=60)
                times.append(time.monotonic() - t)
                served.append(reply.text)
            hit_t = time.monotonic()
            served.append(requests.post(server.url + "/virtual", json=payload("Data", "Echo", "Echo", {"n": 0}), timeout=60).text)
            hit_s = time.monotonic() - hit_t
    exported = measured_cli("cache", "export", str(work / "export"), "--store-path", str(work / "store"), "-q", cwd=work)
    assert exported["rc"] == 0, exported
    records = [p.read_text() for p in (work / "export").rglob("*.json")]
    leaks = [form for text in served + records for form in decoded_forms(text) if ESC_KEY in form or ESC_KEY.encode().hex() in form]
    on_disk = sum(ESC_KEY.encode() in p.read_bytes() for p in work.rglob("*") if p.is_file() and p.stat().st_size < 64 << 20)
    print(f"10. a simulator echoing its key \\u-, \\/-, percent- and base64-encoded in 6 forms: {len(leaks)} decoded forms holding "
          f"the key in {len(served)} served answers and {len(records)} exported files, {on_disk} files on disk holding it "
          f"(target 0); the masked miss {sorted(times)[2]:.3f} s (median of 5), its hit {hit_s:.3f} s")


async def _pages(url: str) -> list[int]:
    """The number of tools on each ``tools/list`` page, listed by the SDK's ``ClientSession`` over
    ``streamable_http_client`` (its default 1 MiB limit on one server-sent event)."""
    import httpx2
    import mcp_types as types
    from mcp.client.session import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    pages: list[int] = []
    async with streamable_http_client(url, http_client=httpx2.AsyncClient(timeout=120)) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        cursor = None
        while True:
            page = await session.list_tools(params=types.PaginatedRequestParams(cursor=cursor) if cursor else None)
            pages.append(len(page.tools))
            if page.next_cursor is None:
                return pages
            cursor = page.next_cursor


def mcp_listing(tmp: Path) -> None:
    reference = REPO.parent / "shared" / "reference"
    if not (reference / "solvable_queries").is_dir():
        print(f"11. skipped: the reference data (solvable_queries) not found at {reference}")
        return
    config = {"mode": "replay", "store": {"path": str(tmp / "store11")}, "frozen_caches": [str(reference / "cache")],
              "tools_folder": str(reference / "toolenv" / "tools"),
              "mcp": {"enabled": True, "queries": str(reference / "solvable_queries")}}
    t = time.monotonic()
    with ServeProcess(tmp, config) as server:
        ready = time.monotonic() - t
        t = time.monotonic()
        pages = asyncio.run(_pages(server.url + "/mcp"))
        listed = time.monotonic() - t
        rss = rss_mb(server.pid)
    print(f"11. /mcp with mcp.queries = every solvable query (ready in {ready:.1f} s, RSS {rss:.0f} MB): the SDK's ClientSession "
          f"lists {sum(pages):,} tools in {len(pages)} pages (at most {max(pages)} a page) in {listed:.2f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parts", default="1,2,3,4,5,6,7,8,9,10,11")
    parser.add_argument("--wait", type=float, default=45.0, help="seconds part 2 waits (default 45)")
    parser.add_argument("--latency", type=float, default=3.0, help="the crowd's simulator latency (default 3 s)")
    parser.add_argument("--member-mib", type=int, default=1024, help="part 4's archive member (default 1,024 MiB)")
    parser.add_argument("--members", type=int, default=100_000, help="part 4's junk members, beside the manifest (default 100,000)")
    parser.add_argument("--download-max-mb", type=int, default=256, help="part 6's download_max_mb (default 256)")
    parser.add_argument("--deadline-s", type=float, default=15.0, help="part 6's download_deadline_s (default 15)")
    parser.add_argument("--initializes", type=int, default=10_000, help="part 7's flood (default 10,000)")
    parser.add_argument("--tool-timeout-s", type=float, default=5.0, help="part 8's local_tools_timeout_s (default 5)")
    parser.add_argument("--formula-terms", type=int, default=15_000, help="part 8's formula terms (15,000: 120 KB)")
    parser.add_argument("--proxy-latency", type=float, default=0.3, help="part 9's simulator latency (default 0.3 s)")
    parser.add_argument("--proxy-misses", type=int, default=30, help="part 9's misses per round (default 30)")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        if "1" in parts:
            stalled(Path(tmp))
        if "2" in parts:
            non_reading(Path(tmp), args.wait)
        if "3" in parts:
            crowd(Path(tmp), args.latency)
        if "4" in parts:
            archives(Path(tmp), args.member_mib, args.members)
        if "5" in parts:
            manifests(Path(tmp))
        if "6" in parts:
            downloads(Path(tmp), args.download_max_mb, args.deadline_s)
        if "7" in parts:
            mcp_sessions(Path(tmp), args.initializes)
        if "8" in parts:
            apibank(Path(tmp), args.tool_timeout_s, args.formula_terms)
        if "9" in parts:
            proxies(Path(tmp), args.proxy_latency, args.proxy_misses)
        if "10" in parts:
            escaped_echo(Path(tmp))
        if "11" in parts:
            mcp_listing(Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
