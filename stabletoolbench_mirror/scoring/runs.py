"""``score``'s three runs, whole: record one into a sealed bundle, replay a bundle, re-score a bundle.

* :func:`record`: StableToolBench's inference and evaluation through a server started with the user's
  config (plus ``record.served_store``, a fresh folder of the work folder), then the bundle: every file the
  run wrote, the served store's snapshot as ``records/``, ``run.json``, ``score.json``, sealed.
* :func:`replay`: the same scripts again, from the bundle's queries, through a server in ``replay`` mode
  whose only frozen cache is the bundle's ``records/`` (no model, no key, no other cache); every answer
  file, converted answer, label and preference file compared with the bundle's.
* :func:`replay` with ``rescore=True``: the evaluation only, over the bundle's answer files.
* :func:`record` with ``answers_from``: a re-score with another judge, the evaluation only, over a bundle's answer
  files, the new judge asked live, sealed into a bundle of its own (``run.json``'s ``rescored_from`` names the
  original; :func:`replay` of it replays its evaluation).

The command line (``commands/score.py``) gives what lives above this layer as :class:`Hooks`: the start-up
checks it prints and the snapshot writer.
"""

from __future__ import annotations

import json
import shutil
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stabletoolbench_mirror.config import Mode, Settings
from stabletoolbench_mirror.core.files import write_text
from stabletoolbench_mirror.scoring import bundle as layout
from stabletoolbench_mirror.scoring import contents
from stabletoolbench_mirror.scoring.assemble import (
    Environment,
    GroupComparison,
    ScoreDisagrees,
    answer_settings,
    assemble,
    compare,
    place_reference,
    score_differences,
    score_of,
    seed_work,
)
from stabletoolbench_mirror.scoring.checkout import Checkout
from stabletoolbench_mirror.scoring.mirror import Mirror
from stabletoolbench_mirror.scoring.session import RunSpec, Session, SessionError, State, Work, phases_of
from stabletoolbench_mirror.scoring.upstream_run import UpstreamRunner


@dataclass
class Hooks:
    """What the command line gives the runs: the start-up checks and the snapshot writer."""

    start_checks: Callable[[Settings], bool]
    """Print the server's start-up summary for these settings; ``False`` when it found an error."""
    write_snapshot: Callable[[Path, Path], dict[str, Any]]
    """``(diskcache folder, out folder)``: the folder's snapshot written into ``out``; its manifest."""
    probe_servers: Callable[[Settings, Mapping[str, str], str | None], list[str]]
    """``(settings, {role: model}, --server URL)``: the model servers the roles' models are asked at, and the server, probed;
    one line for each that does not answer (empty: all answer)."""


@dataclass
class Report:
    """How a run ended: what ``score`` prints (and ``--json``)."""

    kind: str
    spec: RunSpec
    work: Path | None
    """The work folder (``None``: a temporary one, removed)."""
    score: dict[str, Any]
    bundle: str | None = None
    content_hash: str | None = None
    comparisons: list[GroupComparison] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    phases: list[dict[str, Any]] = field(default_factory=list)
    """``[{"phase", "group", "seconds"}]``: each phase's wall time."""
    original: dict[str, Any] | None = None
    """A re-score with another judge: the original bundle, its judge and its score (``{"bundle", "judge_model", "score"}``)."""
    out: dict[str, Any] | None = None
    """A replay's or re-score's own bundle written (``--out``): ``{"path", "content_hash"}``."""

    @property
    def identical(self) -> bool:
        return all(c.identical for c in self.comparisons)

    def as_json(self) -> dict[str, Any]:
        score = {k: v for k, v in self.score.items() if k != "labels"}
        data: dict[str, Any] = {"kind": self.kind, "label": self.spec.label, "groups": list(self.spec.groups), "work": None if self.work is None else str(self.work),
                                "bundle": self.bundle, "content_hash": self.content_hash, "score": score, "notes": self.notes,
                                "phases": self.phases}
        if self.kind != "record":
            data["identical"] = self.identical
            data["comparisons"] = [c.as_json() for c in self.comparisons]
            data["out"] = self.out
        data["original"] = None
        if self.original is not None:
            original = self.original["score"]
            data["original"] = {**self.original, "score": {k: v for k, v in original.items() if k != "labels"}}
        return data


# -- record --------------------------------------------------------------------------------------------


@dataclass
class RecordRequest:
    spec: RunSpec
    checkout: Checkout
    runner: UpstreamRunner
    settings: Settings
    """The server's settings (``--config``), before the run's own are added."""
    work: Path
    out: Path
    """The bundle: a folder, or a ``.tar.gz`` file."""
    reference: layout.Bundle | None = None
    server_url: str | None = None
    progress: bool = True
    reuse_model_answers: bool = False
    """Answer the agent and the judge from what the store and the frozen caches recorded (``--reuse-model-answers``);
    by default a record run draws answers of its own (``llm.reuse_answers: false`` in its server)."""
    answers_from: layout.Bundle | None = None
    """A re-score with another judge (``--rescore BUNDLE --judge-model M``): the evaluation only, over this bundle's
    answer files (and its reference's files), the judge asked live; ``spec`` is the bundle's with the new judge."""

    @property
    def roles(self) -> dict[str, str]:
        """The models this run asks, by role (a re-score asks only the judge)."""
        judge = {"judge": self.spec.judge_model}
        return judge if self.answers_from is not None else {"agent": self.spec.agent_model, **judge}


def record(request: RecordRequest, hooks: Hooks) -> Report:
    spec, checkout = request.spec, request.checkout
    work = Work(request.work.resolve())
    notes = _record_checks(request)
    _probe(request, hooks, request.roles)
    state = State.open(work, spec, "record")
    if "prepare" not in state.done:
        if request.answers_from is not None:
            seed_work(request.answers_from, spec, work, answers=True)
        else:
            _prepare(work, spec, checkout, request.reference)
        state.finish("prepare", None)
    settings = record_settings(request.settings, work, reuse_answers=request.reuse_model_answers)
    if request.server_url is None and not hooks.start_checks(settings):
        raise SessionError("the server's start-up checks found errors (above): fix --config")
    mirror = Mirror(request.server_url) if request.server_url else Mirror.start(settings, work.log("server"))
    session = Session(spec, checkout, request.runner, work, mirror, state, progress=request.progress, notes=notes)
    try:
        session.say_notes()
        session.run(phases_of(spec, infer=request.answers_from is None))
        prompt = mirror.health().get("simulator_prompt")
    finally:
        mirror.stop()
    named = request.settings.record.served_store  # --server: the served store of the config that server runs with
    served = Path(request.settings.resolve(named)) if request.server_url and named else work.served
    content_hash = _write_bundle(request, work, state, served, hooks, prompt)
    source = request.answers_from
    original = None if source is None else {"bundle": str(source.root), "judge_model": source.run.get("judge_model"), "score": source.score}
    return Report("record", spec, work.root, score_of(work.root, spec), str(request.out), content_hash, notes=session.notes,
                  phases=state.timings(), original=original)


def _probe(request: RecordRequest, hooks: Hooks, roles: Mapping[str, str]) -> None:
    """:class:`SessionError` naming each model server (and ``--server``) the run needs that does not answer, before
    anything runs (a judge that is down would otherwise cost upstream's retries on every answer, then the phase)."""
    settings = request.settings
    asked = {} if (settings.llm.mode or settings.mode) is Mode.REPLAY else roles
    unreachable = hooks.probe_servers(settings, asked, request.server_url)
    if unreachable:
        raise SessionError("the run cannot start:\n  " + "\n  ".join(unreachable))


def _record_checks(request: RecordRequest) -> list[str]:
    spec = request.spec
    spec.check()
    _check_out(request.out.resolve())
    request.checkout.check_groups(list(spec.groups))
    if spec.query_ids is not None:
        _check_query_ids(request.checkout, spec)
    if request.reference is not None:
        _check_reference(request.reference, spec)
    if request.answers_from is not None and request.answers_from.run.get("judge_model") == spec.judge_model:
        raise SessionError(f"--judge-model {spec.judge_model!r} is the bundle's judge already: --rescore without --judge-model "
                           "re-runs its recorded evaluation; name another judge to re-score it")
    if request.server_url is not None and not request.settings.record.served_store:
        raise SessionError("--server: the server must run with record.served_store set (a fresh diskcache folder) in the --config it "
                           "runs with, so that the run's records can be bundled; or leave --server out and score starts one")
    if request.server_url is not None and request.settings.llm.reuse_answers and not request.reuse_model_answers:
        raise SessionError("--server: its config answers model calls from any recorded answer (llm.reuse_answers: true, the "
                           "default), so this run could get an earlier run's answers: set llm.reuse_answers: false in the --config "
                           "it runs with, or pass --reuse-model-answers to reuse them on purpose")
    if request.server_url is not None and request.settings.auth_token is not None:
        raise SessionError("--server: its config sets auth_token, which upstream's clients cannot send (SERVICE_URL, --base_url, "
                           "API_POOL_FILE carry no token); leave --server out and score starts a server of its own on 127.0.0.1")
    notes = check_models(request.settings, request.roles)
    notes += request.runner.check_requirements([request.checkout.script(s) for s in _scripts(spec)])
    notes += sleeps_notes(request.runner, request.settings)
    return notes


def _check_query_ids(checkout: Checkout, spec: RunSpec) -> None:
    assert spec.query_ids is not None
    found = {str(q.get("query_id")) for group in spec.groups for q in checkout.read_queries(group)}
    unknown = [q for q in spec.query_ids if q not in found]
    if unknown:
        raise SessionError(f"--query-ids: {', '.join(unknown)} in none of {', '.join(spec.groups)}")


def _scripts(spec: RunSpec) -> list[str]:
    return [spec.pipeline, "convert", "eval_pass_rate", *(["eval_preference"] if spec.reference is not None else [])]


def record_settings(settings: Settings, work: Work, *, reuse_answers: bool = False) -> Settings:
    """The user's settings for the server score starts: one worker, the run's own served store (a folder of the
    work folder, whatever the config names: the records hold this run's answers only), model calls answered from
    it alone unless ``reuse_answers`` (so a resumed run pays no call twice, and a new run draws its own), no log
    file of its own."""
    ours = settings.model_copy(deep=True)
    ours.record.served_store = str(work.served)
    ours.llm.reuse_answers = reuse_answers
    ours.workers = 1
    ours.log_file = None
    ours.llm.run = None
    ours.auth_token = None  # on 127.0.0.1, for this run only: upstream's clients send no token
    return ours


def check_models(settings: Settings, roles: Mapping[str, str]) -> list[str]:
    """:class:`SessionError` when a model of ``roles`` (``{"agent": model, "judge": model}``) has no upstream to record it
    from, or no key."""
    from stabletoolbench_mirror.responders.model_servers import ModelServers

    mode = settings.llm.mode or settings.mode
    if mode is Mode.REPLAY:
        asked = " and ".join(f"the {role} ({model})" for role, model in roles.items())
        return [f"model calls in replay mode (llm.mode): every call of {asked} must be recorded already"]
    upstreams = ModelServers(settings.llm)
    try:
        for role, model in roles.items():
            upstream = upstreams.for_model(model)
            if upstream is None:
                raise SessionError(f"no llm.upstreams entry answers the {role}'s model {model!r}: add one whose models match it "
                                   f"(base_url: its OpenAI-compatible /v1, models: [\"{model}\"]) to {settings.config_source}")
            key_env = upstream.config.api_key_env
            if key_env and not upstream.config.api_key():
                raise SessionError(f"the {role}'s model {model!r} is asked at {upstream.url} with the key in ${key_env}, which is "
                                   f"not set: export {key_env}=... (the server sends it; it is never recorded)")
            if not key_env and not _loopback(upstream.config.base_url):
                raise SessionError(f"the {role}'s model {model!r} is asked at {upstream.url} with no llm.upstreams[].api_key_env: "
                                   "upstream's clients send score's placeholder key, so name the variable holding the real one "
                                   "(api_key_env: OPENAI_API_KEY)")
    finally:
        upstreams.close()
    return []


def _loopback(url: str) -> bool:
    return (urllib.parse.urlsplit(url).hostname or "") in ("127.0.0.1", "localhost", "::1")


def sleeps_notes(runner: UpstreamRunner, settings: Settings | None) -> list[str]:
    """Whether upstream's own sleeps are skipped, and why (they rate-limit the real API only)."""
    if not runner.skip_sleeps:
        return ["upstream's own sleeps are kept (2 s before each tool call, 15 s between parse retries)"]
    why = "every answer is replayed from records" if settings is None else "no tool call reaches the real API (real.enabled is false)"
    return [f"upstream's own sleeps skipped (2 s before each tool call, 15 s between parse retries): {why}, so they "
            "cannot change an answer; the openai SDK's, tenacity's and backoff's waits are kept"]


def _check_reference(reference: layout.Bundle, spec: RunSpec) -> None:
    missing = [g for g in spec.groups if g not in reference.groups]
    if missing:
        raise SessionError(f"--reference {reference.root}: the reference run has no {', '.join(missing)} (it has "
                           f"{', '.join(reference.groups)})")
    for group in spec.groups:
        for relative in (layout.converted_file(reference.label, group), layout.pass_rate_files(reference.label, group)[1]):
            if not reference.path(relative).is_file():
                raise SessionError(f"--reference {reference.root}: no {relative} (a bundle of a whole run is needed)")


def _prepare(work: Work, spec: RunSpec, checkout: Checkout, reference: layout.Bundle | None) -> None:
    """The queries (those of ``query_ids``, the first ``limit`` of each group), their test ids, and the reference run's files."""
    for group in spec.groups:
        queries = checkout.read_queries(group)
        if spec.query_ids is not None:
            queries = [q for q in queries if str(q.get("query_id")) in spec.query_ids]
        if spec.limit is not None:
            queries = queries[: spec.limit]
        chosen = {str(q.get("query_id")) for q in queries}
        ids = {qid: value for qid, value in checkout.read_test_ids(group).items() if qid in chosen}
        write_text(work.queries(group), json.dumps(queries, ensure_ascii=False, indent=2))
        write_text(work.test_ids / f"{group}.json", json.dumps(ids, ensure_ascii=False))
        if reference is not None:
            ref = reference.label
            place_reference(work, ref, group, reference.path(layout.converted_file(ref, group)),
                            reference.path(layout.pass_rate_files(ref, group)[1]))


def _write_bundle(request: RecordRequest, work: Work, state: State, served: Path, hooks: Hooks, prompt: Any) -> str:
    """The bundle assembled in the work folder, then moved to ``--out`` (a folder) or packed there (``.tar.gz``)."""
    folder = work.path("bundle")
    shutil.rmtree(folder, ignore_errors=True)  # a bundle not finished before (assembling is done again, from the files)
    env = Environment(
        checkout={"commit": request.checkout.commit, "dirty": request.checkout.dirty},
        settings=answer_settings(request.settings, prompt),
        reference=_reference_note(request),
        extra={"stand_ins": request.runner.stand_ins, "skipped_sleeps": request.runner.skip_sleeps,
               "python": request.runner.python_version(), "run_id": state.run_id,
               "reuse_model_answers": request.reuse_model_answers, **_rescored_note(request)},
    )
    seal = assemble(work, request.spec, state, folder, env, lambda target: hooks.write_snapshot(served, target))
    _place(folder, request.out.resolve())
    return str(seal["content_hash"])


def _place(folder: Path, out: Path) -> None:
    """The bundle assembled in ``folder`` moved to ``out`` (a new or empty folder, :func:`_check_out`) or packed there."""
    from stabletoolbench_mirror.upstream.archives import pack

    if _is_archive(out):
        pack(folder, out)
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        if out.is_dir():
            out.rmdir()  # an empty folder named by --out (_check_out)
        shutil.move(str(folder), str(out))


def _reference_note(request: RecordRequest) -> dict[str, Any] | None:
    """``run.json``'s ``reference``: the reference bundle's label and content hash (a re-score keeps its bundle's)."""
    if request.answers_from is not None:
        return request.answers_from.run.get("reference")
    return None if request.reference is None else {"label": request.reference.label, "content_hash": request.reference.content_hash}


def _rescored_note(request: RecordRequest) -> dict[str, Any]:
    """``run.json``'s ``rescored_from`` (a re-score with another judge): the bundle whose answers were evaluated."""
    source = request.answers_from
    if source is None:
        return {}
    return {"rescored_from": {"content_hash": source.content_hash, "label": source.label, "judge_model": source.run.get("judge_model")}}


def _is_archive(out: Path) -> bool:
    from stabletoolbench_mirror.upstream.archives import ARCHIVE_SUFFIXES

    return out.name.endswith(ARCHIVE_SUFFIXES)


def _check_out(out: Path) -> None:
    """``--out`` must be new (a folder may exist empty): checked before anything runs, not after."""
    if out.exists() and (_is_archive(out) or not out.is_dir() or any(out.iterdir())):
        raise SessionError(f"--out {out} exists: a bundle is written to a new path (or an empty folder); choose another")


# -- replay and re-score -------------------------------------------------------------------------------


@dataclass
class ReplayRequest:
    bundle: layout.Bundle
    checkout: Checkout
    runner: UpstreamRunner
    work: Path
    rescore: bool = False
    progress: bool = True
    out: Path | None = None
    """Where to write the replay's own bundle (with its ``verdict.json``), ``None``: none."""


def replay_settings(bundle: layout.Bundle, work: Work) -> Settings:
    """A server that answers only from the bundle's records: replay mode, an empty store, no upstream, no key."""
    settings = Settings.model_validate({
        "mode": "replay", "store": {"path": str(work.store)}, "frozen_caches": [str(bundle.records)], "log_level": "warning",
        "download_dir": str(work.root / "downloads"),
    })
    settings.base_dir = str(work.root)
    settings.config_source = f"score --replay {bundle.root}: the bundle's records only"
    return settings


def replay(request: ReplayRequest, hooks: Hooks) -> Report:
    bundle = request.bundle
    spec = _replay_checks(request)
    request.runner.seed = spec.seed  # the bundle's: upstream's random streams drawn as they were
    rescore = request.rescore or "rescored_from" in bundle.run  # a re-score's bundle holds its judge's calls only
    notes = _commit_notes(bundle, request.checkout)
    notes += request.runner.check_requirements([request.checkout.script(s) for s in _scripts(spec) if not (rescore and s == spec.pipeline)])
    notes += sleeps_notes(request.runner, None)
    work = Work(request.work.resolve())
    kind = "rescore" if rescore else "replay"
    state = State.open(work, spec, kind, run_id=str(bundle.run.get("run_id") or ""))  # the record run's model-call run names
    if "prepare" not in state.done:
        seed_work(bundle, spec, work, answers=rescore)
        state.finish("prepare", None)
    settings = replay_settings(bundle, work)
    if not hooks.start_checks(settings):
        raise SessionError(f"the bundle's records cannot be served (above): {bundle.records}")
    mirror = Mirror.start(settings, work.log("server"))
    session = Session(spec, request.checkout, request.runner, work, mirror, state, progress=request.progress, notes=notes)
    try:
        session.say_notes()
        session.run(phases_of(spec, infer=not rescore))
    finally:
        mirror.stop()
    comparisons = compare(bundle, spec, work, answers=not rescore)
    report = Report(kind, spec, work.root, score_of(work.root, spec), str(bundle.root), bundle.content_hash, comparisons, session.notes,
                    state.timings())
    if request.out is not None:
        report.out = {"path": str(request.out), "content_hash": _write_replay_bundle(request, spec, work, state, report)}
    return report


def _replay_checks(request: ReplayRequest) -> RunSpec:
    """The bundle's run, checked before anything runs: every field a replay needs, the evaluator one of the checkout's,
    ``--out`` new, and ``score.json`` what the bundle's label files give (:class:`ScoreDisagrees` naming each number)."""
    bundle = request.bundle
    try:
        spec = RunSpec.from_json(bundle.run)
    except TypeError as exc:
        raise SessionError(f"{bundle.root / layout.RUN_FILE}: not a run this version can replay ({exc})") from None
    request.checkout.evaluator(spec.evaluator)
    if request.out is not None:
        _check_out(request.out.resolve())
    differences = score_differences(bundle, spec)
    if differences:
        raise ScoreDisagrees(f"{bundle.root}: its score is not what its own label files give, so a replay cannot verify it:\n  "
                             + "\n  ".join(differences))
    return spec


def _write_replay_bundle(request: ReplayRequest, spec: RunSpec, work: Work, state: State, report: Report) -> str:
    """The replay's own bundle (its files, the records it was answered from, ``verdict.json``) written to ``--out``."""
    bundle = request.bundle
    assert request.out is not None
    folder = work.path("bundle")
    shutil.rmtree(folder, ignore_errors=True)
    recorded: dict[str, Any] = bundle.run["environment"] if isinstance(bundle.run.get("environment"), dict) else {}
    env = Environment(
        checkout={"commit": request.checkout.commit, "dirty": request.checkout.dirty},
        settings={k: v for k, v in recorded.items() if not k.startswith("records_")},
        reference=bundle.run["reference"] if isinstance(bundle.run.get("reference"), dict) else None,
        extra={"stand_ins": request.runner.stand_ins, "skipped_sleeps": request.runner.skip_sleeps,
               "python": request.runner.python_version(), "run_id": state.run_id,
               **({"rescored_from": bundle.run["rescored_from"]} if "rescored_from" in bundle.run else {})},
    )
    verdict = {"kind": report.kind, "replayed": bundle.content_hash, "identical": report.identical,
               "differ": sorted({p for c in report.comparisons for p in c.differ}), "score_differences": []}
    seal = assemble(work, spec, state, folder, env, lambda target: _copy_records(bundle, target), verdict)
    _place(folder, request.out.resolve())
    return str(seal["content_hash"])


def _copy_records(bundle: layout.Bundle, target: Path) -> dict[str, Any]:
    """The bundle's ``records/`` (what the replay's server answered from, and only from) copied to ``target``; its manifest."""
    from stabletoolbench_mirror.upstream.failures import MANIFEST_NAME

    shutil.copytree(bundle.records, target)
    try:
        manifest = contents.read_json(target / MANIFEST_NAME)
    except (OSError, contents.ContentsError) as exc:
        raise layout.BundleError(f"{bundle.records / MANIFEST_NAME}: cannot be read ({exc})") from None
    return manifest if isinstance(manifest, dict) else {}


def _commit_notes(bundle: layout.Bundle, checkout: Checkout) -> list[str]:
    recorded = (bundle.run.get("stabletoolbench") or {}).get("commit")
    if recorded and checkout.commit and recorded != checkout.commit:
        return [f"the bundle was recorded with StableToolBench {recorded[:12]}; this checkout is {checkout.commit[:12]} "
                "(a difference in its code can change the files)"]
    return []
