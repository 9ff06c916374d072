"""StableToolBench's own agent (``qa_pipeline.py``) and judge (``eval_pass_rate.py``) run against the model
stubs directly (no recording front): the harness of ``tests/helpers/upstream_pipeline.py`` and
``tests/helpers/model_stubs.py`` on its own.  The agent's tool calls go to the mirror (replay, the
reference frozen cache).  Skips without ``../shared/reference``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai
import pytest

from stabletoolbench_mirror.serving.server import create_app, uvicorn_options
from tests.conftest import make_settings
from tests.helpers.live import UvicornThread
from tests.helpers.model_stubs import AgentStub, JudgeStub
from tests.helpers.upstream_pipeline import (
    DEFAULT_QUERY_IDS,
    FROZEN_CACHE,
    PDB_EXIT,
    TOOLS_DIR,
    convert_answers,
    file_bytes,
    prepare_queries,
    run_eval_pass_rate,
    run_qa_pipeline,
    upstream_available,
)

pytestmark = pytest.mark.skipif(not upstream_available(), reason="StableToolBench reference copy not found at ../shared/reference")


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("upstream")


@pytest.fixture(scope="module")
def mirror(work: Path):
    (work / "mirror").mkdir()
    settings = make_settings(work / "mirror", mode="replay", frozen_caches=[str(FROZEN_CACHE)], tools_folder=str(TOOLS_DIR))
    with UvicornThread(create_app(settings), **uvicorn_options(settings)) as server:
        yield server


@pytest.fixture(scope="module")
def agent():
    with AgentStub() as stub:
        yield stub


@pytest.fixture(scope="module")
def queries(work: Path) -> Path:
    return prepare_queries(work / "queries")


@pytest.fixture(scope="module")
def qa_run(agent: AgentStub, mirror: UvicornThread, queries: Path, work: Path):
    agent.reset_counts()
    return run_qa_pipeline(agent.api_base, mirror.url + "/virtual", queries, work / "qa1", timeout_s=90)


@pytest.fixture(scope="module")
def converted(qa_run, work: Path) -> Path:
    convert_answers(qa_run.answer_dir, work / "converted")
    return work / "converted"


def test_qa_pipeline_runs_through_the_agent_and_the_mirror(qa_run, agent: AgentStub) -> None:
    assert [p.name for p in qa_run.answer_files] == sorted(f"{q}_CoT@1.json" for q in DEFAULT_QUERY_IDS)
    assert agent.count == 2 * len(DEFAULT_QUERY_IDS)  # a tool call, then Finish
    for body, headers in zip(agent.requests, agent.headers):
        assert body["model"] == "gpt-3.5-turbo-16k-0613" and headers["authorization"] == "Bearer sk-stm-agent-key"
        assert "Finish" in [t["function"]["name"] for t in body["tools"]]
    for name, data in qa_run.answers().items():
        generation = data["answer_generation"]
        assert generation["valid_data"] is True and "give_answer" in generation["final_answer"], name
    # query 1073's call is in the frozen cache: the agent saw the recorded answer, through the mirror
    recorded = json.loads((FROZEN_CACHE / "Data/keyword_analysis_for_Data/popularsitesforquery.json").read_text())
    messages = qa_run.answers()["1073_CoT@1.json"]["answer_generation"]["train_messages"][-1]
    tool = next(m for m in messages if m["role"] == "tool")
    assert json.loads(tool["content"]) == recorded[str({"q": "birthday party ideas"})]


def test_the_same_agent_writes_the_same_answer_files_byte_for_byte(qa_run, agent: AgentStub, mirror: UvicornThread, queries, work) -> None:
    again = run_qa_pipeline(agent.api_base, mirror.url + "/virtual", queries, work / "qa2", timeout_s=90)
    assert file_bytes(again.answer_files) == file_bytes(qa_run.answer_files)


def test_eval_pass_rate_at_temperature_zero_gives_identical_label_files(converted: Path, tmp_path: Path) -> None:
    with JudgeStub(seed=3) as judge:
        first = run_eval_pass_rate(judge.api_base, converted, tmp_path / "e1", evaluate_times=4, temperature=0)
        second = run_eval_pass_rate(judge.api_base, converted, tmp_path / "e2", evaluate_times=4, temperature=0)
    assert judge.count == 2 * 4 * len(DEFAULT_QUERY_IDS)
    assert {b["temperature"] for b in judge.requests} == {0}
    assert {b["tool_choice"]["function"]["name"] for b in judge.requests} == {"check_answer_status"}
    assert {h["authorization"] for h in judge.headers} == {"Bearer sk-stm-judge-key"}
    assert sorted(first.labels) == sorted(str(q) for q in DEFAULT_QUERY_IDS)
    assert all(len(v) == 4 and len(set(v.values())) == 1 for v in first.labels.values())  # the same label, 4 times
    assert file_bytes(first.label_files) == file_bytes(second.label_files)
    assert first.solve_rate == second.solve_rate is not None


def test_a_random_judge_above_temperature_zero_gives_different_label_files(converted: Path, tmp_path: Path) -> None:
    with JudgeStub(seed=7) as judge:  # upstream's default evaluator as shipped: temperature 0.2
        first = run_eval_pass_rate(judge.api_base, converted, tmp_path / "e1", evaluate_times=4)
        second = run_eval_pass_rate(judge.api_base, converted, tmp_path / "e2", evaluate_times=4)
    assert {b["temperature"] for b in judge.requests} == {0.2}
    assert judge.count == 2 * 4 * len(DEFAULT_QUERY_IDS)
    assert set(judge.labels) == {"Solved", "Unsolved"}
    assert first.labels != second.labels
    assert file_bytes(first.label_files) != file_bytes(second.label_files)


def test_a_failing_agent_ends_the_run_instead_of_waiting_in_pdb(mirror: UvicornThread, work: Path) -> None:
    one = prepare_queries(work / "one", [1073])
    with AgentStub() as failing:
        failing.fail(500, retry_after=0.01)  # the openai SDK's own retries wait this long, not its backoff
        run = run_qa_pipeline(failing.api_base, mirror.url + "/virtual", one, work / "fail-exit", timeout_s=60, check=False)
        assert run.returncode == PDB_EXIT and run.answer_files == []
        assert "[stabletoolbench-mirror] upstream reached pdb.set_trace()" in run.log.read_text()
        assert failing.count == 3  # the openai SDK's own two retries
        failing.reset_counts()
        # as if "c" was typed at the prompt: upstream retries parse 6 times, then gives the query up
        run = run_qa_pipeline(failing.api_base, mirror.url + "/virtual", one, work / "fail-continue", timeout_s=60, on_pdb="continue")
    assert failing.count == 6 * 3
    assert run.answers()["1073_CoT@1.json"]["answer_generation"]["valid_data"] is False


def test_the_stubs_speak_openai_json_and_streams(agent: AgentStub) -> None:
    client = openai.OpenAI(base_url=agent.api_base, api_key="sk-stream", max_retries=0)
    tools: list[Any] = [{"type": "function", "function": {"name": "lookup_for_demo", "parameters": {
        "type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}}]
    messages: list[Any] = [{"role": "user", "content": "Find 'red shoes' please"}]
    plain = client.chat.completions.create(model="gpt-x", messages=messages, tools=tools, tool_choice="auto")
    assert plain.system_fingerprint and plain.usage and plain.usage.total_tokens > 0
    assert plain.choices[0].finish_reason == "tool_calls"
    call = plain.choices[0].message.tool_calls[0]
    assert call.function.name == "lookup_for_demo" and json.loads(call.function.arguments) == {"q": "red shoes"}
    stream = client.chat.completions.create(
        model="gpt-x", messages=messages, tools=tools, stream=True, stream_options={"include_usage": True}
    )
    arguments, ids, finish, usage = "", set(), None, None
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for delta in choice.delta.tool_calls or []:
                ids |= {delta.id} if delta.id else set()
                arguments += delta.function.arguments or ""
    assert (ids, arguments, finish) == ({call.id}, call.function.arguments, "tool_calls") and usage is not None
    answered = client.chat.completions.create(model="gpt-x", messages=messages, tools=tools, tool_choice="none")
    assert answered.choices[0].message.content.startswith("Answer to:") and answered.choices[0].finish_reason == "stop"

    with JudgeStub(seed=1, echo_key=True) as judge:
        judged = openai.OpenAI(base_url=judge.api_base, api_key="sk-secret-123", max_retries=0)
        check: Any = {"type": "function", "function": {"name": "check_answer_status", "parameters": {"type": "object", "properties": {}}}}
        forced: Any = {"type": "function", "function": {"name": "check_answer_status"}}

        def label(temperature: float) -> str:
            res = judged.chat.completions.create(model="gpt-3.5-turbo-16k", messages=messages, tools=[check], tool_choice=forced,
                                                 temperature=temperature)
            assert "Bearer sk-secret-123" in res.choices[0].message.content  # echo_key
            return json.loads(res.choices[0].message.tool_calls[0].function.arguments)["answer_status"]

        assert len({label(0) for _ in range(5)}) == 1
        assert len({label(1.0) for _ in range(12)}) == 2
        judge.fail(429, times=1, retry_after=0.1, message="slow down")
        with pytest.raises(openai.RateLimitError, match="slow down"):
            label(0)
        assert label(0) in ("Solved", "Unsolved") and judge.failed == 1

