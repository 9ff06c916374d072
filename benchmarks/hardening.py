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

Run from the repository root::

    python benchmarks/hardening.py            # all parts; --parts 1,3 for some
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from stabletoolbench_mirror.core.records import Record  # noqa: E402
from stabletoolbench_mirror.stores import DiskcacheStore  # noqa: E402
from tests.helpers.crowd import close_all, crowd_of_requests, request_without_reading, rss_mb, stalled_bodies  # noqa: E402
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parts", default="1,2,3")
    parser.add_argument("--wait", type=float, default=45.0, help="seconds part 2 waits (default 45)")
    parser.add_argument("--latency", type=float, default=3.0, help="the crowd's simulator latency (default 3 s)")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        if "1" in parts:
            stalled(Path(tmp))
        if "2" in parts:
            non_reading(Path(tmp), args.wait)
        if "3" in parts:
            crowd(Path(tmp), args.latency)
    return 0


if __name__ == "__main__":
    sys.exit(main())
