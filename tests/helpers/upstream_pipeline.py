"""Runs StableToolBench's own agent and judge, unmodified, in subprocesses: ``qa_pipeline.py``,
``convert_to_answer_format.py`` and ``eval_pass_rate.py`` from ``../shared/reference/stabletoolbench``.

The three steps, each a function returning what it wrote::

    queries = prepare_queries(tmp / "q")                                  # 3 G1_instruction queries
    qa = run_qa_pipeline(agent_base, service_url, queries, tmp / "qa")    # agent via OpenAI(base_url=...)
    converted = convert_answers(qa.answer_dir, tmp / "converted")         # -> converted/stm_agent/G1_instruction.json
    ev = run_eval_pass_rate(judge_base, tmp / "converted", tmp / "eval")  # judge via API_POOL_FILE
    qa.answer_files, ev.label_files                                       # what to compare between runs

``agent_base`` / ``judge_base`` are OpenAI-style ``/v1`` URLs (``http://127.0.0.1:PORT/v1``: a stub of
``tests.helpers.model_stubs`` or the mirror's own ``/v1`` front); ``service_url`` is where the agent's
tool calls go (``SERVICE_URL``, e.g. the mirror's ``http://127.0.0.1:PORT/virtual``).  Each run raises
:class:`UpstreamFailed` on a non-zero exit (``check=False`` returns it instead) and
:class:`UpstreamTimeout` past ``timeout_s`` (its process group is killed), with the log's tail.

How upstream is run is the package's (:mod:`stabletoolbench_mirror.scoring.upstream_run`, the same code
``score`` runs it with): the cleaned environment, the driver, the stand-ins for the GPU modules
(``--stand-ins``; the light requirements are installed for real by the ``test`` extra), the pdb hook
(``on_pdb="exit"``, the default: exit status :data:`PDB_EXIT`; ``"continue"``: as if ``c`` was typed,
upstream then retries ``parse`` 6 times), upstream's own sleeps skipped (``skip_sleeps``), timeouts and
logs.  What this helper adds is the tests' own choice of queries and folders:

* ``chat_completion_request`` only accepts a ``--chatgpt_model`` starting with ``gpt``
  (:func:`run_qa_pipeline` refuses others up front).
* ``qa_pipeline`` skips a query whose answer file exists and ``eval_pass_rate`` resumes from an existing
  label file without ``--overwrite``: use a fresh ``out_dir`` per run (``run_eval_pass_rate`` passes
  ``--overwrite``).
* ``eval_pass_rate`` takes its judge's sampling from the evaluator folder's ``config.yaml``
  (``tooleval_gpt-3.5-turbo_default``: ``temperature: 0.2``).  ``temperature=None`` runs upstream's
  folder as shipped; a number runs a copy of that evaluator's ``config.yaml`` (under ``out_dir``) with
  ``completions_kwargs.temperature`` replaced, the script's own code unchanged (the script sees a
  ``__file__`` beside the copy).
* With ``max_eval_threads`` above 1 the label file's key order follows completion order: compare
  :attr:`EvalRun.labels` (parsed) rather than bytes then.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stabletoolbench_mirror.scoring.driver import PDB_EXIT
from stabletoolbench_mirror.scoring.session import drop_null_function_calls
from stabletoolbench_mirror.scoring.upstream_run import UpstreamFailed, UpstreamRunner, UpstreamTimeout
from tests.helpers.paths import REPO

REFERENCE = REPO.parent / "shared" / "reference"
"""``../shared/reference`` (read-only)."""
UPSTREAM = REFERENCE / "stabletoolbench"
"""StableToolBench's own code."""
TOOLS_DIR = REFERENCE / "toolenv" / "tools"
"""The tool docs ``qa_pipeline --tool_root_dir`` reads."""
QUERIES_DIR = REFERENCE / "solvable_queries"
FROZEN_CACHE = REFERENCE / "cache"
"""A frozen cache in upstream's ``tool_response_cache`` layout (query 1073's first call is in it)."""

QA_PIPELINE = UPSTREAM / "toolbench" / "inference" / "qa_pipeline.py"
CONVERT = UPSTREAM / "toolbench" / "tooleval" / "convert_to_answer_format.py"
EVAL_PASS_RATE = UPSTREAM / "toolbench" / "tooleval" / "eval_pass_rate.py"

DEFAULT_GROUP = "G1_instruction"
DEFAULT_QUERY_IDS = (1073, 608, 588)
"""Three G1_instruction queries whose tools are in ``toolenv/tools`` (Keyword Analysis, Kick.com API, TheClique)."""
DEFAULT_AGENT_MODEL = "gpt-3.5-turbo-16k-0613"
DEFAULT_REFERENCE_MODEL = "stm_agent"
DEFAULT_EVALUATOR = "tooleval_gpt-3.5-turbo_default"
__all__ = ["PDB_EXIT", "UpstreamFailed", "UpstreamTimeout"]


def upstream_available() -> bool:
    """Whether the reference copy of StableToolBench and its tools folder are there."""
    return QA_PIPELINE.is_file() and EVAL_PASS_RATE.is_file() and TOOLS_DIR.is_dir() and QUERIES_DIR.is_dir()


def skip_without_upstream() -> None:
    """``pytest.skip`` when the reference data is absent."""
    if not upstream_available():
        import pytest

        pytest.skip(f"StableToolBench reference copy not found at {UPSTREAM}")


# -- results -----------------------------------------------------------------------------------------


@dataclass
class QaRun:
    answer_dir: Path
    """``--output_answer_file``: one ``{query_id}_{method}.json`` per query."""
    answer_files: list[Path]
    """The answer files written, sorted by name."""
    log: Path
    returncode: int
    seconds: float

    def answers(self) -> dict[str, dict[str, Any]]:
        """Each answer file parsed, by file name."""
        return {p.name: json.loads(p.read_text(encoding="utf-8")) for p in self.answer_files}


@dataclass
class EvalRun:
    labels_json: Path
    """``{save_path}/{test_set}_{reference_model}.json``: per query, ``is_solved`` by evaluation (``"AnswerStatus.Solved"`` ...)."""
    labels_csv: Path
    """``{save_path}/{test_set}_{reference_model}.csv``, the same as a table."""
    log: Path
    returncode: int
    seconds: float
    solve_rate: float | None = None
    """The ``Solve rate: X%`` it printed (percent)."""
    std: float | None = None
    labels: dict[str, dict[str, str]] = field(default_factory=dict)
    """``{query_id: {evaluate_time: label}}`` read from ``labels_json``."""

    @property
    def label_files(self) -> list[Path]:
        return [self.labels_json, self.labels_csv]


# -- the three steps ---------------------------------------------------------------------------------


def prepare_queries(
    out_dir: Path, query_ids: tuple[int, ...] | list[int] = DEFAULT_QUERY_IDS, *, group: str = DEFAULT_GROUP, tools_dir: Path = TOOLS_DIR
) -> Path:
    """Writes ``out_dir/{group}.json``: those queries of ``solvable_queries/{group}.json``, in that order.

    Raises ``ValueError`` for an id not in the group or a query whose tools are not all in ``tools_dir``
    (upstream would skip it silently).
    """
    queries = {q["query_id"]: q for q in json.loads((QUERIES_DIR / f"{group}.json").read_text(encoding="utf-8"))}
    chosen = []
    for query_id in query_ids:
        if query_id not in queries:
            raise ValueError(f"query {query_id} is not in {group}")
        query = queries[query_id]
        for api in query["api_list"]:
            if not (tools_dir / api["category_name"]).is_dir():
                raise ValueError(f"query {query_id}: category {api['category_name']} not in {tools_dir}")
        chosen.append(query)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{group}.json"
    path.write_text(json.dumps(chosen, ensure_ascii=False, indent=2), encoding="utf-8")
    return path


def run_qa_pipeline(
    base_url: str,
    service_url: str,
    queries_file: Path,
    out_dir: Path,
    *,
    model: str = DEFAULT_AGENT_MODEL,
    method: str = "CoT@1",
    openai_key: str = "sk-stm-agent-key",
    toolbench_key: str = "",
    tools_dir: Path = TOOLS_DIR,
    timeout_s: float = 120.0,
    on_pdb: str = "exit",
    skip_sleeps: bool = True,
    env: dict[str, str] | None = None,
    check: bool = True,
) -> QaRun:
    """Runs upstream's ``qa_pipeline.py --backbone_model chatgpt_function`` over ``queries_file``.

    ``base_url``: the agent model's ``/v1`` URL (``--base_url``, the agent's ``OpenAI(base_url=...)``);
    ``service_url``: ``SERVICE_URL``, where each tool call is POSTed (e.g. ``http://127.0.0.1:P/virtual``).
    The answers go to ``out_dir/answers/{queries_file stem}/{query_id}_{method}.json`` (the stem names the
    test set for :func:`convert_answers`); the output to ``out_dir/qa_pipeline.log``.  ``model`` must
    start with ``gpt`` (upstream refuses others); ``openai_key`` is sent as ``Authorization: Bearer``.
    ``method``: ``CoT@1`` (two model calls per query with the agent stub) or e.g. ``DFS_woFilter_w2``.
    ``env``: extra variables.  Use a fresh ``out_dir``: upstream skips queries already answered.
    """
    if not model.startswith("gpt"):
        raise ValueError(f"upstream's chat_completion_request only accepts models starting with 'gpt', not {model!r}")
    answer_dir = out_dir / "answers" / Path(queries_file).stem
    answer_dir.parent.mkdir(parents=True, exist_ok=True)  # upstream's os.mkdir makes only the last folder
    args = [
        "--backbone_model", "chatgpt_function", "--chatgpt_model", model, "--base_url", base_url, "--openai_key", openai_key,
        "--tool_root_dir", str(tools_dir), "--method", method, "--input_query_file", str(queries_file),
        "--output_answer_file", str(answer_dir), "--toolbench_key", toolbench_key,
    ]
    extra = {"SERVICE_URL": service_url, **(env or {})}
    returncode, seconds, log = _run_upstream(
        "qa_pipeline", QA_PIPELINE, args, out_dir, timeout_s=timeout_s, on_pdb=on_pdb, skip_sleeps=skip_sleeps, env=extra, check=check
    )
    files = sorted(answer_dir.glob(f"*_{method}.json")) if answer_dir.is_dir() else []
    return QaRun(answer_dir, files, log, returncode, seconds)


def convert_answers(
    answer_dir: Path,
    converted_dir: Path,
    *,
    method: str = "CoT@1",
    reference_model: str = DEFAULT_REFERENCE_MODEL,
    test_set: str | None = None,
    drop_null_function_call: bool = True,
    timeout_s: float = 60.0,
) -> Path:
    """Runs upstream's ``convert_to_answer_format.py`` on ``answer_dir``; returns the file it wrote,
    ``converted_dir/{reference_model}/{test_set}.json`` (``test_set``: ``answer_dir``'s name), which is
    where :func:`run_eval_pass_rate` with ``answers_dir=converted_dir`` reads it.

    ``drop_null_function_call`` (default): the converter reads a copy of the answers
    (``converted_dir/answers_read/{test_set}``) without the ``"function_call": null`` keys of their
    messages; ``answer_dir`` is not touched.  The openai SDK's ``.dict()`` writes that key into every
    assistant message and ``chat_completion_request`` pops it only from messages it sends again, so
    the last one (the ``Finish`` call) keeps it, and upstream's ``process_valid_data`` takes any
    ``'function_call' in message`` for a legacy call and fails on ``None['name']``.
    """
    test_set = test_set or answer_dir.name
    output = converted_dir / reference_model / f"{test_set}.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    source = answer_dir
    if drop_null_function_call:
        source = converted_dir / "answers_read" / test_set
        source.mkdir(parents=True, exist_ok=True)
        for path in sorted(answer_dir.glob("*.json")):
            data = json.loads(path.read_text(encoding="utf-8"))
            (source / path.name).write_text(json.dumps(drop_null_function_calls(data), ensure_ascii=False, indent=2), encoding="utf-8")
    args = ["--answer_dir", str(source), "--method", method, "--output", str(output)]
    _run_upstream(f"convert_to_answer_format-{test_set}", CONVERT, args, converted_dir, timeout_s=timeout_s)
    return output


def run_eval_pass_rate(
    api_base: str,
    answers_dir: Path,
    out_dir: Path,
    *,
    evaluate_times: int = 4,
    max_eval_threads: int = 1,
    reference_model: str = DEFAULT_REFERENCE_MODEL,
    test_set: str = DEFAULT_GROUP,
    api_key: str = "sk-stm-judge-key",
    evaluator: str = DEFAULT_EVALUATOR,
    temperature: float | None = None,
    eval_model: str | None = None,
    test_ids: list[str] | None = None,
    timeout_s: float = 120.0,
    env: dict[str, str] | None = None,
    check: bool = True,
) -> EvalRun:
    """Runs upstream's ``eval_pass_rate.py`` (its ``OpenaiPoolRequest`` unchanged) with the judge at ``api_base``.

    ``api_base``: the judge's ``/v1`` URL, written with ``api_key`` into ``out_dir/api_pool.json``
    (``[{"api_key", "api_base"}]``, passed as ``API_POOL_FILE``).  ``answers_dir``: the
    ``--converted_answer_path`` folder holding ``{reference_model}/{test_set}.json``
    (:func:`convert_answers`' ``converted_dir``).  The test ids (default: every converted answer) go to
    ``out_dir/test_ids/{test_set}.json``; the labels to ``out_dir/labels/{test_set}_{reference_model}.json``
    and ``.csv`` (``--overwrite``); the output to ``out_dir/eval_pass_rate.log``.  ``evaluate_times``
    identical judge requests per answer; ``temperature``: see the module's notes (``None``: the
    evaluator's own, 0.2 for the default one); ``eval_model``: ``EVAL_MODEL``.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    converted = answers_dir / reference_model / f"{test_set}.json"
    if test_ids is None:
        test_ids = list(json.loads(converted.read_text(encoding="utf-8")))
    ids_dir = out_dir / "test_ids"
    ids_dir.mkdir(exist_ok=True)
    (ids_dir / f"{test_set}.json").write_text(json.dumps({str(i): [] for i in test_ids}), encoding="utf-8")
    pool = out_dir / "api_pool.json"
    pool.write_text(json.dumps([{"api_key": api_key, "api_base": api_base}]), encoding="utf-8")
    save = out_dir / "labels"
    save.mkdir(exist_ok=True)
    extra = {"API_POOL_FILE": str(pool), **({"EVAL_MODEL": eval_model} if eval_model else {}), **(env or {})}
    as_file = None
    if temperature is not None:
        as_file = _evaluator_copy(out_dir, evaluator, temperature)
    args = [
        "--converted_answer_path", str(answers_dir), "--save_path", str(save), "--reference_model", reference_model,
        "--test_ids", str(ids_dir), "--evaluator", evaluator, "--max_eval_threads", str(max_eval_threads),
        "--evaluate_times", str(evaluate_times), "--test_set", test_set, "--overwrite",
    ]
    returncode, seconds, log = _run_upstream(
        "eval_pass_rate", EVAL_PASS_RATE, args, out_dir, timeout_s=timeout_s, env=extra, check=check, as_file=as_file
    )
    run = EvalRun(save / f"{test_set}_{reference_model}.json", save / f"{test_set}_{reference_model}.csv", log, returncode, seconds)
    found = re.search(r"Solve rate: ([0-9.]+)% Std: ([0-9.]+)%", log.read_text(encoding="utf-8", errors="replace"))
    if found:
        run.solve_rate, run.std = float(found.group(1)), float(found.group(2))
    if run.labels_json.is_file():
        data = json.loads(run.labels_json.read_text(encoding="utf-8"))
        run.labels = {qid: dict(entry.get("is_solved", {})) for qid, entry in data.items()}
    return run


def file_bytes(paths: list[Path]) -> dict[str, bytes]:
    """``{file name: bytes}``, to compare two runs' answer or label files byte for byte."""
    return {p.name: p.read_bytes() for p in paths}


# -- running upstream --------------------------------------------------------------------------------


def _evaluator_copy(out_dir: Path, evaluator: str, temperature: float) -> Path:
    """An evaluators folder beside a stand-in ``__file__``: ``evaluator``'s config with another temperature."""
    import yaml

    source = EVAL_PASS_RATE.parent / "evaluators" / evaluator
    target = out_dir / "evaluators" / evaluator
    target.mkdir(parents=True, exist_ok=True)
    config = yaml.safe_load((source / "config.yaml").read_text(encoding="utf-8"))
    config["completions_kwargs"]["temperature"] = temperature
    (target / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    template = target / config["prompt_template"]
    if not template.exists():
        template.symlink_to(source / config["prompt_template"])
    return out_dir / "eval_pass_rate.py"  # abs_dir = its folder: only the evaluators' configs are read from there


def _run_upstream(
    what: str,
    script: Path,
    args: list[str],
    out_dir: Path,
    *,
    timeout_s: float,
    on_pdb: str = "exit",
    skip_sleeps: bool = True,
    env: dict[str, str] | None = None,
    check: bool = True,
    as_file: Path | None = None,
) -> tuple[int, float, Path]:
    """One upstream script through the package's runner (stand-ins for the GPU modules, in ``out_dir``)."""
    if on_pdb not in ("exit", "continue"):
        raise ValueError("on_pdb is 'exit' or 'continue'")
    runner = UpstreamRunner(UPSTREAM, stand_ins=True, skip_sleeps=skip_sleeps, on_pdb=on_pdb, timeout_s=timeout_s)
    done = runner.run(what, script, args, out_dir / f"{what}.log", cwd=out_dir, env=env, script_file=as_file, check=check)
    return done.returncode, done.seconds, done.log
