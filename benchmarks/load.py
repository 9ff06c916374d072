"""Load benchmark: cache hits at concurrency 64 against `serve` with 1 and 2 workers and with Redis.

Fills a store (diskcache, or Redis started here from the Debian `redis-server`) with
--entries records spread over 20 APIs, starts `stabletoolbench-mirror serve --workers N`
in its own process group (replay mode), warms it up, then drives POST /virtual over
loopback with --concurrency keep-alive connections for --duration seconds of random
hits and prints requests/s, p50, p99 and errors per configuration.

Targets (issue 6): zero errors; p99 <= 20 ms at concurrency 64.

    python benchmarks/load.py [--duration 30] [--concurrency 64] [--configs disk:1 disk:2 redis:1 redis:2]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _loadgen import run_load  # noqa: E402
from _procs import free_port, process, serve_args  # noqa: E402

from stabletoolbench_mirror.core.call import ToolCall  # noqa: E402
from stabletoolbench_mirror.core.records import Record  # noqa: E402
from stabletoolbench_mirror.stores import DiskcacheStore, Store  # noqa: E402

APIS = 20


def fill(store: Store, entries: int) -> list[dict]:
    """``entries`` recorded calls; returns their /virtual payloads."""
    payloads = []
    for i in range(entries):
        api = f"Lookup {i % APIS}"
        tool_input = {"item_id": str(i), "page": i % 7, "lang": "en"}
        call = ToolCall.of("Data", "Bench Tool", api, tool_input)
        body = {"error": "", "response": json.dumps({"item": i, "name": f"item number {i}", "tags": ["a", "b", "c"]})}
        store.add(Record.from_answer(call.api, call.key, body, "simulated", "bench"), call.canonical)
        payloads.append({"category": "Data", "tool_name": "Bench Tool", "api_name": api,
                         "tool_input": json.dumps(tool_input), "strip": "", "toolbench_key": ""})
    return payloads


def server_config(workdir: Path, store_yaml: str, port: int) -> Path:
    cfg = workdir / f"server_config_{port}.yml"
    cfg.write_text(f"mode: replay\nport: {port}\nlog_level: warning\nstore: {store_yaml}\n")
    return cfg


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=30.0, help="seconds of load per configuration (default 30)")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--entries", type=int, default=5000)
    ap.add_argument("--warmup", type=float, default=10.0, help="seconds of load before measuring (default 10)")
    ap.add_argument("--configs", nargs="+", default=["disk:1", "disk:2", "redis:1", "redis:2"],
                    help="store:workers pairs, store in {disk, redis}")
    ap.add_argument("--json", help="also write the figures to this JSON file")
    args = ap.parse_args()

    rows = []
    with tempfile.TemporaryDirectory(prefix="stm-load-") as tmp:
        tmp_path = Path(tmp)
        disk_path = tmp_path / "store"
        redis_server = None
        payloads: list[dict] = []
        with DiskcacheStore(disk_path) as store:
            payloads = fill(store, args.entries)
        if any(c.startswith("redis") for c in args.configs):
            if shutil.which("redis-server") is None:
                raise SystemExit("redis-server is not installed (apt-get install redis-server)")
            from stabletoolbench_mirror.stores.redis_store import RedisStore
            from tests.helpers.redis_server import RedisServer

            redis_server = RedisServer(tmp_path / "redis").start()
            with RedisStore(redis_server.url, prefix="bench") as rstore:
                fill(rstore, args.entries)
        try:
            encoded = [json.dumps(p).encode() for p in payloads]
            rng = random.Random(6)
            order = [rng.randrange(len(encoded)) for _ in range(1 << 16)]

            def bodies(i: int) -> bytes:
                # every connection walks its own random sequence over all entries
                return encoded[order[(i * 40_503) % len(order)]]
            for config in args.configs:
                kind, _, workers_text = config.partition(":")
                workers = int(workers_text or 1)
                if kind == "disk":
                    store_yaml = json.dumps({"kind": "diskcache", "path": str(disk_path)})
                elif kind == "redis" and redis_server is not None:
                    store_yaml = json.dumps({"kind": "redis", "url": redis_server.url, "prefix": "bench"})
                else:
                    raise SystemExit(f"unknown config {config!r}")
                port = free_port()
                cfg = server_config(tmp_path, store_yaml, port)
                with process(serve_args(cfg, "--workers", str(workers)), f"http://127.0.0.1:{port}/health"):
                    url = f"http://127.0.0.1:{port}/virtual"
                    run_load(url, bodies, concurrency=args.concurrency, duration_s=args.warmup)  # warm-up
                    res = run_load(url, bodies, concurrency=args.concurrency, duration_s=args.duration)
                row = {"store": kind, "workers": workers, "concurrency": args.concurrency, "duration_s": round(res.elapsed_s, 1),
                       "requests": res.requests, "rps": round(res.rps), "p50_ms": round(res.p50_ms, 2),
                       "p99_ms": round(res.p99_ms, 2), "errors": res.errors, "statuses": res.statuses}
                rows.append(row)
                print(f"store={kind:<5} workers={workers}  concurrency={args.concurrency}  {res.rps:7.0f} req/s  "
                      f"p50={res.p50_ms:6.2f} ms  p99={res.p99_ms:6.2f} ms  errors={res.errors}", flush=True)
        finally:
            if redis_server is not None:
                redis_server.close()
    ok = all(r["errors"] == 0 and r["p99_ms"] <= 20 for r in rows)
    print(f"\ntargets (zero errors, p99 <= 20 ms): {'met' if ok else 'NOT met'}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
