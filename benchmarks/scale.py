"""Scale benchmark: how start-up, first hits, memory and the bulk commands grow with the cache's size.

For each size it generates a tree with ``benchmarks/make_tree.py`` (10k entries over 300 API
files, 165k over 3,000, and with ``--with-1m`` 1M over 10,000; Zipf entries per file, answers
log-normal around 1 KB), then measures, each in its own process on 127.0.0.1:

* ``serve`` ready: seconds from start to ``/health`` 200, the tree as a frozen cache;
* the first pass: one call per API file (every file cold), concurrency 8: p99 and errors;
* hits at random over all APIs (concurrency 8, after the first pass): rps, and its ratio to a
  frozen cache of 10 entries served beside it (short rounds alternated, the best of each side, so
  a busy machine's swings do not land on one side); the server's RSS after touching every API
  once and after the hits;
* ``check`` of the tree's calls sample against the server (100k calls at 165k): seconds, verdict;
* ``cache import`` of the tree, ``cache stats``, ``cache export``, ``snapshot`` and ``snapshot --verify``
  of the store: seconds and peak RSS (flat memory: the same at every size);
* hits from the store itself (the imported tree, no frozen cache): rps and its ratio to a store
  of 1,000 entries; bytes per entry on disk;
* the same with a Redis store (a ``redis-server`` started here; ``--no-redis`` leaves it out):
  ``cache import``, ``cache stats``, ``cache export``, hits vs a 1,000-entry Redis store, and the
  server's memory per entry.

* one record written into the imported store, by kind (``benchmarks/store_writes.py``: an answer,
  the first answer of an API, a failure record), and the largest ratio to a 1,000-entry store.

Issue 24 adds two ratios that other machines can compare: the first pass's p99 over the hot hits'
p99, and the import rate over a bare ``json.load`` of the same files; ``--focus`` measures only
those figures (serve ready, first pass, hot hits, ``cache import``) and the record writes.

    python benchmarks/scale.py [--with-1m] [--sizes 10k 165k] [--duration 10] [--workdir DIR] [--keep] [--no-redis] [--focus]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _loadgen import run_list, run_load  # noqa: E402
from _procs import REPO, clean_env, free_port, process, serve_args  # noqa: E402

SIZES = {"10k": (10_000, 300, 10_000), "165k": (165_000, 3_000, 100_000), "1M": (1_000_000, 10_000, 10_000)}
CONCURRENCY = 8


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "stabletoolbench_mirror", *args]


def timed_rss(args: list[str], *, cwd: Path, ok_codes: tuple[int, ...] = (0,)) -> tuple[float, float, str]:
    """Run a command; return (seconds, its peak RSS in MB from wait4, stdout)."""
    started = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        env = clean_env()
        env["PYTHONPATH"] = str(REPO)  # the package of this checkout, from any folder
        proc = subprocess.Popen(args, cwd=cwd, env=env, stdout=out, stderr=err, text=True)
        _pid, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        seconds = time.perf_counter() - started
        out.seek(0)
        err.seek(0)
        stdout = out.read()
        if proc.returncode not in ok_codes:
            raise RuntimeError(f"{' '.join(args)} exited {proc.returncode}:\n{stdout[-2000:]}\n{err.read()[-2000:]}")
    return seconds, usage.ru_maxrss / 1024, stdout


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def make_tree(workdir: Path, name: str, entries: int, files: int, check_samples: int) -> Path:
    out = workdir / f"tree-{name}"
    if (out / "tree.json").is_file():
        return out
    shutil.rmtree(out, ignore_errors=True)
    args = [sys.executable, str(REPO / "benchmarks" / "make_tree.py"), str(out), "--entries", str(entries), "--files", str(files),
            "--check-samples", str(check_samples), "--samples", "20000", "-q"]
    seconds, _peak, _ = timed_rss(args, cwd=REPO)
    print(f"[{name}] generated {entries:,} entries over {files:,} files in {seconds:.0f} s", flush=True)
    return out


def config(workdir: Path, port: int, store: Path | dict[str, str], frozen: Path | None) -> Path:
    """A server config: ``store`` a diskcache folder, or a store mapping (``{"kind": "redis", ...}``)."""
    cfg = workdir / f"server-{port}.yml"
    frozen_line = f"frozen_caches: [{frozen / 'tool_response_cache'}]\n" if frozen else ""
    store_yaml = json.dumps(store) if isinstance(store, dict) else f"{{path: {store}}}"
    cfg.write_text(f"mode: replay\nport: {port}\nlog_level: warning\nstore: {store_yaml}\n{frozen_line}")
    return cfg


def bodies(path: Path) -> list[bytes]:
    return [line.strip().encode() for line in path.read_text().splitlines() if line.strip()]


def compare_hits(url: str, hits: list[bytes], base_url: str, base_hits: list[bytes], duration: float, rounds: int = 5) -> tuple[Any, Any]:
    """Hits on ``url`` and on the baseline ``base_url``, alternated in short rounds; the best round of each.

    Alternating (rather than one long run each) keeps a busy machine's swings from landing on one side.
    """
    rng = random.Random(7)
    order, base_order = hits[:], base_hits[:]
    rng.shuffle(order)
    best: list[Any] = [None, None]
    for _ in range(rounds):
        for side, (target, bodies_) in enumerate(((url, order), (base_url, base_order))):
            result = run_load(target, lambda i, b=bodies_: b[i % len(b)], concurrency=CONCURRENCY, duration_s=duration / rounds)
            if best[side] is None or result.rps > best[side].rps:
                best[side] = result
    return best[0], best[1]


def serve_and_measure(workdir: Path, tree: Path, store: Path | dict[str, str], duration: float, *, frozen: bool, baseline: Path,
                      base_store: Path | dict[str, str], check_calls: Path | None = None) -> dict[str, Any]:
    """Serve ``tree`` (frozen) or ``store`` and, beside it, the baseline; measure the figures of one size."""
    port, base_port = free_port(), free_port()
    cfg = config(workdir, port, store, tree if frozen else None)
    base_cfg = config(workdir, base_port, base_store, baseline if frozen else None)
    url, base_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{base_port}"
    out: dict[str, Any] = {}
    with process(serve_args(base_cfg), base_url + "/health"):
        started = time.perf_counter()
        with process(serve_args(cfg), url + "/health") as proc:
            out["ready_s"] = time.perf_counter() - started
            if frozen:
                first = run_list(url + "/virtual", bodies(tree / "payloads" / "first_pass.jsonl"), concurrency=CONCURRENCY)
                out["first_p99_ms"], out["first_errors"], out["first_n"] = first.p99_ms, first.errors, first.requests
                out["rss_after_pass_mb"] = rss_mb(proc.pid)
            hits, base_hits = bodies(tree / "payloads" / "hits.jsonl"), bodies(baseline / "payloads" / "hits.jsonl")
            for target, b in ((url, hits), (base_url, base_hits)):  # warm-up: every hit payload once
                run_list(target + "/virtual", b, concurrency=CONCURRENCY)
            result, base = compare_hits(url + "/virtual", hits, base_url + "/virtual", base_hits, duration)
            out["hit_rps"], out["hit_errors"], out["base_rps"] = result.rps, result.errors, base.rps
            out["hit_ratio"] = result.rps / base.rps
            out["hot_p99_ms"] = result.p99_ms
            if frozen:
                out["first_hot_ratio"] = out["first_p99_ms"] / result.p99_ms
            out["rss_after_hits_mb"] = rss_mb(proc.pid)
            if check_calls is not None:
                seconds, _peak, text = timed_rss(cli("check", "--calls", str(check_calls), "--url", url, "--concurrency", str(CONCURRENCY),
                                                     "-q", "--mode", "replay"), cwd=workdir, ok_codes=(0, 1))
                out["check_s"] = seconds
                out["check_line"] = next((ln for ln in text.splitlines() if " calls: " in ln), text[-200:])
    return out


def baselines(workdir: Path) -> tuple[Path, Path, Path]:
    """A 10-entry tree (the frozen baseline), a 1,000-entry tree and its imported store (the store baseline)."""
    small = make_tree(workdir, "10", 10, 1, 10)
    thousand = make_tree(workdir, "1000", 1000, 20, 10)
    store = workdir / "store-1000"
    if not store.exists():
        timed_rss(cli("cache", "import", str(thousand / "tool_response_cache"), "--store-path", str(store), "-q"), cwd=workdir)
    return small, thousand, store


def measure_redis(workdir: Path, name: str, tree: Path, thousand: Path, duration: float) -> dict[str, Any]:
    """The store figures with Redis: import, stats, export, memory per entry, hits vs a 1,000-entry Redis store.

    A fresh ``redis-server`` per size (append-only file, fsync every second, as the tests run it),
    the tree and the baseline under their own prefixes.
    """
    sys.path.insert(0, str(REPO))
    from tests.helpers.redis_server import RedisServer

    folder = workdir / f"redis-{name}"
    shutil.rmtree(folder, ignore_errors=True)
    server = RedisServer(folder).start()
    try:
        stores = {side: {"kind": "redis", "url": server.url, "prefix": side} for side in ("tree", "base")}
        cfgs = {side: config(workdir, free_port(), store, None) for side, store in stores.items()}
        timed_rss(cli("cache", "import", str(thousand / "tool_response_cache"), "--config", str(cfgs["base"]), "-q"), cwd=workdir)
        row: dict[str, Any] = {}
        row["redis_import_s"], row["redis_import_rss"], _ = timed_rss(
            cli("cache", "import", str(tree / "tool_response_cache"), "--config", str(cfgs["tree"]), "-q"), cwd=workdir)
        row["redis_stats_s"], _rss, text = timed_rss(cli("cache", "stats", "--json", "--config", str(cfgs["tree"])), cwd=workdir)
        stats = json.loads(text)
        assert stats["entries"] == SIZES[name][0] and stats["counted_by"] == "counters", stats
        row["redis_bytes_per_entry"] = stats["bytes_per_entry"]  # the server's used_memory (both prefixes) per entry
        export = workdir / f"export-redis-{name}"
        shutil.rmtree(export, ignore_errors=True)
        row["redis_export_s"], row["redis_export_rss"], _ = timed_rss(
            cli("cache", "export", str(export), "--config", str(cfgs["tree"]), "-q"), cwd=workdir)
        shutil.rmtree(export, ignore_errors=True)
        stored = serve_and_measure(workdir, tree, stores["tree"], duration, frozen=False, baseline=thousand, base_store=stores["base"])
        row["redis_rps"], row["redis_ratio"] = stored["hit_rps"], stored["hit_ratio"]
        print(f"[{name}] redis: {json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()})}", flush=True)
        return row
    finally:
        server.close()
        shutil.rmtree(folder, ignore_errors=True)


def json_load_s(tree: Path) -> float:
    """Seconds to ``json.load`` every API file of the tree, in a process of its own (the floor of any import)."""
    code = ("import json, pathlib, sys, time; t = time.perf_counter()\n"
            "for f in sorted(pathlib.Path(sys.argv[1]).rglob('*.json')): json.loads(f.read_bytes())\n"
            "print(time.perf_counter() - t)")
    _s, _rss, out = timed_rss([sys.executable, "-c", code, str(tree / "tool_response_cache")], cwd=REPO)
    return float(out.strip())


def store_writes(workdir: Path, store: Path, baseline: Path) -> dict[str, Any]:
    """Median ms of one record written into ``store`` (which it changes) and into a copy of the 1,000-entry
    ``baseline``, by kind (``benchmarks/store_writes.py``), and their ratios: a write should not cost more in a large store."""
    copy = workdir / "store-writes-baseline"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(baseline, copy)
    out: dict[str, Any] = {}
    try:
        for label, folder in (("writes", store), ("base_writes", copy)):
            _s, _rss, text = timed_rss([sys.executable, str(REPO / "benchmarks" / "store_writes.py"), str(folder)], cwd=REPO)
            out.update({f"{label}_{kind}_ms": ms for kind, ms in json.loads(text).items()})
    finally:
        shutil.rmtree(copy, ignore_errors=True)
    out["writes_ratio"] = max(out[f"writes_{k}_ms"] / out[f"base_writes_{k}_ms"] for k in ("known_api", "new_api", "failure"))
    return out


def measure(workdir: Path, name: str, duration: float, *, redis: bool, focus: bool = False) -> dict[str, Any]:
    entries, files, check_samples = SIZES[name]
    small, thousand, thousand_store = baselines(workdir)
    tree = make_tree(workdir, name, entries, files, check_samples)
    row: dict[str, Any] = {}
    served = serve_and_measure(workdir, tree, workdir / f"store-{name}-unused", duration, frozen=True, baseline=small,
                               base_store=workdir / "store-10-unused", check_calls=None if focus else tree / "payloads" / "calls.jsonl")
    row.update(served)
    print(f"[{name}] served: {json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in served.items()})}", flush=True)

    store = workdir / f"store-{name}"
    shutil.rmtree(store, ignore_errors=True)
    row["json_load_s"] = json_load_s(tree)
    row["import_s"], row["import_rss"], _ = timed_rss(cli("cache", "import", str(tree / "tool_response_cache"), "--store-path", str(store), "-q"), cwd=workdir)
    row["import_json_ratio"] = row["json_load_s"] / row["import_s"]  # import rate / json.load rate, entries per second
    print(f"[{name}] import: {row['import_s']:.1f} s, json.load of the same files {row['json_load_s']:.1f} s: "
          f"import rate = {row['import_json_ratio']:.2f} x json.load's", flush=True)
    if focus:
        row.update(store_writes(workdir, store, thousand_store))
        shutil.rmtree(store, ignore_errors=True)
        return row
    row["stats_s"], _rss, text = timed_rss(cli("cache", "stats", "--json", "--store-path", str(store)), cwd=workdir)
    stats = json.loads(text)
    row["bytes_per_entry"] = stats["bytes_per_entry"]
    assert stats["entries"] == entries, stats["entries"]
    for what, args in (
        ("export", ["cache", "export", str(workdir / f"export-{name}"), "--store-path", str(store), "-q"]),
        ("snapshot", ["snapshot", str(workdir / f"snapshot-{name}"), "--store-path", str(store), "-q"]),
        ("verify", ["snapshot", "--verify", str(workdir / f"snapshot-{name}"), "-q"]),
    ):
        if what != "verify":
            shutil.rmtree(workdir / f"{what}-{name}", ignore_errors=True)
        row[f"{what}_s"], row[f"{what}_rss"], _ = timed_rss(cli(*args), cwd=workdir)
    for folder in (f"export-{name}", f"snapshot-{name}"):
        shutil.rmtree(workdir / folder, ignore_errors=True)
    stored = serve_and_measure(workdir, tree, store, duration, frozen=False, baseline=thousand, base_store=thousand_store)
    row["store_rps"], row["store_ratio"] = stored["hit_rps"], stored["hit_ratio"]
    row.update(store_writes(workdir, store, thousand_store))
    print(f"[{name}] bulk: {json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items() if k not in served})}", flush=True)
    shutil.rmtree(store, ignore_errors=True)
    if redis:
        row.update(measure_redis(workdir, name, tree, thousand, duration))
    return row


ROWS = [
    ("`serve` ready (`/health` 200), the tree frozen", "ready_s", "{:.2f} s"),
    ("first pass (one call per file, cold), c=8: p99", "first_p99_ms", "{:.1f} ms"),
    ("first pass p99 / hot hits' p99 (c=8)", "first_hot_ratio", "{:.1f} ({hot_p99_ms:.1f} ms hot)"),
    ("first pass errors", "first_errors", "{}"),
    ("hit rps, random over all APIs, c=8 (x a 10-entry cache)", "hit_rps", "{:,.0f} ({ratio:.2f}x)"),
    ("server RSS after touching every API once", "rss_after_pass_mb", "{:.0f} MB"),
    ("server RSS after the hits", "rss_after_hits_mb", "{:.0f} MB"),
    ("`check` of the calls sample against the server", "check_s", "{:.1f} s"),
    ("`cache import` of the tree (peak RSS)", "import_s", "{:.1f} s ({import_rss:.0f} MB)"),
    ("import rate / `json.load` rate of the same files", "import_json_ratio", "{:.2f} (json.load {json_load_s:.1f} s)"),
    ("`cache stats`", "stats_s", "{:.2f} s"),
    ("`cache export` (peak RSS)", "export_s", "{:.1f} s ({export_rss:.0f} MB)"),
    ("`snapshot` (peak RSS)", "snapshot_s", "{:.1f} s ({snapshot_rss:.0f} MB)"),
    ("`snapshot --verify` (peak RSS)", "verify_s", "{:.1f} s ({verify_rss:.0f} MB)"),
    ("store hit rps, c=8 (x a 1,000-entry store)", "store_rps", "{:,.0f} ({store_ratio:.2f}x)"),
    ("store size on disk per entry", "bytes_per_entry", "{:,} B"),
    ("one record written into the imported store: answer / first of an API / failure", "writes_known_api_ms",
     "{:.2f} / {writes_new_api_ms:.2f} / {writes_failure_ms:.2f} ms"),
    ("the same / into a 1,000-entry store (the largest of the three)", "writes_ratio", "{:.1f}"),
    ("Redis: `cache import` of the tree (peak RSS)", "redis_import_s", "{:.1f} s ({redis_import_rss:.0f} MB)"),
    ("Redis: `cache stats`", "redis_stats_s", "{:.2f} s"),
    ("Redis: `cache export` (peak RSS)", "redis_export_s", "{:.1f} s ({redis_export_rss:.0f} MB)"),
    ("Redis: hit rps, c=8 (x a 1,000-entry Redis store)", "redis_rps", "{:,.0f} ({redis_ratio:.2f}x)"),
    ("Redis: server memory per entry", "redis_bytes_per_entry", "{:,} B"),
]


def table(results: dict[str, dict[str, Any]]) -> str:
    names = list(results)
    lines = ["| figure | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for label, key, fmt in ROWS:
        cells = []
        for name in names:
            row = results[name]
            try:
                cells.append(fmt.format(row[key], ratio=row.get("hit_ratio", 0), **row))
            except (KeyError, TypeError, ValueError):
                cells.append("-")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    checks = [f"{name}: {row.get('check_line', '-')}" for name, row in results.items()]
    return "\n".join(lines + [""] + ["check: " + c for c in checks])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", nargs="+", default=["10k", "165k"], choices=list(SIZES))
    ap.add_argument("--with-1m", action="store_true", help="also the 1M-entry point (long: ~2 GB of tree)")
    ap.add_argument("--duration", type=float, default=10.0, help="seconds of hits per measurement")
    ap.add_argument("--workdir", help="keep generated trees here (reused by later runs); default a temporary folder")
    ap.add_argument("--keep", action="store_true", help="do not delete the temporary folder")
    ap.add_argument("--no-redis", action="store_true", help="leave out the Redis store figures (they need redis-server)")
    ap.add_argument("--focus", action="store_true",
                    help="only serve ready, the first pass, hot hits, `cache import` and their ratios (issue 24's figures; implies --no-redis)")
    args = ap.parse_args()
    redis = not (args.no_redis or args.focus)
    if redis and shutil.which("redis-server") is None:
        raise SystemExit("redis-server is not installed (apt-get install redis-server), or pass --no-redis")
    sizes = list(args.sizes) + (["1M"] if args.with_1m and "1M" not in args.sizes else [])
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="stm-scale-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        results = {name: measure(workdir, name, args.duration, redis=redis, focus=args.focus) for name in sizes}
        print()
        print(table(results))
    finally:
        if not args.workdir and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
