"""Benchmark: the cost of a simulated miss through the mirror server.

Starts, each in its own process (so that none shares a GIL with the load generator):

* OpenAI-compatible stub servers (``python -m tests.helpers.openai_stub``), one answering at
  once and one after 50 ms;
* a ``stabletoolbench-mirror serve`` process per stub, with a fresh diskcache store and the
  simulator pointed at the stub.

Then measures

1. **added latency at c=1**: sequential simulated misses through the server (every call a new
   input, so every call is a miss that reaches the model server) against direct calls to
   the same stub endpoint with the same chat-completions body; median and p99 of both and
   their differences (target, issue 24: added median <= 1 ms), and the server's CPU per miss;
2. **added latency at c=32**: misses at concurrency 32 through the server against as many direct
   calls at once to the 50 ms stub, in alternated rounds (target: added median <= 2 ms), and the
   server's CPU per miss;
3. **throughput**: simulated misses per second at concurrency 32 against the 50 ms stub
   (the ceiling is 32 / 0.05 s = 640/s; target >= 80 % of it).

With ``--before CHECKOUT``, the same servers from another checkout (its own code through
``PYTHONPATH``) against the same stubs, so before and after come from one run: the c=1 misses in
chunks, the c=32 rounds and the throughput in rounds too, interleaved between the servers, each
round in the other order than the last, so that each checkout meets the same swings of the
machine's load and neither always runs first.  Each checkout runs two servers of each kind, started
after, before, before, after, and its figures pool both: on the 2-core development machine the
server started first spent 2-5 % more CPU per miss at c=32 than the one started after it, whichever
checkout each ran (one run with each order), which made one checkout look slower than the other.

Run from the repository root::

    python benchmarks/miss_path.py            # or --quick for a short run
    python benchmarks/miss_path.py --before /path/to/old/checkout
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

sys.path.insert(0, str(REPO / "benchmarks"))

from _loadgen import run_load  # noqa: E402
from _procs import free_port, process, serve_checkout, stub_args  # noqa: E402

from stabletoolbench_mirror.core.call import ToolCall  # noqa: E402
from stabletoolbench_mirror.responders.simulator.prompts import SFT_SYSTEM_PROMPT, mirrorapi_messages  # noqa: E402

CONCURRENCY = 32
STUB_LATENCY_MS = 50.0


@contextmanager
def stub(latency_ms: float) -> Iterator[str]:
    port = free_port()
    with process(stub_args(port, latency_ms), f"http://127.0.0.1:{port}/v1/models"):
        yield f"http://127.0.0.1:{port}/v1"


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process (Linux ``/proc``), or ``None`` elsewhere."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


class Mirror(str):
    """The server's base URL, with its process id."""

    pid: int


@contextmanager
def mirror(api_base: str, workdir: Path, checkout: Path = REPO) -> Iterator[Mirror]:
    """A ``serve`` process of ``checkout`` (its own code through ``PYTHONPATH``) recording misses answered by ``api_base``."""
    port = free_port()
    folder = Path(tempfile.mkdtemp(dir=workdir))
    config = folder / "config.yml"
    config.write_text(
        json.dumps(
            {
                "mode": "record",
                "host": "127.0.0.1",
                "port": port,
                "log_level": "warning",
                "store": {"kind": "diskcache", "path": str(folder / "store")},
                "tools_folder": str(REPO / "cache" / "tools"),
                "simulator": {"enabled": True, "api_base": api_base, "model": "MirrorAPI", "max_retries": 0},
            }
        )
    )
    with serve_checkout(checkout, config, port) as proc:
        url = Mirror(f"http://127.0.0.1:{port}")
        url.pid = proc.pid
        yield url


def virtual_body(i: int) -> dict:
    return {
        "category": "Weather",
        "tool_name": "Demo Weather",
        "api_name": "Current Weather",
        "tool_input": json.dumps({"city": f"City {i}"}),
        "strip": "",
        "toolbench_key": "",
    }


def direct_body(i: int) -> dict:
    """The chat-completions body the server sends for ``virtual_body(i)`` (same size and shape)."""
    call = ToolCall.of("Weather", "Demo Weather", "Current Weather", {"city": f"City {i}"})
    return {
        "model": "MirrorAPI",
        "messages": mirrorapi_messages(SFT_SYSTEM_PROMPT, call, None),
        "temperature": 0.0,
        "max_tokens": 2048,
        "seed": 42,
    }


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def latency_samples(server: str, api_base: str, n: int, base: int = 10_000_000, warmup: int = 50) -> tuple[list[float], list[float]]:
    """``n`` sequential misses through the server and as many direct calls, alternated (after ``warmup`` rounds)."""
    direct_s, virtual_s = requests.Session(), requests.Session()
    direct: list[float] = []
    through: list[float] = []
    url_direct, url_virtual = api_base + "/chat/completions", server + "/virtual"
    for i in range(-warmup, n):
        for which in ((0, 1) if i % 2 else (1, 0)):
            if which == 0:
                data = json.dumps(direct_body(i + base))
                t = time.perf_counter()
                r = direct_s.post(url_direct, data=data, headers={"Content-Type": "application/json"})
                dt = time.perf_counter() - t
                assert r.status_code == 200, r.text
                if i >= 0:
                    direct.append(dt)
            else:
                data = json.dumps(virtual_body(i + base))
                t = time.perf_counter()
                r = virtual_s.post(url_virtual, data=data, headers={"Content-Type": "application/json"})
                dt = time.perf_counter() - t
                assert r.status_code == 200 and r.headers.get("X-STM-Outcome") == "recorded", (r.status_code, r.text)
                if i >= 0:
                    through.append(dt)
    return direct, through


def _summary(direct: list[float], through: list[float]) -> dict[str, float]:
    ms = 1000.0
    return {
        "direct_median_ms": statistics.median(direct) * ms,
        "direct_p99_ms": percentile(direct, 99) * ms,
        "server_median_ms": statistics.median(through) * ms,
        "server_p99_ms": percentile(through, 99) * ms,
        "added_median_ms": (statistics.median(through) - statistics.median(direct)) * ms,
        "added_p99_ms": (percentile(through, 99) - percentile(direct, 99)) * ms,
    }


Groups = list[list[Mirror]]
"""Servers by checkout: each checkout's figures are pooled from its group's servers."""


def _in_turn(groups: Groups, round_: int) -> list[tuple[int, Mirror]]:
    """``(group, server)`` for every server, in the order of this round: as given in even rounds, reversed in odd ones."""
    order = [(g, server) for g, group in enumerate(groups) for server in group]
    return order[::-1] if round_ % 2 else order


def latency_many(groups: Groups, api_base: str, n: int, chunks: int = 5) -> list[tuple[dict[str, float], float | None]]:
    """``n`` sequential misses per group (:func:`latency_samples`) in interleaved chunks (each server's chunk, then
    the next's), with each group's CPU per miss (its chunks' CPU over their misses, warm-ups included)."""
    direct: list[list[float]] = [[] for _ in groups]
    through: list[list[float]] = [[] for _ in groups]
    cpu: list[float | None] = [0.0 for _ in groups]
    calls = [0 for _ in groups]
    warmup = 50
    for c in range(chunks):
        for k, server in _in_turn(groups, c):
            size = max(1, n // chunks // len(groups[k]))
            before = cpu_seconds(server.pid)
            d, t = latency_samples(server, api_base, size, base=10_000_000 + c * 100_000 + server.pid * 10**9, warmup=warmup)
            after = cpu_seconds(server.pid)
            direct[k] += d
            through[k] += t
            calls[k] += size + warmup
            cpu_k = cpu[k]
            cpu[k] = None if before is None or after is None or cpu_k is None else cpu_k + after - before
        warmup = 10
    return [(_summary(d, t), None if c_ is None else c_ / k_) for d, t, c_, k_ in zip(direct, through, cpu, calls)]


def concurrent_added_many(groups: Groups, api_base: str, seconds: float, rounds: int,
                          concurrency: int = CONCURRENCY) -> list[dict[str, float]]:
    """Misses at ``concurrency`` through each group's servers vs the same number of direct calls to the stub at once.

    Short runs alternated (direct, server 1, direct, server 2, ... in each round) so that a busy machine's swings
    land on every side; every call a new input.  A server's CPU is read around its runs only; each group's
    servers share its ``seconds``.
    """
    direct: list[list[float]] = [[] for _ in groups]
    through: list[list[float]] = [[] for _ in groups]
    cpu = [0.0 for _ in groups]
    calls = [0 for _ in groups]
    for r in range(rounds):
        for n, server in _in_turn(groups, r):
            base, span = r * 10**8 + server.pid * 10**9, seconds / rounds / len(groups[n])
            res = run_load(api_base + "/chat/completions", lambda i, b=base: json.dumps(direct_body(10**13 + b + i)).encode(),
                           concurrency=concurrency, duration_s=span)
            direct[n] += res.latencies_s
            before = cpu_seconds(server.pid)
            res = run_load(server + "/virtual", lambda i, b=base: json.dumps(virtual_body(2 * 10**13 + b + i)).encode(),
                           concurrency=concurrency, duration_s=span)
            after = cpu_seconds(server.pid)
            if res.errors:
                raise RuntimeError(f"{res.errors} errors through the server ({res.statuses})")
            through[n] += res.latencies_s
            calls[n] += res.requests
            if before is not None and after is not None:
                cpu[n] += after - before
    ms = 1000.0
    return [{
        "direct_median_ms": statistics.median(d) * ms, "server_median_ms": statistics.median(t) * ms,
        "added_median_ms": (statistics.median(t) - statistics.median(d)) * ms,
        "direct_p99_ms": percentile(d, 99) * ms, "server_p99_ms": percentile(t, 99) * ms,
        "cpu_ms_per_miss": c / k * ms if k else float("nan"), "calls": k,
    } for d, t, c, k in zip(direct, through, cpu, calls)]


def throughput_many(groups: Groups, seconds: float, base: int, rounds: int = 1,
                    concurrency: int = CONCURRENCY) -> list[dict[str, float]]:
    """Simulated misses per second with ``concurrency`` keep-alive connections (the lean load generator),
    each group's servers for ``seconds`` in all, in ``rounds`` interleaved rounds; with their CPU per miss."""
    recorded = [0 for _ in groups]
    errors = [0 for _ in groups]
    elapsed = [0.0 for _ in groups]
    cpu: list[float | None] = [0.0 for _ in groups]
    latencies: list[list[float]] = [[] for _ in groups]
    for r in range(rounds):
        for n, server in _in_turn(groups, r):
            first = base + r * 10**8 + server.pid * 10**9
            before, cpu_before = requests.get(server + "/stats", timeout=10).json(), cpu_seconds(server.pid)
            result = run_load(
                server + "/virtual",
                lambda i, b=first: json.dumps(virtual_body(b + i)).encode(),  # every call a new input: a miss
                concurrency=concurrency,
                duration_s=seconds / rounds / len(groups[n]),
            )
            cpu_after, after = cpu_seconds(server.pid), requests.get(server + "/stats", timeout=10).json()
            done = after["recorded"] - before["recorded"]
            recorded[n] += done
            errors[n] += result.errors + (result.requests - done)
            elapsed[n] += result.elapsed_s
            latencies[n] += result.latencies_s
            cpu_n = cpu[n]
            cpu[n] = None if cpu_n is None or cpu_before is None or cpu_after is None else cpu_n + cpu_after - cpu_before
    ms = 1000.0
    return [{
        "calls_per_s": k / e, "calls": len(lat), "recorded": k, "errors": err, "seconds": e,
        "p50_ms": statistics.median(lat) * ms, "p99_ms": percentile(lat, 99) * ms,
        "cpu_s": float("nan") if c is None else c,
    } for k, err, e, lat, c in zip(recorded, errors, elapsed, latencies, cpu)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples, shorter load")
    parser.add_argument("--samples", type=int, default=None, help="sequential misses for the latency part (default 1000)")
    parser.add_argument("--seconds", type=float, default=None, help="length of the throughput run (default 15)")
    parser.add_argument("--before", help="another checkout (its repository root): its servers measured in the same run, "
                                         "against the same stubs, their runs interleaved with this checkout's")
    args = parser.parse_args()
    samples = args.samples or (200 if args.quick else 1000)
    seconds = args.seconds or (5.0 if args.quick else 15.0)
    checkouts = [("after", REPO)] + ([("before", Path(args.before).resolve())] if args.before else [])

    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        work = Path(tmp)
        fast_stub = stack.enter_context(stub(0.0))
        slow_stub = stack.enter_context(stub(STUB_LATENCY_MS))
        fast: Groups = [[] for _ in checkouts]
        slow: Groups = [[] for _ in checkouts]
        # with --before, two servers of each kind per checkout, started after, before, before, after: where a
        # server stands in the start order changes its figures, so each checkout pools one started early and one late
        for k in [0, 1, 1, 0] if args.before else [0]:
            fast[k].append(stack.enter_context(mirror(fast_stub, work, checkouts[k][1])))
            slow[k].append(stack.enter_context(mirror(slow_stub, work, checkouts[k][1])))
        labels = [label if args.before else "" for label, _checkout in checkouts]
        # the checkouts' chunks and rounds interleaved: each meets the same swings of the machine's load
        for label, (lat, cpu) in zip(labels, latency_many(fast, fast_stub, samples)):
            report_c1(label, lat, cpu, samples)
        throughput_many(slow, 1.0, base=0)  # warm-up
        for label, conc in zip(labels, concurrent_added_many(slow, slow_stub, seconds, rounds=5)):
            report_c32(label, conc)
        rounds = 5 if args.before else 1
        for label, tp in zip(labels, throughput_many(slow, seconds, 10**12, rounds)):
            report_throughput(label, tp, rounds)
        if hasattr(os, "getloadavg"):
            print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} (other processes compete for the same cores)")
    return 0


def _tag(label: str) -> str:
    return f"[{label}] " if label else ""


def report_c1(label: str, lat: dict[str, float], cpu_per_miss: float | None, samples: int) -> None:
    print(f"{_tag(label)}added latency of a simulated miss, c=1 ({samples} sequential misses, stub answering at once):")
    print(f"  direct to stub   median {lat['direct_median_ms']:.2f} ms   p99 {lat['direct_p99_ms']:.2f} ms")
    print(f"  through server   median {lat['server_median_ms']:.2f} ms   p99 {lat['server_p99_ms']:.2f} ms")
    verdict = "ok" if lat["added_median_ms"] <= 1.0 else "MISSED"
    print(f"  added            median {lat['added_median_ms']:.2f} ms   p99 {lat['added_p99_ms']:.2f} ms   (target median <= 1 ms: {verdict})")
    if cpu_per_miss is not None:
        print(f"  server CPU per miss at c=1: {cpu_per_miss * 1000:.2f} ms")


def report_c32(label: str, conc: dict[str, float]) -> None:
    verdict = "ok" if conc["added_median_ms"] <= 2.0 else "MISSED"
    print(f"{_tag(label)}added latency at concurrency {CONCURRENCY}, stub latency {STUB_LATENCY_MS:.0f} ms (alternated rounds, "
          f"{conc['calls']} misses through the server):")
    print(f"  direct to stub   median {conc['direct_median_ms']:.2f} ms   p99 {conc['direct_p99_ms']:.2f} ms")
    print(f"  through server   median {conc['server_median_ms']:.2f} ms   p99 {conc['server_p99_ms']:.2f} ms")
    print(f"  added            median {conc['added_median_ms']:.2f} ms   (target <= 2 ms: {verdict}); "
          f"server CPU per miss {conc['cpu_ms_per_miss']:.2f} ms")


def report_throughput(label: str, tp: dict[str, float], rounds: int) -> None:
    ceiling = CONCURRENCY / (STUB_LATENCY_MS / 1000.0)
    share = tp["calls_per_s"] / ceiling
    verdict = "ok" if share >= 0.8 else "MISSED"
    how = f"{tp['seconds']:.1f} s" + (f" in {rounds} interleaved rounds" if rounds > 1 else "")
    print(f"{_tag(label)}throughput at concurrency {CONCURRENCY}, stub latency {STUB_LATENCY_MS:.0f} ms ({how}):")
    print(
        f"  {tp['calls_per_s']:.0f} simulated misses/s = {share:.0%} of the {ceiling:.0f}/s ceiling "
        f"({tp['recorded']} recorded, {tp['errors']} errors; p50 {tp['p50_ms']:.1f} ms, p99 {tp['p99_ms']:.1f} ms)   (target >= 80%: {verdict})"
    )
    if tp["calls"] and tp["cpu_s"] == tp["cpu_s"]:  # not NaN: the process's CPU could be read
        per_call = tp["cpu_s"] / tp["calls"]
        print(
            f"  server process: {tp['cpu_s'] / tp['seconds']:.2f} cores busy, {per_call * 1000:.2f} ms CPU per miss "
            f"(one core would sustain ~{1 / per_call:.0f} misses/s)"
        )


if __name__ == "__main__":
    sys.exit(main())
