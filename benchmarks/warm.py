"""Warming benchmark: the 2,490 default calls of the six solvable groups against a 50 ms simulator.

Starts the OpenAI-compatible stub in its own process (``python -m tests.helpers.openai_stub
--port P --latency-ms 50``), then for each concurrency warms a fresh temporary store from
``../shared/reference/solvable_queries`` through the same layer the server uses, and prints
calls/s and its ratio to the concurrency/latency limit (``concurrency / latency``: the
rate of a warmer that spends no time of its own).

Target (issue 5): ratio >= 80% at concurrency 32 and 64.

    python benchmarks/warm.py [--queries DIR] [--latency-ms 50] [--concurrency 32 64]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from _procs import free_port, process, stub_args  # noqa: E402

from stabletoolbench_mirror.config import load_settings  # noqa: E402
from stabletoolbench_mirror.factory import build_layer  # noqa: E402
from stabletoolbench_mirror.warming.inputs import add_queries  # noqa: E402
from stabletoolbench_mirror.warming.plan import WarmPlan  # noqa: E402
from stabletoolbench_mirror.warming.pool import default_processes, run_warm_processes  # noqa: E402
from stabletoolbench_mirror.warming.runner import run_warm, warm_settings  # noqa: E402


def run_point(queries: Path, api_base: str, concurrency: int, processes: int | None) -> tuple[dict, int]:
    """Warm a fresh store exactly as ``stabletoolbench-mirror warm --concurrency N`` does."""
    processes = default_processes(concurrency) if processes is None else processes
    with tempfile.TemporaryDirectory(prefix="stm-warm-bench-") as tmp:
        empty = Path(tmp) / "config.yml"
        empty.write_text("{}\n")
        settings = load_settings(
            empty,
            overrides={
                "store": {"path": str(Path(tmp) / "store")},
                "simulator": {"enabled": True, "api_base": api_base, "max_retries": 0},
                "log_level": "warning",
            },
            environ={},
        )
        settings = warm_settings(settings, concurrency)
        plan = WarmPlan()
        add_queries(plan, [str(queries)], include_optional=False)
        if processes > 1:
            report = run_warm_processes(settings, plan, concurrency=concurrency, processes=processes, progress=False)
        else:
            layer = build_layer(settings)
            try:
                report = run_warm(layer, plan, concurrency=concurrency, progress=False)
            finally:
                layer.close()
    total = report.total
    return {
        "concurrency": concurrency,
        "calls": total.calls,
        "new": total.new,
        "failed": total.failed,
        "seconds": report.elapsed_s,
        "rate": report.attempted / report.elapsed_s,
    }, processes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", default=str(REPO.parent / "shared" / "reference" / "solvable_queries"))
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[32, 64])
    parser.add_argument("--processes", type=int, help="worker processes (default: as the warm command chooses)")
    args = parser.parse_args()
    queries = Path(args.queries)
    if not queries.exists():
        print(f"query folder not found: {queries}", file=sys.stderr)
        return 2
    port = free_port()
    with process(stub_args(port, args.latency_ms), f"http://127.0.0.1:{port}/v1/models"):
        print(f"stub: 127.0.0.1:{port}, {args.latency_ms:g} ms per completion; queries: {queries}")
        print(f"{'conc':>5} {'procs':>5} {'calls':>6} {'new':>6} {'failed':>6} {'seconds':>8} {'calls/s':>8} {'limit':>7} {'ratio':>6}")
        worst = 1.0
        for concurrency in args.concurrency:
            r, procs = run_point(queries, f"http://127.0.0.1:{port}/v1", concurrency, args.processes)
            limit = concurrency / (args.latency_ms / 1000.0)
            ratio = r["rate"] / limit
            worst = min(worst, ratio)
            print(
                f"{concurrency:>5} {procs:>5} {r['calls']:>6} {r['new']:>6} {r['failed']:>6} {r['seconds']:>8.2f} "
                f"{r['rate']:>8.1f} {limit:>7.0f} {100 * ratio:>5.1f}%"
            )
        print(f"target: ratio >= 80% -> {'met' if worst >= 0.8 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
