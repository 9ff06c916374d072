"""A benchmark run's load never becomes a wrong observation (issue: overload must wait, not fail).

StableToolBench's client posts each tool call with no timeout and turns any answer other than
HTTP 200 into the observation ``request invalid, data error. status_code=N`` (status 12), which
the agent reads and acts on.  These tests drive a real ``serve`` process with its *default*
limits the way a lab does: many threads on one host.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import requests

from tests.helpers.loadclient import send_all
from tests.helpers.payloads import distinct_default_payloads
from tests.helpers.processes import ServeProcess, StubProcess


def stabletoolbench_observation(url: str, payload: dict[str, Any]) -> dict[str, Any]:
    """What StableToolBench's client makes of one call (its rules for a ``.../virtual`` URL)."""
    response = requests.post(url, json=payload, headers={"toolbench_key": ""})  # no timeout, as upstream
    if response.status_code != 200:
        return {"error": f"request invalid, data error. status_code={response.status_code}", "response": ""}
    try:
        return response.json()
    except ValueError:
        return {"error": f"request invalid, data error. status_code={response.status_code}", "response": ""}


def test_all_default_calls_from_128_threads_twice_same_observations(tmp_path: Path, reference_dir: Path) -> None:
    payloads = distinct_default_payloads(reference_dir)
    assert len(payloads) > 2000, len(payloads)
    with StubProcess(tmp_path, latency_ms=50, echo_prompt=False) as stub:
        config = {"mode": "record", "store": {"kind": "diskcache", "path": str(tmp_path / "store")},
                  "tools_folder": str(reference_dir / "toolenv" / "tools"),
                  "simulator": {"enabled": True, "api_base": stub.api_base, "max_retries": 0}}
        with ServeProcess(tmp_path, config) as server:  # default limits
            url = server.url + "/virtual"
            runs = []
            for _ in range(2):
                with ThreadPoolExecutor(128) as pool:
                    runs.append(list(pool.map(lambda p: stabletoolbench_observation(url, p), payloads)))
            stats = requests.get(server.url + "/stats", timeout=10).json()
    for run in runs:
        errors = [o for o in run if o["error"].startswith("request invalid")]
        assert not errors, f"{len(errors)} calls became request errors, e.g. {errors[:3]}"
    differ = [i for i, (a, b) in enumerate(zip(*runs)) if a != b]
    assert not differ, f"{len(differ)} of {len(payloads)} observations differ between the runs, e.g. {payloads[differ[0]]}"
    assert stats["refused"] == 0 and stats["requests"] == 2 * len(payloads)


def test_256_concurrent_clients_misses_then_hits_all_http_200(tmp_path: Path) -> None:
    misses = [{"category": "Data", "tool_name": "Crowd Tool", "api_name": "lookup", "tool_input": json.dumps({"n": i}),
               "strip": "", "toolbench_key": ""} for i in range(2000)]
    with StubProcess(tmp_path, latency_ms=50, echo_prompt=False) as stub:
        config = {"mode": "record", "store": {"kind": "diskcache", "path": str(tmp_path / "store")},
                  "simulator": {"enabled": True, "api_base": stub.api_base, "max_retries": 0, "allow_without_docs": True}}
        with ServeProcess(tmp_path, config) as server:  # default limits
            first = send_all(server.url + "/virtual", misses, concurrency=256, timeout_s=300)
            second = send_all(server.url + "/virtual", misses + misses, concurrency=256, timeout_s=300)
            stats = requests.get(server.url + "/stats", timeout=10).json()
    for answers, expected in ((first, "recorded"), (second, "hit")):
        bad = [(a.status, a.error, a.body[:120]) for a in answers if a.status != 200]
        assert not bad, f"{len(bad)} of {len(answers)} answers were not HTTP 200, e.g. {bad[:3]}"
        assert {a.outcome for a in answers} == {expected}
    assert [a.body for a in second] == [a.body for a in first] * 2
    assert stats["refused"] == 0 and stats["hits"] == 4000 and stats["recorded"] == 2000
