"""A full 765-query run and its report: ``report`` over the snapshot of that run, checked against ``/stats``.

Starts the OpenAI-compatible stub (in a thread) and ``serve`` (its own process) in ``record`` mode
with the reference frozen cache (``../shared/reference/cache``) and tool docs, sends StableToolBench's
16 recorded calls and every distinct default call of the 765 solvable queries (2,490) at
``--concurrency`` (8), then takes a snapshot and writes ``report`` of the server, the snapshot and the
store.  It checks that the snapshot's counts equal what ``/stats`` says the run recorded, and, when
chromium and Playwright are installed, opens the snapshot's page headless: charts drawn, nothing
requested outside the page.  Prints the times, the figures and the content hash; exit status 1 on
a mismatch.

    python benchmarks/report_run.py [--out DIR] [--concurrency 8] [--limit N]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import requests  # noqa: E402

from tests.helpers.openai_stub import OpenAIStub  # noqa: E402
from tests.helpers.payloads import distinct_default_payloads  # noqa: E402
from tests.helpers.processes import ServeProcess  # noqa: E402

REFERENCE = REPO.parent / "shared" / "reference"


def cli(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "stabletoolbench_mirror", *args], cwd=REPO, check=True, stdout=subprocess.DEVNULL)


def send_all(url: str, payloads: list[dict[str, Any]], concurrency: int) -> None:
    session = requests.Session()
    adapter = requests.adapters.HTTPAdapter(pool_maxsize=concurrency)
    session.mount("http://", adapter)

    def post(payload: dict[str, Any]) -> None:
        session.post(url + "/virtual", json=payload, timeout=120).raise_for_status()

    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(post, payloads))


def browser_check(page_file: Path, shot: Path) -> str:
    try:
        from tests.helpers.browser import drawn_charts, open_page
    except ImportError:
        return "skipped (playwright not installed)"
    try:
        opened = open_page(page_file, drawn_charts, screenshot=shot)
    except Exception as exc:  # noqa: BLE001 - a missing browser is a note here, not a failure
        return f"skipped ({type(exc).__name__}: {exc})"
    drawn = all(c["width"] > 0 and c["height"] > 0 and all(b["width"] > 0 for b in c["bars"]) for c in opened.result)
    only_itself = opened.requests == [opened.url]
    return f"{len(opened.result)} charts drawn: {drawn}; requests only the page: {only_itself}; screenshot {shot}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="where to keep the run (default: a temporary folder)")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--limit", type=int, help="only the first N distinct default calls")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="stm-report-run-"))
    out.mkdir(parents=True, exist_ok=True)
    recorded = [json.loads(line)["payload"] for line in (REFERENCE / "calls.jsonl").read_text().splitlines() if line.strip()]
    payloads = recorded + distinct_default_payloads(REFERENCE, args.limit)
    with OpenAIStub() as stub:
        config = {"mode": "record", "store": {"path": str(out / "store")}, "frozen_caches": [str(REFERENCE / "cache")],
                  "tools_folder": str(REFERENCE / "toolenv" / "tools"),
                  "simulator": {"enabled": True, "api_base": stub.api_base, "max_retries": 0, "model": "MirrorAPI"}}
        with ServeProcess(out, config) as server:
            started = time.perf_counter()
            send_all(server.url, payloads, args.concurrency)
            run_s = time.perf_counter() - started
            stats = requests.get(server.url + "/stats", timeout=30).json()
            started = time.perf_counter()
            cli("report", server.url, "--html", str(out / "server.html"), "--json-out", str(out / "server.json"))
            server_s = time.perf_counter() - started
    started = time.perf_counter()
    cli("snapshot", str(out / "snapshot"), "--store-path", str(out / "store"), "-q")
    snapshot_s = time.perf_counter() - started
    started = time.perf_counter()
    cli("report", str(out / "snapshot"), "--html", str(out / "snapshot.html"), "--json-out", str(out / "snapshot.json"))
    report_s = time.perf_counter() - started
    cli("report", "--store-path", str(out / "store"), "--html", str(out / "store.html"), "--json-out", str(out / "store.json"))
    report = json.loads((out / "snapshot.json").read_text())
    records = report["records"]
    expected = stats["recorded"] + stats["failure_records"]
    same = records["entries"] == expected and records["by_source"].get("simulated") == expected and records["failures"] == stats["failure_records"]
    server_report = json.loads((out / "server.json").read_text())["requests"]
    same = same and server_report["outcomes"]["hits"] == stats["hits"] and server_report["requests"] == stats["requests"]
    print(f"calls sent:        {len(payloads):,} ({len(recorded)} recorded calls + distinct default calls) in {run_s:.1f} s")
    print(f"/stats:            requests {stats['requests']:,}, hits {stats['hits']:,} (frozen {stats['by_source'].get('frozen', 0):,}), "
          f"recorded {stats['recorded']:,}, failed {stats['failed']:,}")
    print(f"snapshot:          {records['entries']:,} entries, by source {records['by_source']}, failures {records['failures']:,} "
          f"({snapshot_s:.1f} s)")
    print(f"content hash:      {report['environment']['content_hash']}")
    print(f"report:            server {server_s:.1f} s, snapshot {report_s:.1f} s; pages in {out}")
    print(f"browser:           {browser_check(out / 'snapshot.html', out / 'snapshot.png')}")
    print(f"counts equal /stats: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
