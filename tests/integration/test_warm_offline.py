"""`warm --engine vllm-offline`: prompts batched through one generation function, the simulator's prompts and parser.

vLLM itself is exercised in the vLLM tier (tests/vllm/test_warm_offline_vllm.py); here the
batching responder runs with a plain generation function in its place.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from stabletoolbench_mirror.responders.simulator import build_simulator
from stabletoolbench_mirror.stores import DiskcacheStore
from stabletoolbench_mirror.warming.inputs import add_queries
from stabletoolbench_mirror.warming.offline import BatchingSimulator, offline_layer
from stabletoolbench_mirror.warming.plan import WarmPlan
from stabletoolbench_mirror.warming.runner import run_warm, warm_settings
from tests.helpers.answer_files import api, param, query


def query_file(tmp_path: Path, apis: int) -> Path:
    path = tmp_path / "queries.json"
    docs = [api("Data", f"Tool {i % 3}", f"Api {i}", required=[param("q", "STRING", f"v{i}")]) for i in range(apis)]
    path.write_text(json.dumps([query(1, docs)]))
    return path


def warm_offline(settings, tmp_path: Path, apis: int, generate, *, concurrency: int, model: str):
    """Warm the calls of ``apis`` APIs through the offline engine with ``generate``: the report and the plan."""
    layer = offline_layer(settings, model=model, concurrency=concurrency, generate=generate)
    plan = WarmPlan()
    add_queries(plan, [str(query_file(tmp_path, apis))], include_optional=False)
    try:
        return run_warm(layer, plan, concurrency=concurrency, progress=False), plan
    finally:
        layer.close()


class Generator:
    """A generation function: one output per conversation, recording every batch."""

    def __init__(self, output=lambda messages: json.dumps({"error": "", "response": "offline " + messages[-1]["content"][-20:]})) -> None:
        self.batches: list[list[list[dict]]] = []
        self.output = output
        self.lock = threading.Lock()

    def __call__(self, conversations: Sequence[list[dict]]) -> list[tuple[str, str]]:
        with self.lock:
            self.batches.append([list(c) for c in conversations])
        return [(self.output(c), "stop") for c in conversations]


def test_offline_engine_batches_prompts_and_records(settings_factory, tmp_path: Path) -> None:
    settings = warm_settings(settings_factory(), 8)
    generate = Generator()
    report, plan = warm_offline(settings, tmp_path, 40, generate, concurrency=8, model="/models/MirrorAPI")
    assert report.total.new == 40 and not report.failures
    sizes = [len(b) for b in generate.batches]
    assert sum(sizes) == 40 and max(sizes) <= 8 and max(sizes) > 1
    # the prompts are the simulator's own
    renderer = build_simulator(settings)
    sent = [c for b in generate.batches for c in b]
    assert sorted(json.dumps(m) for m in sent) == sorted(json.dumps(renderer.messages(i.call, [])) for i in plan.items)
    with DiskcacheStore(tmp_path / "store") as store:
        saved = list(store)
    assert len(saved) == 40 and {r.origin for r in saved} == {"/models/MirrorAPI"} and {r.source for r in saved} == {"simulated"}


def test_offline_unparsable_output_and_engine_errors_are_failure_records(settings_factory, tmp_path: Path) -> None:
    settings = warm_settings(settings_factory(), 4)

    def output(messages: list[dict]) -> str:
        text = messages[-1]["content"]
        if "'v1'" in text:
            return "no json here"
        if "'v2'" in text:
            raise RuntimeError("CUDA out of memory")
        # MirrorAPI's loose output still parses
        return '```json\n{"error": "", "response": "He said "hi" to me"}\n```'

    report, _ = warm_offline(settings, tmp_path, 4, Generator(output), concurrency=1, model="m")
    assert report.total.new == 2 and report.total.failed == 2
    reasons = " ".join(f.reason for f in report.failures)
    assert "Failed to generate fake response" in reasons and "gave no usable answer" in reasons
    with DiskcacheStore(tmp_path / "store") as store:
        saved = list(store)
    usable = [r for r in saved if not r.is_failure]
    assert len(usable) == 2 and all("'v1'" not in r.key and "'v2'" not in r.key for r in usable)
    # the two failures are failure records (what was served), tried again by the next run
    assert sorted(r.reason for r in saved if r.is_failure) == [
        "simulated: offline engine failed: RuntimeError: CUDA out of memory", "simulated: simulator output not parsable"]


def test_batcher_flushes_a_partial_batch_and_closes_cleanly() -> None:
    generate = Generator()
    batcher = BatchingSimulator(lambda call, examples: [{"role": "user", "content": str(call)}], generate, origin="m", batch_size=100, linger_s=0.02)
    from stabletoolbench_mirror.core.call import ToolCall

    results = []
    threads = [threading.Thread(target=lambda i=i: results.append(batcher.respond(ToolCall.of("C", "t", "a", {"i": i}), []))) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert len(results) == 3 and all(r.answer is not None for r in results)
    assert sum(len(b) for b in generate.batches) == 3
    batcher.close()
    closed = batcher.respond(ToolCall.of("C", "t", "a", {}), [])
    assert closed.answer is None and "closed" in closed.detail


def test_cli_without_vllm_is_a_clear_error(tmp_path: Path) -> None:
    probe = subprocess.run([sys.executable, "-c", "import vllm; vllm.LLM"], cwd=tmp_path, capture_output=True, timeout=120)
    if probe.returncode == 0:
        pytest.skip("vLLM is installed here")
    queries = query_file(tmp_path, 1)
    env = {k: v for k, v in os.environ.items() if not k.startswith("STM_")}
    run = subprocess.run(
        [sys.executable, "-m", "stabletoolbench_mirror", "warm", "--queries", str(queries), "--engine", "vllm-offline", "--model", "x", "--store-path", str(tmp_path / "s")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 2 and "needs vLLM" in run.stderr and "Traceback" not in run.stderr
    no_model = subprocess.run(
        [sys.executable, "-m", "stabletoolbench_mirror", "warm", "--queries", str(queries), "--engine", "vllm-offline", "--store-path", str(tmp_path / "s")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert no_model.returncode == 2 and "--model" in no_model.stderr


def test_offline_answers_are_scrubbed_of_keys(settings_factory, tmp_path: Path) -> None:
    """Like the HTTP simulator: a configured key the model writes into an answer never reaches the store."""
    key = "sk-OFFLINE-KEY-91b2c3"
    settings = warm_settings(settings_factory(simulator={"api_key": key}, auth_token="tok-OFFLINE-77"), 4)

    def output(messages: list[dict]) -> str:
        return json.dumps({"error": "", "response": {"said": f"Bearer {key}", key: "tok-OFFLINE-77"}})

    report, _ = warm_offline(settings, tmp_path, 3, Generator(output), concurrency=4, model="m")
    assert report.total.new == 3
    with DiskcacheStore(tmp_path / "store") as store:
        bodies = [r.body for r in store]
    assert len(bodies) == 3 and all(key not in b and "tok-OFFLINE-77" not in b and "Bearer ***" in b for b in bodies)


def test_offline_incomplete_outputs_are_failure_records_asked_again(settings_factory, tmp_path: Path) -> None:
    """Only complete answers are recorded as answers: a cut output is a failure record even when its text parses."""
    settings = warm_settings(settings_factory(), 4)
    reasons = {"'v1'": "length", "'v2'": "content_filter", "'v3'": None}  # vLLM leaves None for an unfinished sequence
    batches: list[int] = []

    def generate(conversations: Sequence[list[dict]], ending=lambda text: next((r for k, r in reasons.items() if k in text), "stop")):
        batches.append(len(conversations))
        return [(json.dumps({"error": "", "response": "offline answer"}), ending(c[-1]["content"])) for c in conversations]

    report, _ = warm_offline(settings, tmp_path, 4, generate, concurrency=1, model="m")
    assert report.total.new == 1 and report.total.failed == 3 and sum(batches) == 4
    assert all("Failed to generate fake response" in f.reason for f in report.failures)
    with DiskcacheStore(tmp_path / "store") as store:
        saved = list(store)
    assert sorted(r.reason for r in saved if r.is_failure) == [
        "simulated: simulator output incomplete (finish_reason content_filter)",
        "simulated: simulator output incomplete (finish_reason length)",
        "simulated: simulator output incomplete (no finish_reason)",
    ]
    assert [r.key for r in saved if not r.is_failure] == ["{'q': 'v0'}"]
    # the next run asks the three again (one prompt each) and records their complete answers
    reasons.clear()
    again, _ = warm_offline(settings, tmp_path, 4, generate, concurrency=1, model="m")
    assert again.total.failed == 0 and sum(batches) == 4 + 3
    with DiskcacheStore(tmp_path / "store") as store:
        assert len(list(store)) == 4 and not any(r.is_failure for r in store)


def test_batcher_serves_the_failure_answer_for_a_cut_output() -> None:
    from stabletoolbench_mirror.core import protocol
    from stabletoolbench_mirror.core.call import ToolCall

    batcher = BatchingSimulator(lambda call, examples: [{"role": "user", "content": "x"}],
                                lambda conversations: [('{"error": "", "response": "cut"', "length") for _ in conversations], origin="m")  # fmt: skip
    try:
        attempt = batcher.respond(ToolCall.of("C", "t", "a", {}), [])
    finally:
        batcher.close()
    assert attempt.answer is None and attempt.fallback == protocol.simulation_failed_answer()
    assert attempt.detail == "simulator output incomplete (finish_reason length)"
