"""A whole StableToolBench run through the server, then replayed from its snapshot with no agent model and no judge.

StableToolBench's own ``qa_pipeline`` (the agent at ``--base_url <server>/v1``, the tools at
``SERVICE_URL=<server>/virtual``) and ``eval_pass_rate`` (the judge through ``API_POOL_FILE``'s
``api_base``, its ``OpenaiPoolRequest`` unchanged) run in record mode against small OpenAI-compatible
servers on 127.0.0.1; the store is snapshotted; the stubs are stopped; a fresh server replays the
snapshot: the answer files are byte-identical and the pass-rate label files identical.  The judge
answers at random at temperature 0.2 (upstream's evaluator), so two direct evaluations differ while
two replays of the recorded one agree.  Skips without ``../shared/reference``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stabletoolbench_mirror.commands.cli import main as cli
from stabletoolbench_mirror.serving.server import create_app, uvicorn_options
from tests.conftest import make_settings
from tests.helpers.live import UvicornThread
from tests.helpers.model_stubs import AgentStub, JudgeStub
from tests.helpers.upstream_pipeline import (
    FROZEN_CACHE,
    TOOLS_DIR,
    convert_answers,
    file_bytes,
    prepare_queries,
    run_eval_pass_rate,
    run_qa_pipeline,
    upstream_available,
)

pytestmark = pytest.mark.skipif(not upstream_available(), reason="StableToolBench reference copy not found at ../shared/reference")

AGENT_MODEL, JUDGE_MODEL = "gpt-3.5-turbo-16k-0613", "gpt-3.5-turbo-16k"


def serve(folder: Path, **settings: Any) -> UvicornThread:
    folder.mkdir(parents=True, exist_ok=True)
    config = make_settings(folder, tools_folder=str(TOOLS_DIR), **settings)
    return UvicornThread(create_app(config), **uvicorn_options(config))


def one_run(server: UvicornThread, queries: Path, out: Path) -> tuple[dict[str, bytes], dict[str, bytes], Any]:
    """The agent, the converter and the judge, as a user runs them, all through ``server``."""
    qa = run_qa_pipeline(server.url + "/v1", server.url + "/virtual", queries, out / "answers", timeout_s=120)
    converted = convert_answers(qa.answer_dir, out / "converted")
    assert converted.exists()
    evaluation = run_eval_pass_rate(server.url + "/v1", out / "converted", out / "pass_rate", evaluate_times=4,
                                    max_eval_threads=1, timeout_s=120)
    return file_bytes(qa.answer_files), file_bytes(evaluation.label_files), evaluation


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("score")


@pytest.fixture(scope="module")
def recorded(work: Path) -> Iterator[dict[str, Any]]:
    """The record run: agent and judge stubs behind the server; then its snapshot."""
    queries = prepare_queries(work / "queries")
    with AgentStub() as agent, JudgeStub(seed=7) as judge:
        upstreams = [{"base_url": agent.api_base, "models": [AGENT_MODEL]}, {"base_url": judge.api_base, "models": [JUDGE_MODEL]}]
        with serve(work / "record", mode="record", frozen_caches=[str(FROZEN_CACHE)], llm={"upstreams": upstreams}) as server:
            answers, labels, evaluation = one_run(server, queries, work / "run1")
        asked = {"agent": agent.count, "judge": judge.count}
    assert cli(["snapshot", str(work / "snapshot"), "--store", str(work / "record" / "store")]) == 0
    yield {"queries": queries, "answers": answers, "labels": labels, "evaluation": evaluation, "asked": asked}


def replay(work: Path, name: str) -> UvicornThread:
    """A fresh server on an empty store, the snapshot (and the reference cache) frozen, no upstream, no key."""
    return serve(work / name, mode="replay", frozen_caches=[str(work / "snapshot"), str(FROZEN_CACHE)])


def test_the_record_run_asked_the_agent_and_the_judge(recorded: dict[str, Any]) -> None:
    assert recorded["asked"]["agent"] >= 6 and recorded["asked"]["judge"] >= 12  # 3 queries; 4 evaluations each
    assert recorded["answers"] and recorded["labels"]
    assert len(recorded["evaluation"].labels) == 3


def test_a_replay_from_the_snapshot_gives_the_same_answer_files_and_labels(recorded: dict[str, Any], work: Path) -> None:
    with replay(work, "replay1") as server:
        answers, labels, evaluation = one_run(server, recorded["queries"], work / "run2")
    assert answers == recorded["answers"]  # byte for byte
    assert labels == recorded["labels"]
    assert evaluation.solve_rate == recorded["evaluation"].solve_rate


def test_a_random_judge_moves_the_score_live_but_not_replayed(recorded: dict[str, Any], work: Path) -> None:
    converted = work / "run1" / "converted"
    # live: the judge at temperature 0.2 labels the same answers differently from one evaluation to the next
    with JudgeStub(seed=11) as judge:
        first = run_eval_pass_rate(judge.api_base, converted, work / "live1", evaluate_times=4, timeout_s=120)
        second = run_eval_pass_rate(judge.api_base, converted, work / "live2", evaluate_times=4, timeout_s=120)
    assert first.labels != second.labels
    # replayed: each start of the server is a new run, and every evaluation gets the recorded labels
    replayed = []
    for name in ("replay2", "replay3"):
        with replay(work, name) as server:
            replayed.append(run_eval_pass_rate(server.url + "/v1", converted, work / f"{name}-eval", evaluate_times=4,
                                               timeout_s=120))
    assert replayed[0].labels == replayed[1].labels == recorded["evaluation"].labels
    assert replayed[0].solve_rate == replayed[1].solve_rate == recorded["evaluation"].solve_rate
    assert file_bytes(replayed[0].label_files) == file_bytes(replayed[1].label_files) == recorded["labels"]
