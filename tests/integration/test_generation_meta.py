"""What a simulated record keeps beside its answer (never served), and bounded retries of unparsable output."""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path
from typing import Any

import requests

from stabletoolbench_mirror.commands.cli import main
from stabletoolbench_mirror.core.records import Record
from stabletoolbench_mirror.stores import DiskcacheStore
from tests.helpers.openai_stub import OpenAIStub, Reply

PAYLOAD = {
    "category": "Data",
    "tool_name": "Keyword Analysis",
    "api_name": "PopularSitesForQuery",
    "tool_input": json.dumps({"q": "birthday party ideas"}),
    "strip": "truncate",
    "toolbench_key": "",
}
COT_OUTPUT = (
    "Let me think about this API first.\n```json\n"
    + json.dumps({"mechanism_of_the_api": "It ranks sites for the query.", "error": "", "response": '{"sites": ["a.com"]}'})
    + "\n```"
)


def in_order(*replies: Reply):
    lock = threading.Lock()
    queue = list(replies)

    def responder(body: dict[str, Any]) -> Reply:
        with lock:
            return queue.pop(0) if len(queue) > 1 else queue[0]

    return responder


def test_a_simulated_record_keeps_what_the_generation_knew(settings_factory, serve, reference_dir, tmp_path) -> None:
    with OpenAIStub(in_order(Reply(content=COT_OUTPUT, finish_reason="stop"))) as stub:
        settings = settings_factory(
            tools_folder=str(reference_dir / "toolenv" / "tools"),
            simulator={"enabled": True, "style": "mirrorapi-cot", "api_base": stub.api_base, "model": "MirrorAPI", "temperature": 0.1, "seed": 9},
        )
        server = serve(settings)
        first = server.post(PAYLOAD)
        again = server.post(PAYLOAD)
        sent = stub.requests[0]
    # served: exactly the answer; the rationale and the metadata never
    assert first.text == '{"error":"","response":"{\\"sites\\": [\\"a.com\\"]}"}'
    assert again.text == first.text and again.headers["X-STM-Outcome"] == "hit"
    assert "mechanism" not in first.text and "think" not in first.text
    with DiskcacheStore(settings.resolve(settings.store.path)) as store:
        (record,) = list(store)
    assert record.body == first.text
    meta = dict(record.meta or {})
    latency = meta.pop("latency_s")
    assert 0 < latency < 60
    assert meta == {
        "style": "mirrorapi-cot",
        "model": "MirrorAPI",
        "prompt_sha256": hashlib.sha256(sent["messages"][0]["content"].encode()).hexdigest(),
        "temperature": 0.1,
        "seed": 9,
        "finish_reason": "stop",
        "prompt_tokens": 1,
        "completion_tokens": 1,
        "mechanism_of_the_api": "It ranks sites for the query.",
        "text_before_answer": "Let me think about this API first.",
    }
    health = requests.get(server.url + "/health", timeout=10).json()
    assert health["simulator_prompt"]["sha256"] == meta["prompt_sha256"]


def test_snapshot_hash_covers_only_what_is_served(tmp_path) -> None:
    answer = {"error": "", "response": "x"}
    key, api = str({"q": 1}), "Data/t_for_Data/a"
    hashes = []
    for name, meta in (("plain", None), ("with-meta", {"mechanism_of_the_api": "why", "prompt_tokens": 5})):
        store_path = tmp_path / name
        with DiskcacheStore(str(store_path)) as store:
            store.add(Record.from_answer(api, key, answer, "simulated", "MirrorAPI", meta), '{"q":1}')
            (back,) = list(store)
            assert back.meta == meta  # kept through the store
        out = tmp_path / f"snap-{name}"
        assert main(["snapshot", str(out), "--store-path", str(store_path)]) == 0
        assert main(["snapshot", "--verify", str(out)]) == 0
        hashes.append(json.loads((out / "manifest.json").read_text())["content_hash"])
    assert hashes[0] == hashes[1]


def test_unparsable_output_is_retried_with_another_seed(settings_factory, serve, reference_dir) -> None:
    good = json.dumps({"error": "", "response": "third time"})
    with OpenAIStub(in_order(Reply(content="garbage"), Reply(content="more garbage"), Reply(content=good))) as stub:
        settings = settings_factory(
            tools_folder=str(reference_dir / "toolenv" / "tools"),
            simulator={"enabled": True, "api_base": stub.api_base, "seed": 42, "parse_retries": 2},
        )
        server = serve(settings)
        answer = server.post(PAYLOAD)
        assert answer.json() == {"error": "", "response": "third time"}
        assert [r["seed"] for r in stub.requests] == [42, 43, 44]
        assert stub.requests[0]["messages"] == stub.requests[2]["messages"]
        stats = requests.get(server.url + "/stats", timeout=10).json()
    assert stats["simulator"] == {"parse_retries": 2, "parse_retry_successes": 1}
    with DiskcacheStore(settings.resolve(settings.store.path)) as store:
        (record,) = list(store)
    assert record.meta["parse_retries"] == 2 and record.meta["seed"] == 44


def test_mirrorapi_styles_do_not_retry_by_default(settings_factory, serve, reference_dir) -> None:
    with OpenAIStub(in_order(Reply(content="garbage"))) as stub:
        settings = settings_factory(
            tools_folder=str(reference_dir / "toolenv" / "tools"), simulator={"enabled": True, "api_base": stub.api_base}
        )
        server = serve(settings)
        assert server.post(PAYLOAD).json() == {"error": "Failed to generate fake response", "response": ""}
        assert stub.count == 1
        assert requests.get(server.url + "/stats", timeout=10).json()["simulator"] == {"parse_retries": 0, "parse_retry_successes": 0}


def test_parse_retries_are_summed_over_workers(tmp_path: Path, reference_dir: Path) -> None:
    """``serve --workers 2``: every worker counts into the shared counters; any worker's /stats has the sum."""
    from tests.helpers.processes import ServeProcess

    good = json.dumps({"error": "", "response": "ok"})
    state = {"n": 0}
    lock = threading.Lock()

    def alternate(body: dict[str, Any]) -> Reply:
        with lock:
            state["n"] += 1
            return Reply(content="garbage" if state["n"] % 2 else good)

    calls = 6
    with OpenAIStub(alternate) as stub:
        config = {
            "store": {"path": str(tmp_path / "store")},
            "tools_folder": str(reference_dir / "toolenv" / "tools"),
            "simulator": {"enabled": True, "api_base": stub.api_base, "parse_retries": 1},
        }
        with ServeProcess(tmp_path, config, workers=2) as server:
            for i in range(calls):  # one after the other: each call gets garbage, then a good answer
                body = dict(PAYLOAD, tool_input=json.dumps({"q": f"query {i}"}))
                answer = requests.post(server.url + "/virtual", json=body, timeout=60, headers={"Connection": "close"})
                assert answer.json() == {"error": "", "response": "ok"}
            workers, reads = set(), 0
            while len(workers) < 2:
                reads += 1
                assert reads <= 200, "every read landed on the same worker"
                stats = requests.get(server.url + "/stats", timeout=10, headers={"Connection": "close"})
                workers.add(stats.headers["x-stm-worker"])
                assert stats.json()["simulator"] == {"parse_retries": calls, "parse_retry_successes": calls}
            metrics = requests.get(server.url + "/metrics", timeout=10).text
        assert stub.count == 2 * calls
    assert f'stm_responder_events_total{{event="parse_retries",group="simulator"}} {float(calls)}' in metrics
