"""A score bundle made from a real run, laid out as ``stabletoolbench-mirror score`` lays one out.

``scoring/bundle.py``'s docstring is the contract.  :func:`build_bundle` runs, through a real server
(``serve``'s app on 127.0.0.1, ``record`` mode, its own diskcache store):

1. ``cache import`` of the demo frozen tree into the store first, so that tool answers come from two
   sources (``imported`` and ``simulated``);
2. per query, the agent's conversation as ``qa_pipeline --backbone_model chatgpt_function`` has it: a chat
   completion offered the tool and ``Finish`` (the :class:`~tests.helpers.model_stubs.AgentStub` calls the
   tool), the tool call through ``POST /virtual`` (a miss answered by the simulator, an OpenAI-compatible
   stub, or an imported answer), a second completion with the tool's answer (``Finish``); the answer file
   in ``qa_pipeline``'s shape and the converted answers in ``convert_to_answer_format``'s;
3. per query, the judge asked ``evaluate_times`` identical requests (upstream's ``check_answer_status``
   function forced, ``temperature`` 0.2): the :class:`~tests.helpers.model_stubs.JudgeStub` answers each
   occurrence with the label the test planned for it, and the server records each occurrence;
4. the label files written from the judge's answers in ``eval_pass_rate``'s format (``.json`` with
   ``indent=4``, per query ``query``, ``tool_names``, ``answer_steps``, ``final_step``, ``is_solved``
   ``{"0": "AnswerStatus.Solved", ...}``; the ``.csv`` tab-separated), ``score.json`` with
   :func:`stabletoolbench_mirror.scoring.score.pass_rate` (``evaluated=False``: none);
5. the store snapshotted by the ``snapshot`` command into ``records/``; ``run.json``; then
   :func:`stabletoolbench_mirror.scoring.bundle.seal`.

What the clients saw (each completion's ``usage``, the tool answers' sources, the labels) comes back in
:class:`Built`, for tests to compare a report with.
"""

from __future__ import annotations

import csv
import json
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from stabletoolbench_mirror.commands.cli import main as cli
from stabletoolbench_mirror.scoring import bundle
from stabletoolbench_mirror.scoring.score import pass_rate
from stabletoolbench_mirror.serving.server import create_app, uvicorn_options
from tests.conftest import make_settings
from tests.helpers.live import UvicornThread
from tests.helpers.model_stubs import AgentStub, JudgeStub
from tests.helpers.openai_stub import OpenAIStub
from tests.helpers.paths import REPO

DEMO = REPO / "cache"
AGENT_MODEL = "gpt-3.5-turbo-16k-0613"
JUDGE_MODEL = "gpt-4o-mini-judge"
METHOD = "CoT@1"
EVALUATOR = "tooleval_gpt-3.5-turbo_default"
#: the StableToolBench commit ../shared/reference/stabletoolbench was copied from (its SOURCE.md)
STABLETOOLBENCH_COMMIT = "aa4ed9f"
WEATHER_FUNCTION = {
    "name": "current_weather_for_demo_weather", "description": "Current conditions for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name.", "example_value": "Paris"}},
                   "required": ["city"]},
}
FINISH_FUNCTION = {
    "name": "Finish", "description": "If you believe that you have obtained a result that can answer the task, call this function.",
    "parameters": {"type": "object", "properties": {"return_type": {"type": "string", "enum": ["give_answer", "give_up_and_restart"]},
                                                    "final_answer": {"type": "string"}}, "required": ["return_type"]},
}
CHECK_ANSWER_STATUS = {
    "name": "check_answer_status", "description": "Parse the json answer with layerd nodes and return the answer_status about the answer",
    "parameters": {"type": "object", "properties": {"answer_status": {"type": "string", "enum": ["Unsure", "Unsolved", "Solved"]},
                                                    "reason": {"type": "string"}}, "required": ["answer_status"]},
}


@dataclass
class Query:
    """One query of the run: the city its tool call asks about, and the judge's label of each evaluation."""

    city: str
    labels: list[str]
    """``Solved``, ``Unsolved`` or ``Unsure``, one per evaluation."""
    text: str = ""
    """The query (set by :func:`build_bundle`: it names the query's id, so that no two are one request)."""


@dataclass
class Built:
    """A bundle built, and what its run's clients saw."""

    root: Path
    groups: dict[str, dict[str, Query]]
    evaluate_times: int
    store: Path
    """The run's diskcache store (beside ``root``, in ``.<name>-work/``): what ``records/`` is a snapshot of."""
    usage: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    """Per model: ``calls``, ``prompt_tokens``, ``completion_tokens`` of the completions served."""
    tool_outcomes: Counter[str] = field(default_factory=Counter)
    """The ``X-STM-Outcome`` of each ``/virtual`` call."""
    simulator_prompt: dict[str, Any] = field(default_factory=dict)
    labels: dict[str, dict[str, dict[str, str]]] = field(default_factory=dict)
    """``{group: {query_id: {evaluate_time: "AnswerStatus.X"}}}`` as the label files hold them."""


def default_groups() -> dict[str, dict[str, Query]]:
    """Two groups, five queries: Paris answered by the imported cache, the other cities by the simulator."""
    return {
        "G1_instruction": {
            "1": Query("Paris", ["Solved"] * 4),
            "2": Query("Lyon", ["Unsolved"] * 4),
            "3": Query("Oslo", ["Solved", "Unsure", "Unsolved", "Unsolved"]),
        },
        "G1_category": {
            "10": Query("Rome", ["Solved", "Solved", "Solved", "Unsolved"]),
            "11": Query("Paris", ["Unsure"] * 4),
        },
    }


def _planned_judge(groups: dict[str, dict[str, Query]]) -> JudgeStub:
    """A judge that gives each query's evaluations their planned labels, in order (one label per occurrence)."""
    plan = {q.text: list(q.labels) for queries in groups.values() for q in queries.values()}
    asked: Counter[str] = Counter()

    def label(body: dict[str, Any]) -> str:
        text = str(body["messages"][-1]["content"])
        query = next(q for q in plan if q in text)
        n = asked[query]
        asked[query] += 1
        return plan[query][n]

    return JudgeStub(model=JUDGE_MODEL, random_above_zero=False, label_at_zero=label)


@contextmanager
def _server(folder: Path, agent: AgentStub, judge: JudgeStub, simulator: OpenAIStub) -> Iterator[UvicornThread]:
    upstreams = [{"base_url": agent.api_base, "models": [AGENT_MODEL]}, {"base_url": judge.api_base, "models": [JUDGE_MODEL]}]
    settings = make_settings(folder, mode="record", tools_folder=str(DEMO / "tools"), llm={"upstreams": upstreams},
                             simulator={"enabled": True, "api_base": simulator.api_base, "model": "MirrorAPI", "max_retries": 0})
    with UvicornThread(create_app(settings), **uvicorn_options(settings)) as server:
        yield server


class _Run:
    """The clients of one run: the agent's conversations, the tool calls, the judge's evaluations."""

    def __init__(self, server: UvicornThread, built: Built) -> None:
        self.url, self.built = server.url, built
        self.http = requests.Session()

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        reply = self.http.post(self.url + "/v1/chat/completions", json=body, timeout=30)
        assert reply.status_code == 200, reply.text
        completion = reply.json()
        counted = self.built.usage[body["model"]]
        counted["calls"] += 1
        counted["prompt_tokens"] += completion["usage"]["prompt_tokens"]
        counted["completion_tokens"] += completion["usage"]["completion_tokens"]
        return completion

    def agent(self, query: Query) -> dict[str, Any]:
        """The agent's conversation; its answer file's ``answer_generation``."""
        tools = [{"type": "function", "function": f} for f in (WEATHER_FUNCTION, FINISH_FUNCTION)]
        messages: list[dict[str, Any]] = [{"role": "system", "content": "You are AutoGPT, you can use many tools to do the task."},
                                          {"role": "user", "content": f"\n{query.text}\nBegin!\n"}]
        first = self.complete({"model": AGENT_MODEL, "messages": messages, "tools": tools})["choices"][0]["message"]
        call = first["tool_calls"][0]
        payload = {"category": "Weather", "tool_name": "Demo Weather", "api_name": "Current Weather",
                   "tool_input": call["function"]["arguments"], "strip": "truncate", "toolbench_key": ""}
        answered = self.http.post(self.url + "/virtual", json=payload, timeout=30)
        assert answered.status_code == 200, answered.text
        self.built.tool_outcomes[answered.headers["X-STM-Outcome"]] += 1
        messages += [first, {"role": "tool", "tool_call_id": call["id"], "name": call["function"]["name"], "content": answered.text}]
        last = self.complete({"model": AGENT_MODEL, "messages": messages, "tools": tools})["choices"][0]["message"]
        final = json.loads(last["tool_calls"][0]["function"]["arguments"])["final_answer"]
        return {"valid_data": True, "query": query.text, "final_answer": final, "finish_type": "give_answer",
                "function": [WEATHER_FUNCTION, FINISH_FUNCTION], "train_messages": [[*messages, last]]}

    def judge(self, query: Query, final_answer: str, times: int) -> dict[str, str]:
        """``times`` identical requests, as ``eval_pass_rate`` sends them; ``{evaluate_time: "AnswerStatus.X"}``."""
        body = {"model": JUDGE_MODEL, "temperature": 0.2,
                "messages": [{"role": "user", "content": f"Query: {query.text}\nAnswer: {final_answer}\nGive the answer status."}],
                "tools": [{"type": "function", "function": CHECK_ANSWER_STATUS}],
                "tool_choice": {"type": "function", "function": {"name": "check_answer_status"}}}
        labels = {}
        for time in range(times):
            message = self.complete(body)["choices"][0]["message"]
            status = json.loads(message["tool_calls"][0]["function"]["arguments"])["answer_status"]
            labels[str(time)] = f"AnswerStatus.{status}"
        return labels


def _write_json(path: Path, data: Any, indent: int = 2) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, ensure_ascii=False, indent=indent), encoding="utf-8")


def _label_files(root: Path, label: str, group: str, rows: dict[str, dict[str, Any]]) -> None:
    """``eval_pass_rate``'s two files: the JSON (``indent=4``) and the tab-separated table."""
    json_path, csv_path = (root / p for p in bundle.pass_rate_files(label, group))
    _write_json(json_path, rows, indent=4)
    with open(csv_path, "w", newline="") as handle:
        writer = csv.writer(handle, delimiter="\t")
        writer.writerow(["query", "available_tools", "model_intermediate_steps", "model_final_step", "model", "query_id", "is_solved"])
        for qid, row in rows.items():
            writer.writerow([row["query"], row["tool_names"], row["answer_steps"], row["final_step"], label, qid, row["is_solved"]])


def _score(built: Built) -> dict[str, Any]:
    rates = {group: pass_rate(labels, built.evaluate_times) for group, labels in built.labels.items()}
    return {
        "pass_rate": {g: {"solve_rate": r.solve_rate, "std": r.std, "per_evaluation": r.per_evaluation, "queries": r.queries}
                      for g, r in rates.items()},
        "pass_rate_average": statistics.fmean(r.solve_rate for r in rates.values()),
        "win_rate": {}, "win_rate_average": None,
        "labels": {g: {q: {"evaluations": ev, "solved": sum(v == "AnswerStatus.Solved" for v in ev.values()) * 2 > len(ev)}
                       for q, ev in labels.items()} for g, labels in built.labels.items()},
    }


def build_bundle(root: Path, *, groups: dict[str, dict[str, Query]] | None = None, evaluate_times: int = 4, label: str = "stm_agent",
                 evaluated: bool = True) -> Built:
    """A sealed bundle at ``root`` (a new folder) of a real run of ``groups`` (:func:`default_groups`); see the module docstring."""
    groups = groups or default_groups()
    for queries in groups.values():
        for qid, query in queries.items():
            query.text = f"Query {qid}: what is the weather in '{query.city}' right now?"
    work = root.parent / f".{root.name}-work"
    work.mkdir(parents=True)
    store = work / "store"
    built = Built(root, groups, evaluate_times, store)
    assert cli(["cache", "import", str(DEMO / "frozen"), "--store-path", str(store), "-q"]) == 0
    with AgentStub(model=AGENT_MODEL) as agent, _planned_judge(groups) as judge, OpenAIStub() as simulator:
        with _server(work, agent, judge, simulator) as server:
            run = _Run(server, built)
            built.simulator_prompt = requests.get(server.url + "/health", timeout=10).json()["simulator_prompt"]
            for group, queries in groups.items():
                converted, rows = {}, {}
                for qid, query in queries.items():
                    answer = run.agent(query)
                    _write_json(root / bundle.answers_dir(group) / f"{qid}_{METHOD}.json", {"answer_generation": answer})
                    converted[qid] = {"query": query.text, "available_tools": answer["function"],
                                      "answer": {"method": METHOD, "total_steps": 2, "final_answer": answer["final_answer"]}}
                    evaluations = run.judge(query, answer["final_answer"], evaluate_times)
                    rows[qid] = {"query": query.text, "tool_names": [f["name"] for f in answer["function"]],
                                 "answer_steps": "current_weather_for_demo_weather", "final_step": "{'name': 'Finish'}",
                                 "is_solved": evaluations}
                    built.labels.setdefault(group, {})[qid] = evaluations
                _write_json(root / bundle.QUERIES_DIR / f"{group}.json", [{"query_id": int(q), "query": v.text} for q, v in queries.items()])
                _write_json(root / bundle.TEST_IDS_DIR / f"{group}.json", {q: 1 for q in queries})
                _write_json(root / bundle.converted_file(label, group), converted)
                _label_files(root, label, group, rows)
    assert cli(["snapshot", str(root / bundle.RECORDS_DIR), "--store-path", str(store), "-q"]) == 0
    records_hash = json.loads((root / bundle.RECORDS_DIR / "manifest.json").read_text())["content_hash"]
    _write_json(root / bundle.RUN_FILE, {
        "label": label, "groups": list(groups), "method": METHOD, "backbone": "chatgpt_function", "agent_model": AGENT_MODEL,
        "judge_model": JUDGE_MODEL, "evaluator": EVALUATOR, "evaluate_times": evaluate_times, "limit": None, "reference": None,
        "stabletoolbench": {"commit": STABLETOOLBENCH_COMMIT, "dirty": False},
        "environment": {"records_hash": records_hash, "frozen_caches": [],
                        "simulator": {"model": "MirrorAPI", "style": built.simulator_prompt["style"],
                                      "prompt_sha256": built.simulator_prompt["sha256"]}},
        "commands": [{"phase": "inference", "group": g, "argv": ["qa_pipeline.py", "--method", METHOD], "env": {}} for g in groups],
    })
    if evaluated:
        _write_json(root / bundle.SCORE_FILE, _score(built))
    (root / bundle.LOGS_DIR).mkdir(exist_ok=True)
    (root / bundle.LOGS_DIR / "run.log").write_text("built by tests/helpers/bundles.py\n", encoding="utf-8")
    bundle.seal(root)
    return built
