"""A score run's phases, the server they go through, and resume.

One run is, per group, StableToolBench's own

1. ``infer``: ``qa_pipeline`` (or ``qa_pipeline_multithread``) over the group's queries, the agent at
   ``--base_url http://127.0.0.1:P/run/<run>/v1`` and the tools at ``SERVICE_URL=http://127.0.0.1:P/virtual``;
2. ``convert``: ``convert_to_answer_format`` over the answer files (read from a copy without the
   ``"function_call": null`` keys the openai SDK writes, on which upstream's converter fails; the answer
   files themselves are left as upstream wrote them);
3. ``pass_rate``: ``eval_pass_rate``, the judge through ``API_POOL_FILE`` naming ``.../run/<run>/v1``, one
   evaluation thread (threads take the recorded answers of identical requests in any order);
4. ``preference`` (with a reference run): ``eval_preference`` against the reference's converted answers and
   label files, one thread, the ``random`` stream seeded (``STM_SEED``, ``PYTHONHASHSEED``): its tie-breaks
   and the order it shows the judge the two answers come from that stream.

Every phase is a model-call run of its own (``<label>.<run id>.<phase>.<group>.<attempt>``, named in the URL;
the run id is new for each work folder and kept in ``state.json`` and ``run.json``), so identical requests
are numbered from 1 in each evaluation, and neither a second evaluation nor a second record run of the same
label on the same store meets the first's occurrence counters.  ``state.json`` in the work folder lists the phases done; the same command resumes after
Ctrl-C or a failure.  A phase not done is run again from its start, in a new run: what it was answered
before comes back from the records (no model call is paid twice), and its files come out as an
uninterrupted run writes them (upstream's ``DFS`` and ``toolllama_vllm`` draw from ``random`` per query,
so skipping answered queries could change the later ones).
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

from stabletoolbench_mirror.core.files import write_text
from stabletoolbench_mirror.core.progress import progress_bar
from stabletoolbench_mirror.engine.model_calls import new_run_id
from stabletoolbench_mirror.scoring import bundle as layout
from stabletoolbench_mirror.scoring.checkout import SCRIPTS, Checkout
from stabletoolbench_mirror.scoring.contents import BACKBONES, METHODS
from stabletoolbench_mirror.scoring.mirror import Mirror
from stabletoolbench_mirror.scoring.upstream_run import UpstreamFailed, UpstreamRunner, tail

STATE_FILE = "state.json"
STATE_FORMAT = 1
CLIENT_KEY = "sk-stm-score"
"""The key upstream's clients send: the server answers with ``llm.upstreams[].api_key_env``'s, never this one."""


class SessionError(RuntimeError):
    """The run cannot go on (the message names the fix)."""


def safe_name(text: str) -> str:
    """``text`` as one URL path segment and file name: characters outside ``[A-Za-z0-9._@-]`` become ``-``."""
    return re.sub(r"[^A-Za-z0-9._@-]", "-", text).strip(".-") or "run"


@dataclass(frozen=True)
class RunSpec:
    """What a run is: the part of ``run.json`` that decides its answers and labels."""

    label: str
    groups: tuple[str, ...]
    method: str
    backbone: str
    agent_model: str
    judge_model: str
    evaluator: str
    evaluate_times: int
    limit: int | None
    pipeline: str
    threads: int
    seed: int
    max_observation_length: int
    reference: str | None = None
    """The reference run's label (``eval_preference``), ``None`` without one."""
    query_ids: tuple[str, ...] | None = None
    """Only these queries of each group (``None``: all of them, up to ``limit``)."""

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["groups"] = list(self.groups)
        data["query_ids"] = None if self.query_ids is None else list(self.query_ids)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunSpec:
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        known["groups"] = tuple(known.get("groups") or ())
        if known.get("query_ids") is not None:
            known["query_ids"] = tuple(str(q) for q in known["query_ids"])
        reference = known.get("reference")
        known["reference"] = reference.get("label") if isinstance(reference, dict) else reference
        return cls(**known)

    def check(self) -> None:
        """:class:`SessionError` for what upstream would refuse or mishandle, naming the fix."""
        if not METHODS.match(self.method):
            raise SessionError(f"--method {self.method!r}: upstream runs CoT@<n>, DFS_w<n> or DFS_woFilter_w<n> (e.g. CoT@1, DFS_woFilter_w2)")
        if self.backbone not in BACKBONES:
            raise SessionError(f"--backbone {self.backbone!r}: one of {', '.join(BACKBONES)}")
        if self.backbone == "chatgpt_function" and not self.agent_model.startswith("gpt"):
            raise SessionError(f"--agent-model {self.agent_model!r}: upstream's chatgpt_function backbone only calls models whose name "
                               "starts with 'gpt' (it picks its request format by the name); serve yours under such a name "
                               "(e.g. vLLM's --served-model-name gpt-local) and route it with llm.upstreams[].models")
        if self.backbone == "toolllama_vllm" and self.pipeline != "qa_pipeline_multithread":
            raise SessionError("--backbone toolllama_vllm runs only in upstream's qa_pipeline_multithread: use --pipeline qa_pipeline_multithread")
        if self.reference is not None and self.reference == self.label:
            raise SessionError(f"--label {self.label!r} is the reference run's label too: name this run otherwise (--label)")


# -- the work folder ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Work:
    """Where a run's files go, laid out as the bundle is (so the bundle is assembled by copying); every path it
    gives is checked to lie inside ``root`` (:func:`.bundle.inside`)."""

    root: Path

    def inside(self, path: str | Path) -> Path:
        return layout.inside(self.root, path)

    def path(self, relative: str) -> Path:
        return self.inside(relative)

    def queries(self, group: str) -> Path:
        return self.inside(f"{layout.QUERIES_DIR}/{group}.json")

    @property
    def test_ids(self) -> Path:
        return self.inside(layout.TEST_IDS_DIR)

    def answers(self, group: str) -> Path:
        return self.inside(layout.answers_dir(group))

    def answers_read(self, group: str) -> Path:
        return self.inside(f"answers_read/{group}")

    @property
    def converted(self) -> Path:
        return self.inside(layout.CONVERTED_DIR)

    @property
    def pass_rate(self) -> Path:
        return self.inside(layout.PASS_RATE_DIR)

    @property
    def preference(self) -> Path:
        return self.inside(layout.PREFERENCE_DIR)

    def log(self, name: str) -> Path:
        return self.inside(f"{layout.LOGS_DIR}/{name}.log")

    def pool(self, run: str) -> Path:
        return self.inside(f"pools/{run}.json")

    @property
    def served(self) -> Path:
        return self.inside("served")

    @property
    def store(self) -> Path:
        return self.inside("store")


@dataclass
class State:
    """``state.json``: the run's spec, the phases done, each phase's attempts and the commands run."""

    path: Path
    spec: dict[str, Any]
    kind: str
    done: list[str] = field(default_factory=list)
    attempts: dict[str, int] = field(default_factory=dict)
    commands: list[dict[str, Any]] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    """Each phase's wall time, its last attempt's (not in ``run.json``: it differs from one machine to the next)."""
    run_id: str = ""
    """The part of every model-call run's name that is this run's own (``""``: a work folder of an older version)."""

    @classmethod
    def open(cls, work: Work, spec: RunSpec, kind: str, run_id: str | None = None) -> State:
        """The state of ``work`` (a new one when there is none, its run id ``run_id`` or a new one); :class:`SessionError`
        when it holds another run."""
        path = work.path(STATE_FILE)
        if not path.is_file():
            state = cls(path, spec.as_json(), kind, run_id=new_run_id() if run_id is None else run_id)
            state.save()
            return state
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise SessionError(f"{path}: cannot be read ({exc}); remove the work folder {work.root} to start again") from None
        if data.get("spec") != spec.as_json() or data.get("kind") != kind:
            raise SessionError(f"the work folder {work.root} holds another run ({data.get('kind')} of {data.get('spec', {}).get('label')!r} "
                               "with other settings): choose another --work, or remove it to start again")
        return cls(path, data["spec"], kind, list(data.get("done", [])), dict(data.get("attempts", {})), list(data.get("commands", [])),
                   dict(data.get("seconds", {})), str(data.get("run_id") or ""))

    def save(self) -> None:
        data = {"format": STATE_FORMAT, "kind": self.kind, "spec": self.spec, "run_id": self.run_id, "done": self.done,
                "attempts": self.attempts, "commands": self.commands, "seconds": self.seconds}
        write_text(self.path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")

    def next_attempt(self, phase: str) -> int:
        self.attempts[phase] = self.attempts.get(phase, 0) + 1
        self.save()
        return self.attempts[phase]

    def finish(self, phase: str, command: dict[str, Any] | None, seconds: float | None = None) -> None:
        self.commands = [c for c in self.commands if c.get("phase_key") != phase]
        if command is not None:
            self.commands.append(command)
        if seconds is not None:
            self.seconds[phase] = round(seconds, 3)
        self.done.append(phase)
        self.save()

    def timings(self) -> list[dict[str, Any]]:
        """``[{"phase", "group", "seconds"}]`` of the phases done, in order."""
        out = []
        for key in self.done:
            if key in self.seconds:
                phase, _, group = key.partition(":")
                out.append({"phase": phase, "group": group, "seconds": self.seconds[key]})
        return out


# -- the session ---------------------------------------------------------------------------------------


@dataclass
class Session:
    """Runs one run's phases through ``mirror`` (see the module's docstring)."""

    spec: RunSpec
    checkout: Checkout
    runner: UpstreamRunner
    work: Work
    mirror: Mirror
    state: State
    out: TextIO = sys.stderr
    progress: bool = True
    notes: list[str] = field(default_factory=list)

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def say_notes(self) -> None:
        """The notes known before the phases run (with progress shown; the report lists them all at the end)."""
        if self.progress:
            for note in self.notes:
                self.say(f"note: {note}")

    # -- running phases ------------------------------------------------------------------------------

    def run(self, phases: list[tuple[str, str]]) -> None:
        """Run each ``(phase, group)`` not done yet, in order."""
        pending = [(p, g) for p, g in phases if f"{p}:{g}" not in self.state.done]
        if len(pending) < len(phases):
            self.say(f"resuming: {len(phases) - len(pending)} of {len(phases)} phases done in {self.work.root}")
        for phase, group in pending:
            getattr(self, f"_{phase}")(group)

    def _run_name(self, key: str) -> str:
        attempt = self.state.next_attempt(key)
        if attempt > 1:
            self.say(f"{key}: attempt {attempt}, from its start, as model-call run {attempt}: "
                     "what the earlier attempt was answered comes back from the records")
        parts = (self.spec.label, self.state.run_id, *key.split(":"), str(attempt))
        return safe_name(".".join(p for p in parts if p))

    def _model_url(self, run: str) -> str:
        return f"{self.mirror.url}/run/{run}/v1"

    @contextmanager
    def _bar(self, desc: str, total: int) -> Iterator[Callable[[int], None]]:
        bar = progress_bar(total=total, desc=desc, unit="query", disable=not self.progress, file=self.out, leave=True)
        try:
            def update(n: int) -> None:
                if n > bar.n:
                    bar.update(min(n, total) - bar.n)

            yield update
        finally:
            bar.close()

    def _upstream(self, key: str, script: str, args: list[str], env: dict[str, str], *, total: int, desc: str,
                  count: Callable[[], int], known_failure: Callable[[Path], str | None] | None = None) -> None:
        """Run one upstream script for the phase ``key`` (its progress counted by ``count()``), then mark it done.

        ``known_failure(log)``: for a non-zero exit, the note saying which known upstream failure it was and why
        the phase's files are complete all the same (``None``: it is no such failure, the run stops).
        """
        log = self.work.log(key.replace(":", "."))
        what = f"{desc} ({script})"
        with self._bar(desc, total) as update:
            done = self.runner.run(what, self.checkout.script(script), args, log, cwd=self.checkout.root, env=env,
                                   watch=lambda: update(count()), check=known_failure is None)
            update(count())
        if done.returncode != 0:
            note = known_failure(log) if known_failure is not None else None
            if note is None:
                raise UpstreamFailed(what, done.returncode, log)
            self.notes.append(note)
        if self.mirror.copy_failures:
            raise SessionError(f"record.served_store could not copy {self.mirror.copy_failures} answers served (see "
                               f"{self.work.log('server')}): the bundle would not replay; free the disk and run the same command again")
        self.state.finish(key, self._command(key, script, args, env), done.seconds)

    def _command(self, key: str, script: str, args: list[str], env: dict[str, str]) -> dict[str, Any]:
        """What was run, its paths and the server's URL written as ``$WORK``, ``$STABLETOOLBENCH``, ``$SERVER`` (run.json's ``commands``)."""
        subs = ((str(self.work.root), "$WORK"), (str(self.checkout.root), "$STABLETOOLBENCH"), (self.mirror.url, "$SERVER"))

        def clean(text: str) -> str:
            for value, name in subs:
                text = text.replace(value, name)
            return text

        phase, _, group = key.partition(":")
        argv = ["python", SCRIPTS[script], *(clean(a) for a in args)]
        return {"phase_key": key, "phase": phase, "group": group, "argv": argv, "env": {k: clean(v) for k, v in sorted(env.items())}}

    # -- the phases ----------------------------------------------------------------------------------

    def _infer(self, group: str) -> None:
        key = f"infer:{group}"
        run = self._run_name(key)
        answers = self.work.answers(group)
        shutil.rmtree(answers, ignore_errors=True)  # from its start: upstream skips the queries answered
        answers.parent.mkdir(parents=True, exist_ok=True)  # upstream's os.mkdir makes only the last folder
        spec = self.spec
        args = ["--backbone_model", spec.backbone, "--openai_key", CLIENT_KEY, "--base_url", self._model_url(run),
                "--tool_root_dir", str(self.checkout.tools), "--method", spec.method,
                "--max_observation_length", str(spec.max_observation_length), "--input_query_file", str(self.work.queries(group)),
                "--output_answer_file", str(answers), "--toolbench_key", ""]
        args += ["--chatgpt_model", spec.agent_model] if spec.backbone == "chatgpt_function" else ["--model_path", spec.agent_model]
        if spec.pipeline == "qa_pipeline_multithread":
            args += ["--num_thread", str(spec.threads), "--disable_tqdm"]
        queries = len(json.loads(self.work.queries(group).read_text(encoding="utf-8")))
        env = {"SERVICE_URL": f"{self.mirror.url}/virtual"}
        self._upstream(key, spec.pipeline, args, env, total=queries, desc=f"{group}: inference",
                       count=lambda: _count(answers, f"*_{spec.method}.json"))
        written = _count(answers, f"*_{spec.method}.json")
        if written < queries:
            self.notes.append(f"{group}: upstream answered {written} of {queries} queries (it skips a query whose tools are not all in "
                              f"--tools {self.checkout.tools}, and one it failed on)")

    def _convert(self, group: str) -> None:
        key = f"convert:{group}"
        answers = sorted(self.work.answers(group).glob(f"*_{self.spec.method}.json"))
        if not answers:
            raise SessionError(f"{group}: no answer files in {self.work.answers(group)} to evaluate (see {self.work.log(f'infer.{group}')})")
        source = self.work.answers_read(group)
        shutil.rmtree(source, ignore_errors=True)
        source.mkdir(parents=True)
        for path in answers:
            data = json.loads(path.read_text(encoding="utf-8"))
            write_text(source / path.name, json.dumps(drop_null_function_calls(data), ensure_ascii=False, indent=2))
        output = self.work.inside(self.work.converted / self.spec.label / f"{group}.json")
        output.parent.mkdir(parents=True, exist_ok=True)
        args = ["--answer_dir", str(source), "--method", self.spec.method, "--output", str(output)]
        self._upstream(key, "convert", args, {}, total=1, desc=f"{group}: convert", count=lambda: int(output.is_file()))

    def _pass_rate(self, group: str) -> None:
        key = f"pass_rate:{group}"
        run = self._run_name(key)
        save = self.work.inside(self.work.pass_rate / self.spec.label)
        save.mkdir(parents=True, exist_ok=True)
        labels = save / f"{group}_{self.spec.label}.json"
        args = ["--converted_answer_path", str(self.work.converted), "--save_path", str(save), "--reference_model", self.spec.label,
                "--test_ids", str(self.work.test_ids), "--evaluator", self.spec.evaluator, "--max_eval_threads", "1",
                "--evaluate_times", str(self.spec.evaluate_times), "--test_set", group, "--overwrite"]
        converted = json.loads((self.work.converted / self.spec.label / f"{group}.json").read_text(encoding="utf-8"))
        self._upstream(key, "eval_pass_rate", args, self._judge_env(run), total=len(converted), desc=f"{group}: pass rate",
                       count=lambda: _json_len(labels))

    def _preference(self, group: str) -> None:
        key = f"preference:{group}"
        run = self._run_name(key)
        reference = self.spec.reference
        assert reference is not None
        self.work.preference.mkdir(parents=True, exist_ok=True)
        output = self.work.inside(self.work.preference / f"{group}_{reference}_{self.spec.label}.json")
        args = ["--converted_answer_path", str(self.work.converted), "--reference_model", reference, "--output_model", self.spec.label,
                "--test_ids", str(self.work.test_ids), "--save_path", str(self.work.preference),
                "--pass_rate_result_path", str(self.work.pass_rate), "--max_eval_threads", "1", "--use_pass_rate", "true",
                "--evaluate_times", str(self.spec.evaluate_times), "--evaluator", self.spec.evaluator, "--test_set", group, "--overwrite"]
        ids = json.loads((self.work.test_ids / f"{group}.json").read_text(encoding="utf-8"))

        def table_failed(log: Path) -> str | None:
            # upstream's write_results reads tool_dict["name"] of each available tool, but a converted answer of the
            # tools format holds {"type": "function", "function": {...}}: it fails after the preference file is complete
            complete, last = _rounds_done(output, self.spec.evaluate_times) == len(ids), tail(log)
            if complete and "in write_results" in last and "KeyError: 'name'" in last:
                return (f"{group}: eval_preference wrote its preference file, then failed writing its .csv (its write_results reads "
                        "tool_dict['name'], which answers in the tools format do not have: an upstream bug); the win rate is "
                        "computed from the .json")
            return None

        self._upstream(key, "eval_preference", args, self._judge_env(run), total=len(ids), desc=f"{group}: preference",
                       count=lambda: _rounds_done(output, self.spec.evaluate_times), known_failure=table_failed)

    def _judge_env(self, run: str) -> dict[str, str]:
        pool = self.work.pool(run)
        write_text(pool, json.dumps([{"api_key": CLIENT_KEY, "api_base": self._model_url(run)}]))
        return {"API_POOL_FILE": str(pool), "EVAL_MODEL": self.spec.judge_model}


def drop_null_function_calls(data: Any) -> Any:
    """``data`` without its ``"function_call": null`` keys (any depth).

    The openai SDK's ``.dict()`` writes that key into every assistant message and upstream's
    ``chat_completion_request`` pops it only from the messages it sends again, so the last one (the
    ``Finish`` call) keeps it; upstream's converter takes any ``'function_call' in message`` for a legacy
    call and fails on ``None['name']``.
    """
    if isinstance(data, dict):
        return {k: drop_null_function_calls(v) for k, v in data.items() if not (k == "function_call" and v is None)}
    if isinstance(data, list):
        return [drop_null_function_calls(v) for v in data]
    return data


def _count(folder: Path, pattern: str) -> int:
    return sum(1 for _ in folder.glob(pattern)) if folder.is_dir() else 0


def _json_len(path: Path) -> int:
    """Entries of a JSON object upstream rewrites as it goes (0 while it is absent or half-written)."""
    try:
        return len(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):
        return 0


def _rounds_done(path: Path, rounds: int) -> int:
    """Queries of a preference file whose ``rounds`` rounds are all ``complete``."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return 0
    return sum(1 for v in data.values() if isinstance(v, dict) and all(v.get(f"round_{i}") == "complete" for i in range(rounds)))


def phases_of(spec: RunSpec, *, infer: bool = True) -> list[tuple[str, str]]:
    """The ``(phase, group)`` pairs of a run, in order: each group's inference and evaluation, group after group."""
    out: list[tuple[str, str]] = []
    for group in spec.groups:
        out += [("infer", group)] if infer else []
        out += [("convert", group), ("pass_rate", group)]
        out += [("preference", group)] if spec.reference is not None else []
    return out
