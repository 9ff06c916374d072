"""``GET /metrics`` (Prometheus text) and ``GET /stats`` count every request, whichever worker answers.

Real processes: ``serve --workers 4`` over a frozen tree; each read is a new connection, so the
reads land on different workers (the test goes on until it has read from at least two).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.loadclient import send_all
from tests.helpers.processes import ServeProcess

HITS, MISSES, BAD = 700, 250, 50


def tree(root: Path) -> list[dict[str, Any]]:
    folder = root / "Data" / "metrics_for_Data"
    folder.mkdir(parents=True)
    (folder / "lookup.json").write_text(json.dumps({str({"i": i}): {"error": "", "response": f"answer {i}"} for i in range(50)}))
    payloads = []
    for n in range(HITS + MISSES + BAD):
        if n < HITS:
            tool_input: Any = json.dumps({"i": n % 50})
        elif n < HITS + MISSES:
            tool_input = json.dumps({"i": 1000 + n})
        else:
            tool_input = "{not json"
        payloads.append({"category": "Data", "tool_name": "metrics", "api_name": "lookup", "tool_input": tool_input,
                         "strip": "", "toolbench_key": ""})
    return payloads


def metric_totals(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_metrics_and_stats_count_every_request_over_four_workers(tmp_path: Path) -> None:
    payloads = tree(tmp_path / "frozen")
    config = {"mode": "replay", "store": {"kind": "diskcache", "path": str(tmp_path / "store")},
              "frozen_caches": [str(tmp_path / "frozen")], "limits": {"max_in_flight_per_client": 512}}
    with ServeProcess(tmp_path, config, workers=4) as server:
        answers = send_all(server.url + "/virtual", payloads, concurrency=32)
        assert [a.status for a in answers] == [200] * len(payloads)
        total = len(payloads)
        workers_read: set[str] = set()
        reads = 0
        while len(workers_read) < 2 or reads < 8:
            reads += 1
            assert reads <= 200, f"every read landed on the same worker ({workers_read})"
            # a new connection per read: the kernel hands it to any worker
            stats = requests.get(server.url + "/stats", timeout=10, headers={"Connection": "close"})
            workers_read.add(stats.headers["x-stm-worker"])
            body = stats.json()
            assert body["requests"] == total
            assert body["hits"] == HITS and body["unanswered"] == MISSES and body["rejected"] == BAD
            assert body["by_api"]["Data/metrics_for_Data/lookup"]["hits"] == HITS
            metrics = requests.get(server.url + "/metrics", timeout=10, headers={"Connection": "close"})
            assert metrics.status_code == 200 and metrics.headers["content-type"].startswith("text/plain")
            workers_read.add(metrics.headers["x-stm-worker"])
            samples = metric_totals(metrics.text)
            by_outcome = {dict(labels)["outcome"]: v for (name, labels), v in samples.items() if name == "stm_requests_total"}
            assert sum(by_outcome.values()) == total
            assert by_outcome["hit"] == HITS and by_outcome["unanswered"] == MISSES and by_outcome["rejected"] == BAD
        assert len(workers_read) >= 2


def test_metrics_in_one_process_parse_and_match_stats(tmp_path: Path, settings_factory, serve) -> None:
    payloads = tree(tmp_path / "frozen")
    server = serve(settings_factory(mode="replay", frozen_caches=[str(tmp_path / "frozen")]))
    for payload in payloads[:: 10]:
        assert requests.post(server.url + "/virtual", json=payload, timeout=10).status_code == 200
    stats = requests.get(server.url + "/stats", timeout=10).json()
    samples = metric_totals(requests.get(server.url + "/metrics", timeout=10).text)
    by_outcome = {dict(labels)["outcome"]: v for (name, labels), v in samples.items() if name == "stm_requests_total"}
    assert stats["requests"] == len(payloads[::10]) == sum(by_outcome.values())
    assert stats["hits"] == by_outcome["hit"]
    api = {dict(labels)["outcome"]: v for (name, labels), v in samples.items()
           if name == "stm_api_requests_total" and dict(labels)["api"] == "Data/metrics_for_Data/lookup"}
    assert api["hit"] == stats["by_api"]["Data/metrics_for_Data/lookup"]["hits"]
