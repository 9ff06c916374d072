"""Hit-path benchmark: throughput and latency of cache hits vs the size of the API file.

Starts `stabletoolbench-mirror serve` (its own process) on a generated upstream-layout
cache whose one API file holds 10, 1,000 and 10,000 entries, drives it over loopback at
concurrency 1 and 8 with random hits, and prints requests/s, p50 and p99 per point.

Targets (issue 2): 10,000-entry rps >= 0.8 x 10-entry rps; p99 <= 5 ms at concurrency 8.

    python benchmarks/hit_path.py [--duration 5] [--sizes 10 1000 10000] [--concurrency 1 8]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _loadgen import json_bodies, run_load  # noqa: E402
from _procs import free_port, process, serve_args  # noqa: E402

CATEGORY, TOOL, API = "Data", "Bench Tool", "Lookup Item"


def make_tree(root: Path, entries: int) -> list[dict]:
    folder = root / CATEGORY / "bench_tool_for_Data"
    folder.mkdir(parents=True)
    cache, inputs = {}, []
    for i in range(entries):
        tool_input = {"item_id": str(i), "page": i % 7, "lang": "en"}
        cache[str(tool_input)] = {"error": "", "response": f'{{"item": {i}, "name": "item number {i}", "tags": ["a", "b", "c"]}}'}
        inputs.append(tool_input)
    (folder / "lookup_item.json").write_text(json.dumps(cache, indent=4))
    return inputs


def server_config(workdir: Path, frozen: Path, port: int) -> Path:
    cfg = workdir / "server_config.yml"
    cfg.write_text(f"mode: replay\nport: {port}\nlog_level: warning\nstore: {{path: store}}\nfrozen_caches: [{frozen}]\n")
    return cfg


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=5.0, help="seconds per point")
    ap.add_argument("--sizes", type=int, nargs="+", default=[10, 1000, 10000])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    args = ap.parse_args()

    rows = []
    for size in args.sizes:
        with tempfile.TemporaryDirectory() as tmp:
            tmp_path = Path(tmp)
            inputs = make_tree(tmp_path / "frozen", size)
            port = free_port()
            cfg = server_config(tmp_path, tmp_path / "frozen", port)
            with process(serve_args(cfg), f"http://127.0.0.1:{port}/health"):
                rng = random.Random(size)
                payloads = [
                    {"category": CATEGORY, "tool_name": TOOL, "api_name": API, "tool_input": json.dumps(rng.choice(inputs)),
                     "strip": "", "toolbench_key": ""}
                    for _ in range(2000)
                ]
                url = f"http://127.0.0.1:{port}/virtual"
                run_load(url, json_bodies(payloads), concurrency=4, duration_s=1.0)  # warm-up (loads the file)
                for conc in args.concurrency:
                    res = run_load(url, json_bodies(payloads), concurrency=conc, duration_s=args.duration)
                    rows.append((size, conc, res))
                    print(f"entries={size:>6} concurrency={conc:>2}  {res.rps:8.0f} req/s  p50={res.p50_ms:6.2f} ms  "
                          f"p99={res.p99_ms:6.2f} ms  errors={res.errors}", flush=True)

    print()
    by = {(s, c): r for s, c, r in rows}
    for conc in args.concurrency:
        small, large = by.get((min(args.sizes), conc)), by.get((max(args.sizes), conc))
        if small and large:
            ratio = large.rps / small.rps
            print(f"concurrency {conc}: rps({max(args.sizes)}) / rps({min(args.sizes)}) = {ratio:.2f}  (target >= 0.80)")
    worst_p99 = max((r.p99_ms for s, c, r in rows if c == 8), default=float("nan"))
    print(f"worst p99 at concurrency 8: {worst_p99:.2f} ms  (target <= 5 ms)")


if __name__ == "__main__":
    main()
