#!/usr/bin/env python3
"""Ceiling benchmark: cache hits against a bare ASGI app on the same HTTP stack, driven by wrk.

Starts, each in its own process on 127.0.0.1:

* the bare app (``benchmarks/_bare_app.py``): uvicorn with httptools and the same event loop,
  reading the body and answering a fixed 1 KB JSON body: what the stack itself can serve;
* ``stabletoolbench-mirror serve`` of this checkout (``replay`` mode) over an upstream-layout
  frozen cache whose one API file holds 10 and 10,000 entries (as ``benchmarks/hit_path.py``);
* with ``--before CHECKOUT``, the same servers from another checkout (its own code through
  ``PYTHONPATH``), so before and after are measured in one run: two servers per checkout and size,
  started after, before, before, after, each checkout's rounds taking its two in turn (where a server
  stands in the start order can change its figures: ``benchmarks/miss_path.py`` says how much).

The hits cycle through 2,000 bodies (random inputs of the file); at the largest size each server
is also driven with every body new (``distinct``: an extra field the server ignores, so the call is
the same hit but no body was seen before; ``--no-distinct`` leaves these runs out).

Then drives them alternately (bare, each server, bare, each server, ...) with wrk (a C load
generator: a Python one saturates before the server does), ``--connections`` keep-alive
connections, random hits from a fixed list of bodies, and prints per target the median over the
rounds of rps, p50 and p99, and the ratio to the bare app (the median of each round's ratio to
the bare run just before it).  Issue 24: hit rps at 10,000 entries >= 0.5 x the bare app, goal 0.6 x.

wrk must be installed (``apt-get install wrk``); without it this refuses to run.

    python benchmarks/ceiling.py [--before /path/to/old/checkout] [--rounds 6] [--duration 4]
                                 [--connections 8] [--threads 1] [--sizes 10 10000] [--no-distinct]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _procs import REPO, free_port, process, serve_checkout  # noqa: E402
from hit_path import API, CATEGORY, TOOL, make_tree, server_config  # noqa: E402

MARK = "STM-WRK "
#: wrk's Lua script: the requests of a file of bodies (one a line), taken in turn from a random start;
#: the summary printed as one JSON line
SCRIPT = r"""
local reqs, bodies = {}, {}
local n, sent, distinct = 0, 0, false
local headers = {["Content-Type"] = "application/json"}
init = function(args)
  distinct = args[2] == "distinct"
  for line in io.lines(args[1]) do
    n = n + 1
    bodies[n] = line:sub(1, -2)
    reqs[n] = wrk.format("POST", "/virtual", headers, line)
  end
  math.randomseed(os.time() + tonumber(tostring({}):sub(8), 16))
  i = math.random(n)
  tag = math.random(1000000000)
end
request = function()
  i = i % n + 1
  if not distinct then
    return reqs[i]
  end
  -- every body new (a field the server ignores), so nothing kept by a body's bytes is reused
  sent = sent + 1
  return wrk.format("POST", "/virtual", headers, bodies[i] .. ', "seq": "' .. tag .. "-" .. sent .. '"}')
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('%s{"requests": %d, "duration_us": %d, "p50_us": %d, "p99_us": %d, "status_errors": %d, "socket_errors": %d}\n',
    "__MARK__", summary.requests, summary.duration, latency:percentile(50), latency:percentile(99), e.status,
    e.connect + e.read + e.write + e.timeout))
end
""".replace("__MARK__", MARK)


@dataclass
class Target:
    name: str
    urls: list[str]
    """Its servers' URLs, taken in turn by the rounds."""
    bodies: Path
    distinct: bool = False
    runs: list[dict] = field(default_factory=list)
    ratios: list[float] = field(default_factory=list)

    def median(self, key: str) -> float:
        return statistics.median(r[key] for r in self.runs)


def wrk(url: str, script: Path, bodies: Path, *, threads: int, connections: int, duration: float, distinct: bool = False) -> dict:
    """One wrk run (``distinct``: every body made new by an ignored field): requests/s, p50 and p99 in ms, errors."""
    args = ["wrk", f"-t{threads}", f"-c{connections}", f"-d{duration:g}s", "--timeout", "10s", "-s", str(script), url, "--", str(bodies)]
    args += ["distinct"] if distinct else []
    out = subprocess.run(args, capture_output=True, text=True, check=True, timeout=duration + 60).stdout
    line = next((ln for ln in out.splitlines() if ln.startswith(MARK)), None)
    if line is None:
        raise RuntimeError(f"wrk printed no summary:\n{out[-2000:]}")
    data = json.loads(line[len(MARK):])
    return {
        "rps": data["requests"] / (data["duration_us"] / 1e6),
        "p50_ms": data["p50_us"] / 1000,
        "p99_ms": data["p99_us"] / 1000,
        "errors": data["status_errors"] + data["socket_errors"],
        "requests": data["requests"],
    }


def hit_bodies(path: Path, inputs: list[dict], n: int = 2000) -> Path:
    rng = random.Random(len(inputs))
    lines = [json.dumps({"category": CATEGORY, "tool_name": TOOL, "api_name": API, "tool_input": json.dumps(rng.choice(inputs)),
                         "strip": "", "toolbench_key": ""}) for _ in range(n)]
    path.write_text("\n".join(lines) + "\n")
    return path


def check_hit(url: str, bodies: Path) -> None:
    """The first body is answered 200 as a cache hit (else the benchmark measures something else)."""
    body = bodies.read_text().splitlines()[0]
    r = requests.post(url, data=body, headers={"Content-Type": "application/json"}, timeout=30)
    if r.status_code != 200 or r.headers.get("x-stm-outcome") != "hit":
        raise RuntimeError(f"{url} did not answer a hit: {r.status_code} {r.headers} {r.text[:200]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", help="another checkout (its repository root) measured in the same run")
    ap.add_argument("--sizes", type=int, nargs="+", default=[10, 10_000], help="entries in the one API file")
    ap.add_argument("--rounds", type=int, default=6, help="an even number gives each server of a checkout as many rounds")
    ap.add_argument("--duration", type=float, default=4.0, help="seconds per wrk run")
    ap.add_argument("--connections", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1, help="wrk threads (1 leaves the other core of a 2-core machine to the server)")
    ap.add_argument("--no-distinct", dest="distinct", action="store_false",
                    help="leave out the runs at the largest size where every body is new (no body seen before)")
    args = ap.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed: apt-get install wrk (a Python load generator saturates before the server does, "
                         "so this benchmark does not fall back to one)")
    checkouts = [("after", REPO)] + ([("before", Path(args.before).resolve())] if args.before else [])
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        work = Path(tmp)
        script = work / "bodies.lua"
        script.write_text(SCRIPT)
        port = free_port()
        stack.enter_context(process([sys.executable, str(REPO / "benchmarks" / "_bare_app.py"), "--port", str(port)],
                                    f"http://127.0.0.1:{port}/"))
        bare_bodies: Path | None = None
        targets: list[Target] = []
        for size in args.sizes:
            inputs = make_tree(work / f"frozen-{size}", size)
            bodies = hit_bodies(work / f"bodies-{size}.txt", inputs)
            bare_bodies = bare_bodies or bodies
            urls: list[list[str]] = [[] for _ in checkouts]
            for n, k in enumerate([0, 1, 1, 0] if args.before else [0]):
                label, checkout = checkouts[k]
                folder = work / f"{label}-{size}-{n}"
                folder.mkdir()
                server_port = free_port()
                cfg = server_config(folder, work / f"frozen-{size}", server_port)
                stack.enter_context(serve_checkout(checkout, cfg, server_port))
                urls[k].append(f"http://127.0.0.1:{server_port}/virtual")
                check_hit(urls[k][-1], bodies)
            for (label, _checkout), mine in zip(checkouts, urls):
                targets.append(Target(f"{label} {size:>6} entries", mine, bodies))
                if args.distinct and size == max(args.sizes):
                    targets.append(Target(f"{label} {size:>6} distinct", mine, bodies, distinct=True))
        bare = Target("bare ASGI app", [f"http://127.0.0.1:{port}/virtual"], bare_bodies or Path())
        for target in [bare, *targets]:  # warm-up: loads the files, fills caches
            for url in target.urls:
                wrk(url, script, target.bodies, threads=args.threads, connections=args.connections, duration=1, distinct=target.distinct)
        for round_ in range(args.rounds):
            for target in targets:
                bare.runs.append(wrk(bare.urls[0], script, bare.bodies, threads=args.threads, connections=args.connections, duration=args.duration))
                run = wrk(target.urls[round_ % len(target.urls)], script, target.bodies, threads=args.threads, connections=args.connections, duration=args.duration,
                          distinct=target.distinct)
                target.runs.append(run)
                target.ratios.append(run["rps"] / bare.runs[-1]["rps"])
            print(f"round {round_ + 1}/{args.rounds}: " + ", ".join(f"{'-'.join(t.name.split())} {t.runs[-1]['rps']:.0f}" for t in targets)
                  + f"; bare {bare.runs[-1]['rps']:.0f} req/s", flush=True)
    print(f"\nwrk -t{args.threads} -c{args.connections}, {args.rounds} rounds of {args.duration:g} s, each server run after a bare one; medians:")
    for target in [bare, *targets]:
        ratio = f"  x bare {statistics.median(target.ratios):.2f}" if target.ratios else ""
        errors = sum(r["errors"] for r in target.runs)
        print(f"  {target.name:<24} {target.median('rps'):8.0f} req/s  p50 {target.median('p50_ms'):6.2f} ms  "
              f"p99 {target.median('p99_ms'):6.2f} ms  errors {errors}{ratio}")
    for target in targets:
        if target.name.startswith("after") and target.name.split()[1] == str(max(args.sizes)):
            ratio = statistics.median(target.ratios)
            if target.distinct:  # each body parsed and keyed anew: shown beside the target, not a target itself
                print(f"hit rps at {max(args.sizes):,} entries (every body new) = {ratio:.2f} x the bare app")
            else:
                print(f"hit rps at {max(args.sizes):,} entries (2,000 bodies again and again) = {ratio:.2f} x the bare app "
                      f"(issue 24: >= 0.5, goal 0.6: {'ok' if ratio >= 0.6 else 'over 0.5' if ratio >= 0.5 else 'MISSED'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
