"""``report``: a real run through ``serve`` (the reference frozen cache plus a simulator stub), then its report.

The run: StableToolBench's 16 recorded calls (answered by the reference cache, frozen), the first
distinct default calls of the 765 solvable queries (answered by an OpenAI-compatible stub on
127.0.0.1, some of them unparsable: failure records), some of them again (store hits), with seeded
faults.  Then ``report`` on the running server's URL, on a snapshot of the store, on its archive
and on the store itself, each compared with the server's ``/stats``; the pages are opened in
headless chromium (Playwright): charts drawn, numbers shown equal to ``/stats``, nothing requested
outside the page.  The screenshots are kept under pytest's tmp_path (their paths are printed).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import requests

from stabletoolbench_mirror.reporting.server import NEW_ANSWERS, OUTCOMES
from stabletoolbench_mirror.reporting.tally import category_of, tool_of
from tests.helpers.browser import drawn_charts, open_page, require_chromium, table_rows
from tests.helpers.openai_stub import OpenAIStub, Reply, echo_responder
from tests.helpers.payloads import distinct_default_payloads
from tests.helpers.processes import REPO, ServeProcess

#: distinct default calls of the solvable queries sent (the full run is benchmarks/report_run.py)
CALLS = 150
REPEATED = 12


def unparsable_now_and_then(body: dict[str, Any]) -> Reply:
    """A valid answer, except for a prompt whose length is a multiple of 9 (the same calls every run)."""
    if len(str(body["messages"][-1]["content"])) % 9 == 0:
        return Reply(content="no JSON here")
    return echo_responder(body)


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STM_")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "stabletoolbench_mirror", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def report_of(source: str, where: Path, name: str, *extra: str) -> tuple[dict[str, Any], Path]:
    html_path, json_path = where / f"{name}.html", where / f"{name}.json"
    result = cli("report", source, "--html", str(html_path), "--json-out", str(json_path), "-q", *extra, cwd=where)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(json_path.read_text(encoding="utf-8")), html_path


class Run:
    """What the run left: the server's /stats and /health, its reports, its snapshot."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.stats: dict[str, Any] = {}
        self.health: dict[str, Any] = {}
        self.server_report: dict[str, Any] = {}
        self.server_page = folder / "server.html"
        self.store = folder / "store"
        self.snapshot = folder / "snapshot"
        self.manifest: dict[str, Any] = {}


@pytest.fixture(scope="module")
def run(reference_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Run:
    out = Run(tmp_path_factory.mktemp("report-run"))
    recorded = [json.loads(line)["payload"] for line in (reference_dir / "calls.jsonl").read_text().splitlines() if line.strip()]
    calls = distinct_default_payloads(reference_dir, CALLS)
    with OpenAIStub(unparsable_now_and_then) as stub:
        config = {
            "mode": "record", "store": {"path": str(out.store)}, "frozen_caches": [str(reference_dir / "cache")],
            "tools_folder": str(reference_dir / "toolenv" / "tools"),
            "simulator": {"enabled": True, "api_base": stub.api_base, "max_retries": 0, "model": "MirrorAPI"},
            "faults": {"seed": 3, "rate": 0.05, "kinds": ["api_not_working", "empty"]},
        }
        with ServeProcess(out.folder, config) as server, requests.Session() as http:
            answered = []
            for payload in recorded + calls:
                reply = http.post(server.url + "/virtual", json=payload, timeout=60)
                assert reply.status_code == 200, reply.text
                answered.append((payload, reply.headers["X-STM-Outcome"]))
            # the same calls again, answered by the store this time
            for payload in [p for p, outcome in answered if outcome == "recorded"][:REPEATED]:
                assert http.post(server.url + "/virtual", json=payload, timeout=60).headers["X-STM-Outcome"] == "hit"
            out.stats = http.get(server.url + "/stats", timeout=10).json()
            out.health = http.get(server.url + "/health", timeout=10).json()
            out.server_report, out.server_page = report_of(server.url, out.folder, "server")
    snapshot = cli("snapshot", str(out.snapshot), "--store-path", str(out.store), "-q", cwd=out.folder)
    assert snapshot.returncode == 0, snapshot.stdout + snapshot.stderr
    out.manifest = json.loads((out.snapshot / "manifest.json").read_text())
    return out


def test_the_run_is_what_the_report_must_show(run: Run) -> None:
    stats = run.stats
    # the run has every kind of answer the pages show: frozen, store, simulator, failures, faults
    assert stats["by_source"]["frozen"] == 16
    assert stats["hits"] == 16 + REPEATED
    assert stats["recorded"] > 0 and stats["failed"] > 0 and stats["failure_records"] == stats["failed"]
    assert sum(stats["faults"].values()) > 0
    assert stats["replaced"] == stats["unrecorded"] == stats["shared"] == 0


# -- the running server -------------------------------------------------------------------------------


def test_the_report_of_a_server_counts_what_its_stats_count(run: Run) -> None:
    stats, got = run.stats, run.server_report["requests"]
    assert run.server_report["source"]["kind"] == "server"
    assert got["requests"] == stats["requests"]
    assert got["outcomes"] == {name: stats[name] for name in OUTCOMES}
    assert got["failures"] == stats["failures"] and got["faults"] == stats["faults"] and got["by_source"] == stats["by_source"]
    # each request once, by what answered it
    assert got["answered"] == {
        "frozen_cache": stats["by_source"]["frozen"], "store": stats["hits"] - stats["by_source"]["frozen"],
        "simulated": sum(stats[name] for name in NEW_ANSWERS), "local": 0, "failure": stats["failed"], "not_served": 0,
    }
    assert sum(got["answered"].values()) == stats["requests"]
    per_category: Counter[str] = Counter()
    for api, counts in stats["by_api"].items():
        per_category[category_of(api)] += sum(n for name, n in counts.items() if name != "misses")
    assert {category: row["total"] for category, row in got["by_category"].items()} == dict(per_category)
    assert got["simulator_prompt"] == run.health["simulator_prompt"]


def test_the_page_of_a_server_shows_its_stats_in_drawn_charts_and_loads_nothing_else(run: Run, tmp_path: Path) -> None:
    require_chromium()
    stats = run.stats

    def inspect(page: Any) -> dict[str, Any]:
        return {"charts": drawn_charts(page), "outcomes": table_rows(page, "outcomes"), "answered": table_rows(page, "answered"),
                "faults": table_rows(page, "faults"), "failures": table_rows(page, "failures"),
                "total": page.inner_text("#requests-total"), "by_category": table_rows(page, "by-category")}

    opened = open_page(run.server_page, inspect, screenshot=tmp_path / "report-server.png")
    print(f"screenshot: {opened.screenshot}")
    shown = opened.result
    assert opened.requests == [opened.url]
    assert shown["total"] == f"{stats['requests']:,}"
    assert counts(shown["outcomes"]) == {name: stats[name] for name in OUTCOMES}
    assert counts(shown["faults"]) == stats["faults"] and counts(shown["failures"]) == stats["failures"]
    answered = counts(shown["answered"])
    assert answered["frozen cache"] == stats["by_source"]["frozen"] and answered["simulator"] == stats["recorded"]
    assert sum(answered.values()) == stats["requests"]
    assert sum(int(row[-1].replace(",", "")) for row in shown["by_category"]) == stats["requests"]
    charts = {chart["id"]: chart for chart in shown["charts"]}
    assert {"chart-answered", "chart-by-category", "chart-failures", "chart-faults"} <= set(charts)
    assert_drawn(charts.values())
    # one bar per kind of answer given, and one for the faults served in place of answers
    assert len(charts["chart-answered"]["bars"]) == sum(1 for n in run.server_report["requests"]["answered"].values() if n) + 1


# -- a snapshot, its archive and the store -----------------------------------------------------------------


def per_tool_entries(stats: dict[str, Any]) -> dict[str, int]:
    """The entries each tool's calls left in the store: a recorded answer or a failure record each (no retries here)."""
    out: Counter[str] = Counter()
    for api, row in stats["by_api"].items():
        if row.get("recorded", 0) + row.get("failed", 0):
            out[tool_of(api)] += row.get("recorded", 0) + row.get("failed", 0)
    return dict(out)


def test_the_report_of_a_snapshot_counts_what_the_run_recorded(run: Run) -> None:
    report, _page = report_of(str(run.snapshot), run.folder, "snapshot-json")
    stats, records = run.stats, report["records"]
    assert report["source"]["kind"] == "snapshot"
    assert report["environment"]["content_hash"] == run.manifest["content_hash"]
    assert records["by_source"] == run.manifest["by_source"] == {"simulated": stats["recorded"] + stats["failure_records"]}
    assert records["entries"] == stats["recorded"] + stats["failure_records"]
    assert records["failures"] == stats["failure_records"]
    assert {tool: row["total"] for tool, row in records["by_tool"].items()} == per_tool_entries(stats)
    assert sum(row["failure"] for row in records["by_category"].values() if "failure" in row) == stats["failure_records"]


def test_the_page_of_a_snapshot_shows_its_hash_and_counts(run: Run, tmp_path: Path) -> None:
    require_chromium()
    report, page_file = report_of(str(run.snapshot), tmp_path, "snapshot")

    def inspect(page: Any) -> dict[str, Any]:
        return {"charts": drawn_charts(page), "hash": page.inner_text("#content-hash"), "by_source": table_rows(page, "by-source"),
                "entries": page.inner_text("#entries-total"), "by_tool": table_rows(page, "by-tool"),
                "failures": page.inner_text("#failures-total")}

    opened = open_page(page_file, inspect, screenshot=tmp_path / "report-snapshot.png")
    print(f"screenshot: {opened.screenshot}")
    shown, stats = opened.result, run.stats
    assert opened.requests == [opened.url]
    assert shown["hash"] == run.manifest["content_hash"]
    assert counts(shown["by_source"]) == {"simulator": stats["recorded"] + stats["failure_records"]}
    assert shown["entries"] == f"{stats['recorded'] + stats['failure_records']:,}"
    assert shown["failures"] == f"{stats['failure_records']:,}"
    tools = per_tool_entries(stats)
    assert {row[0]: int(row[-1].replace(",", "")) for row in shown["by_tool"]} == {row[0]: tools[row[0]] for row in shown["by_tool"]}
    assert len(shown["by_tool"]) == min(len(tools), 100)
    charts = {chart["id"]: chart for chart in shown["charts"]}
    assert {"chart-by-source", "chart-by-category", "chart-failures"} <= set(charts)
    assert_drawn(charts.values())


def test_the_report_of_an_archive_is_that_of_its_snapshot(run: Run, tmp_path: Path) -> None:
    archive = tmp_path / "run.tar.gz"
    made = cli("snapshot", str(archive), "--store-path", str(run.store), "-q", cwd=tmp_path)
    assert made.returncode == 0, made.stdout + made.stderr
    of_archive, _ = report_of(str(archive), tmp_path, "archive")
    of_folder, _ = report_of(str(run.snapshot), tmp_path, "folder")
    assert of_archive["source"]["kind"] == "archive"
    assert of_archive["records"] == of_folder["records"]
    assert of_archive["environment"]["content_hash"] == of_folder["environment"]["content_hash"] == run.manifest["content_hash"]


def test_the_report_of_the_store_has_models_prompts_tokens_and_latency(run: Run, tmp_path: Path) -> None:
    require_chromium()
    report, page_file = report_of("store", tmp_path, "store", "--store-path", str(run.store))
    stats, records = run.stats, report["records"]
    assert report["source"] == {"kind": "store", "location": str(run.store), "store": "diskcache"}
    assert records["by_source"] == run.manifest["by_source"]
    assert records["failure_reasons"] == {"simulated: simulator output not parsable": stats["failure_records"]}
    prompt = run.health["simulator_prompt"]["sha256"]
    answers = [row for row in records["simulated"]["by_model"] if row["prompt_sha256"]]
    assert answers == [{"origin": "MirrorAPI", "model": "MirrorAPI", "prompt_sha256": prompt, "entries": stats["recorded"], "failures": 0}]
    # the stub counts one prompt and one completion token per answer
    assert records["tokens"] == {"records": stats["recorded"], "prompt_tokens": stats["recorded"],
                                 "completion_tokens": stats["recorded"], "total_tokens": 2 * stats["recorded"]}
    slowest = records["slowest_apis"]
    assert len(slowest) == 15 and [row["mean_s"] for row in slowest] == sorted((row["mean_s"] for row in slowest), reverse=True)

    def inspect(page: Any) -> dict[str, Any]:
        return {"charts": drawn_charts(page), "tokens": table_rows(page, "tokens"), "models": table_rows(page, "by-model"),
                "slowest": table_rows(page, "slowest")}

    opened = open_page(page_file, inspect, screenshot=tmp_path / "report-store.png")
    print(f"screenshot: {opened.screenshot}")
    shown = opened.result
    assert opened.requests == [opened.url]
    assert shown["tokens"] == [[f"{stats['recorded']:,}", f"{stats['recorded']:,}", f"{stats['recorded']:,}", f"{2 * stats['recorded']:,}"]]
    assert [prompt, f"{stats['recorded']:,}"] == [row for row in shown["models"] if row[2] == prompt][0][2:4]
    assert [row[0] for row in shown["slowest"]] == [row["api"] for row in slowest]
    charts = {chart["id"]: chart for chart in shown["charts"]}
    assert "chart-slowest" in charts and len(charts["chart-slowest"]["bars"]) == 15
    assert_drawn(charts.values())


def test_no_page_names_anything_outside_itself(run: Run, tmp_path: Path) -> None:
    pages = [run.server_page, report_of(str(run.snapshot), tmp_path, "snapshot")[1],
             report_of("store", tmp_path, "store", "--store-path", str(run.store))[1]]
    for page in pages:
        text = page.read_text(encoding="utf-8")
        assert not re.search(r"\b(src|href|srcset|action|formaction|poster|data)\s*=", text, re.I), page
        assert not re.search(r"url\(|@import|<script|<link|<iframe|<img|<object|<embed", text, re.I), page
        # the only URLs: the SVG namespace (a name, never fetched) and the server reported on, as text
        urls = set(re.findall(r"\b[a-z]+://[^\s\"'<>)]+", text))
        assert urls <= {"http://www.w3.org/2000/svg", run.server_report["source"]["location"]}, page


# -- errors ---------------------------------------------------------------------------------------------


def test_a_source_that_is_nothing_known_is_one_line_naming_what_is(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    result = cli("report", str(tmp_path / "empty"), "--html", str(tmp_path / "out.html"), cwd=tmp_path)
    assert result.returncode == 2
    assert "not a store, a snapshot, a score bundle or a server" in result.stderr and "manifest.json" in result.stderr
    assert not (tmp_path / "out.html").exists()


def test_a_report_needs_somewhere_to_go(tmp_path: Path) -> None:
    result = cli("report", str(tmp_path), cwd=tmp_path)
    assert result.returncode == 2 and "--html OUT.html, --json (printed) and/or --json-out OUT.json" in result.stderr


def test_a_server_that_is_not_there_is_named(tmp_path: Path) -> None:
    from tests.helpers.live import free_port

    url = f"http://127.0.0.1:{free_port()}"
    result = cli("report", url, "--json-out", str(tmp_path / "out.json"), "--timeout", "5", cwd=tmp_path)
    assert result.returncode == 2
    assert f"{url}/stats: cannot be read" in result.stderr and "stabletoolbench-mirror serve" in result.stderr


# -- helpers ----------------------------------------------------------------------------------------------


def counts(rows: list[list[str]] | None) -> dict[str, int]:
    """``{name: count}`` of a count table's rows as shown (``name``, ``1,234``, ``share``)."""
    assert rows is not None, "the table is not on the page"
    return {row[0]: int(row[1].replace(",", "")) for row in rows}


def assert_drawn(charts: Any) -> None:
    for chart in charts:
        assert chart["width"] > 0 and chart["height"] > 0, chart["id"]
        assert chart["bars"] and all(bar["width"] > 0 and bar["height"] > 0 for bar in chart["bars"]), chart["id"]
