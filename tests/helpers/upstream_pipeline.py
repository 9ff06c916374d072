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

How upstream is run, and its quirks worked around (upstream's files are never edited or copied):

* Its modules import torch, transformers, peft, sentence_transformers, pandas, psutil at the top, and
  tenacity, termcolor, backoff; the chatgpt_function path and the evaluation never use the heavy ones.
  A folder of stand-ins (written under the run's ``out_dir/standins``) goes first on ``sys.path``: an
  import hook answers the heavy modules with inert placeholders; ``termcolor.colored`` returns the text;
  ``tenacity.retry`` and ``backoff.on_exception`` retry on ``Exception`` up to their
  ``stop_after_attempt(n)`` (``backoff``: ``STM_BACKOFF_TRIES``, 3) without waiting.
* A small driver runs the script as ``python script.py`` would (its folder first on ``sys.path``, as
  ``from Tree.Tree import ...`` and ``from evaluators import ...`` need; ``toolbench`` importable).
* ``chat_completion_request`` drops into ``pdb.set_trace()`` on any model error: a stand-in ``pdb``
  ends the process at once with exit status :data:`PDB_EXIT` (``on_pdb="exit"``, the default), or
  returns as if ``c`` had been typed (``on_pdb="continue"``: upstream then retries ``parse`` 6 times);
  stdin is closed, ``PYTHONBREAKPOINT=0``, and every run has a timeout.  It also only accepts a
  ``--chatgpt_model`` starting with ``gpt`` (:func:`run_qa_pipeline` refuses others up front).
* ``rapidapi_wrapper._step`` sleeps 2 s before each tool call (a rate limit) and ``parse`` 15 s between
  retries: ``skip_sleeps=True`` (the default) makes ``time.sleep`` return at once in the subprocess.
* ``OpenaiPoolRequest`` adds a pool entry without ``api_base`` when ``OPENAI_KEY`` is set: every
  ``OPENAI_*`` variable (and ``API_POOL_FILE``, ``EVAL_MODEL``, ``SERVICE_URL``, proxies, ``STM_*``) is
  removed from the subprocess's environment; ``NO_PROXY`` covers 127.0.0.1.
* The reference folder is writable by root: ``PYTHONDONTWRITEBYTECODE=1`` keeps ``__pycache__`` out of it.
* ``qa_pipeline`` skips a query whose answer file exists and ``eval_pass_rate`` resumes from an existing
  label file without ``--overwrite``: use a fresh ``out_dir`` per run (``run_eval_pass_rate`` passes
  ``--overwrite``).
* ``eval_pass_rate`` takes its judge's sampling from the evaluator folder's ``config.yaml``
  (``tooleval_gpt-3.5-turbo_default``: ``temperature: 0.2``).  ``temperature=None`` runs upstream's
  folder as shipped; a number runs a copy of that evaluator's ``config.yaml`` (under ``out_dir``) with
  ``completions_kwargs.temperature`` replaced, the script's own code unchanged.
* With ``max_eval_threads`` above 1 the label file's key order follows completion order: compare
  :attr:`EvalRun.labels` (parsed) rather than bytes then.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
PDB_EXIT = 86
"""The exit status of a run that reached upstream's ``pdb.set_trace()`` (with ``on_pdb="exit"``)."""


class UpstreamFailed(RuntimeError):
    """An upstream script exited non-zero (``returncode``; ``log`` holds its output)."""

    def __init__(self, what: str, returncode: int, log: Path) -> None:
        why = " (it reached pdb.set_trace(): a model call failed)" if returncode == PDB_EXIT else ""
        super().__init__(f"{what} exited {returncode}{why}; last output:\n{_tail(log)}")
        self.returncode = returncode
        self.log = log


class UpstreamTimeout(RuntimeError):
    """An upstream script ran past its timeout and was killed."""


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
            (source / path.name).write_text(json.dumps(_drop_null_function_calls(data), ensure_ascii=False, indent=2), encoding="utf-8")
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


def _drop_null_function_calls(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _drop_null_function_calls(v) for k, v in data.items() if not (k == "function_call" and v is None)}
    if isinstance(data, list):
        return [_drop_null_function_calls(v) for v in data]
    return data


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


def _clean_env(extra: dict[str, str]) -> dict[str, str]:
    drop = {"API_POOL_FILE", "EVAL_MODEL", "SERVICE_URL", "PYTHONPATH", "PYTHONSTARTUP", "PYTHONHOME"}
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OPENAI_", "STM_")) and k not in drop and not k.lower().endswith("_proxy")
    }
    env.update({"NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost", "PYTHONBREAKPOINT": "0"})
    env.update({"PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1", "TQDM_DISABLE": "1", "PYTHONIOENCODING": "utf-8"})
    env.update(extra)
    return env


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
    if on_pdb not in ("exit", "continue"):
        raise ValueError("on_pdb is 'exit' or 'continue'")
    out_dir.mkdir(parents=True, exist_ok=True)
    standins = write_standins(out_dir / "standins")
    extra = {
        "STM_UPSTREAM_ON_PDB": on_pdb,
        "STM_UPSTREAM_SKIP_SLEEPS": "1" if skip_sleeps else "0",
        "STM_UPSTREAM_ROOT": str(UPSTREAM),
        **({"STM_UPSTREAM_FILE": str(as_file)} if as_file else {}),
        **(env or {}),
    }
    log = out_dir / f"{what}.log"
    started = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, str(standins / "stm_upstream_driver.py"), str(script), *args],
            cwd=out_dir, env=_clean_env(extra), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
        try:
            returncode = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise UpstreamTimeout(f"{what} ran past {timeout_s:g} s and was killed; last output:\n{_tail(log)}") from None
    seconds = time.monotonic() - started
    if check and returncode != 0:
        raise UpstreamFailed(what, returncode, log)
    return returncode, seconds, log


def _tail(log: Path, n: int = 4000) -> str:
    try:
        return log.read_text(encoding="utf-8", errors="replace")[-n:]
    except OSError:
        return ""


# -- the stand-ins -----------------------------------------------------------------------------------

_HEAVY = ("torch", "transformers", "peft", "sentence_transformers", "pandas", "psutil", "accelerate", "vllm")

STANDINS: dict[str, str] = {
    "stm_heavy_standins.py": f'''"""Inert placeholders for the heavy modules upstream imports at the top (unused on its API paths)."""
import importlib.abc
import importlib.machinery
import sys
import types

HEAVY = {_HEAVY!r}


class _Meta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Meta(name, (Placeholder,), {{}})


class Placeholder(metaclass=_Meta):
    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]  # used as a decorator: @torch.inference_mode()
        return self

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return Placeholder()


class _Module(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        value = _Meta(name, (Placeholder,), {{"__module__": self.__name__}})
        setattr(self, name, value)
        return value


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in HEAVY:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _Module(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def install():
    sys.meta_path.insert(0, _Finder())
''',
    "termcolor.py": '''"""Stand-in for termcolor: no colours."""


def colored(text, color=None, on_color=None, attrs=None, **kwargs):
    return str(text)


def cprint(text, color=None, on_color=None, attrs=None, **kwargs):
    print(colored(text), **{k: v for k, v in kwargs.items() if k in ("end", "sep", "file", "flush")})
''',
    "tenacity.py": '''"""Stand-in for tenacity: retry on Exception up to stop_after_attempt(n) attempts (3 without one), no waiting."""
import functools


class RetryError(Exception):
    pass


class stop_after_attempt:
    def __init__(self, attempts):
        self.attempts = attempts


def _wait(*args, **kwargs):
    return None


wait_random_exponential = wait_exponential = wait_fixed = wait_random = _wait


def retry(*dargs, stop=None, reraise=False, **kwargs):
    if len(dargs) == 1 and callable(dargs[0]) and stop is None and not kwargs:
        return retry()(dargs[0])
    attempts = stop.attempts if isinstance(stop, stop_after_attempt) else 3

    def decorate(fn):
        @functools.wraps(fn)
        def wrapped(*args, **kw):
            last = None
            for _ in range(attempts):
                try:
                    return fn(*args, **kw)
                except Exception as exc:  # noqa: BLE001 - as tenacity retries
                    last = exc
            if reraise:
                raise last
            raise RetryError(f"{fn.__name__} failed {attempts} times") from last
        return wrapped
    return decorate
''',
    "backoff.py": '''"""Stand-in for backoff: on_exception retries up to max_tries (STM_BACKOFF_TRIES, 3) times, no waiting."""
import functools
import os


def expo(*args, **kwargs):
    return None


constant = fibo = expo


def on_exception(wait_gen, exception, max_tries=None, max_time=None, **kwargs):
    tries = max_tries or int(os.environ.get("STM_BACKOFF_TRIES", "3"))

    def decorate(fn):
        @functools.wraps(fn)
        def wrapped(*args, **kw):
            for attempt in range(tries):
                try:
                    return fn(*args, **kw)
                except exception:
                    if attempt == tries - 1:
                        raise
        return wrapped
    return decorate
''',
    "pdb.py": f'''"""Stand-in for pdb: upstream calls pdb.set_trace() on a model error; a test must never wait on a debugger.

STM_UPSTREAM_ON_PDB=exit (default): end the process with status {PDB_EXIT}; continue: return (as if "c" was typed).
"""
import os
import sys
import traceback


def set_trace(*args, **kwargs):
    mode = os.environ.get("STM_UPSTREAM_ON_PDB", "exit")
    where = "".join(traceback.format_stack(limit=4)[:-1])
    print(f"[stand-in pdb] set_trace() reached ({{mode}}) at:\\n{{where}}", file=sys.stderr, flush=True)
    if mode != "continue":
        sys.stdout.flush()
        os._exit({PDB_EXIT})


def post_mortem(*args, **kwargs):
    set_trace()


def pm():
    set_trace()


class Pdb:
    def __init__(self, *args, **kwargs):
        pass

    def set_trace(self, *args, **kwargs):
        set_trace()
''',
    "stm_upstream_driver.py": '''"""Runs an upstream script as `python SCRIPT ARGS...` would, with the stand-ins of this folder.

STM_UPSTREAM_ROOT: the StableToolBench folder (so that `toolbench` imports); STM_UPSTREAM_FILE: the
__file__ the script sees (default: itself); STM_UPSTREAM_SKIP_SLEEPS=1: time.sleep returns at once.
"""
import os
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
script = os.path.abspath(sys.argv[1])
sys.path[:] = [os.path.dirname(script), here, os.environ["STM_UPSTREAM_ROOT"]] + [p for p in sys.path if p != here]

import stm_heavy_standins  # noqa: E402

stm_heavy_standins.install()
if os.environ.get("STM_UPSTREAM_SKIP_SLEEPS") == "1":
    time.sleep = lambda seconds: None
sys.argv = [script] + sys.argv[2:]
with open(script, encoding="utf-8") as source:
    code = compile(source.read(), script, "exec")
exec(code, {"__name__": "__main__", "__file__": os.environ.get("STM_UPSTREAM_FILE") or script, "__builtins__": __builtins__})
''',
}


def write_standins(folder: Path) -> Path:
    """Writes the stand-in modules and the driver into ``folder`` (idempotent); returns it."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in STANDINS.items():
        path = folder / name
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
    return folder
