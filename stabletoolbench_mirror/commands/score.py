"""``score``: reproduce a StableToolBench score in one command (record into a bundle, replay it, re-score it).

The command line only: the run, the bundle and the score are :mod:`stabletoolbench_mirror.scoring`'s.

Exit status: 0 when a record run wrote its bundle, or a replay / re-score gave every file identical; 1 when a
replay or re-score differs from its bundle (each file named), the bundle's seal does not hold, or its ``score.json``
is not what its label files give (each number named, before anything runs); 2 for what the user must fix first (a
checkout, a group, a missing requirement, a judge with no key, a config, a bundle that cannot be read or holds what
no bundle may: a name that is a path, a field of the wrong type or out of range, each named; one over
``--max-unpacked-mb`` / ``--max-download-mb`` / ``--max-ratio``); 3 when one of StableToolBench's scripts failed or
ran past ``--timeout`` (its log named); 130 when interrupted (the same command resumes; a replay's temporary work
folder is removed however it ends, ``--work`` keeps one).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from stabletoolbench_mirror.commands.cli_common import (
    CommandError,
    add_archive_limit_arguments,
    add_command,
    add_json_argument,
    archive_limits,
    print_json,
    settings_from_args,
)
from stabletoolbench_mirror.config import Settings

EXIT_DIFFERENT = 1
EXIT_USAGE = 2
EXIT_UPSTREAM = 3
EXIT_INTERRUPTED = 130


def _hooks(quiet: bool) -> Any:
    from stabletoolbench_mirror.scoring.runs import Hooks

    def start_checks(settings: Settings) -> bool:
        from stabletoolbench_mirror.startup.checks import inspect, print_report

        report = inspect(settings, probe_endpoints=True)
        if not quiet or report.errors:
            print_report(report, sys.stderr)
        return not report.errors

    def write_snapshot(served: Path, out: Path) -> dict[str, Any]:
        from stabletoolbench_mirror.snapshots.snapshot import write_snapshot as snapshot
        from stabletoolbench_mirror.stores import DiskcacheStore

        with DiskcacheStore(str(served), read_only=True) as store:
            return snapshot(store, out, progress=not quiet)

    def probe_servers(settings: Settings, roles: Mapping[str, str], server_url: str | None) -> list[str]:
        from stabletoolbench_mirror.startup.probes import probe_model_servers

        return probe_model_servers(settings, roles, server_url)

    return Hooks(start_checks, write_snapshot, probe_servers)


def _runner(args: argparse.Namespace, root: Path, skip_sleeps: bool, recorded_stand_ins: bool = False) -> Any:
    """How upstream's scripts run; ``--stand-ins`` / ``--no-stand-ins`` when given, else ``recorded_stand_ins`` (a
    bundle's ``run.json``: a replay runs as its record run did)."""
    from stabletoolbench_mirror.scoring.upstream_run import UpstreamRunner

    stand_ins = recorded_stand_ins if args.stand_ins is None else args.stand_ins
    return UpstreamRunner(root, python=args.python or sys.executable, stand_ins=stand_ins, skip_sleeps=skip_sleeps,
                          seed=args.seed, timeout_s=args.timeout)


def _spec(args: argparse.Namespace, checkout: Any, reference: Any) -> Any:
    from stabletoolbench_mirror.scoring.contents import ContentsError, RunFile, check
    from stabletoolbench_mirror.scoring.session import RunSpec, SessionError, safe_name

    groups = tuple(g.strip() for g in (args.groups or "").split(",") if g.strip())
    if not groups:
        raise SessionError("--groups: name at least one group, e.g. --groups G1_instruction,G1_tool")
    judge = args.judge_model or checkout.judge_model(args.evaluator)
    query_ids = tuple(q.strip() for q in args.query_ids.split(",") if q.strip()) if args.query_ids else None
    pipeline = args.pipeline or "qa_pipeline_multithread"
    spec = RunSpec(label=safe_name(args.label or f"{args.agent_model}_{args.method}"), groups=groups, method=args.method,
                   backbone=args.backbone, agent_model=args.agent_model, judge_model=judge, evaluator=args.evaluator,
                   evaluate_times=args.evaluate_times, limit=args.limit, pipeline=pipeline, threads=args.threads, seed=args.seed,
                   max_observation_length=args.max_observation_length, reference=None if reference is None else reference.label,
                   query_ids=query_ids)
    try:  # the rule a bundle's run.json is held to (scoring/contents.py): names, ranges, a seed PYTHONHASHSEED takes
        check(RunFile, spec.as_json(), "score's arguments")
    except ContentsError as exc:
        raise SessionError(str(exc)) from None
    return spec


def _work(args: argparse.Namespace, default: Callable[[], Path]) -> Path:
    """``--work`` (else ``default()``), made absolute once, here: every path below is built from it."""
    return Path(args.work).expanduser().resolve() if args.work else default().resolve()


def _default_work(out: str) -> Path:
    path = Path(out)
    name = path.name
    for suffix in (".tar.gz", ".tgz"):
        name = name.removesuffix(suffix)
    return path.with_name(name + ".work")


def _record(args: argparse.Namespace) -> Any:
    from stabletoolbench_mirror.scoring.bundle import open_bundle
    from stabletoolbench_mirror.scoring.checkout import find_checkout
    from stabletoolbench_mirror.scoring.runs import RecordRequest, record
    from stabletoolbench_mirror.scoring.session import SessionError

    for flag in ("config", "groups", "method", "agent_model", "out"):
        if not getattr(args, flag):
            raise SessionError(f"--{flag.replace('_', '-')} is needed to record a run (or give --replay BUNDLE / --rescore BUNDLE)")
    checkout = find_checkout(args.stabletoolbench, args.tools)
    work = _work(args, lambda: _default_work(args.out))
    reference = open_bundle(args.reference, work / "downloads", progress=not args.quiet, limits=archive_limits(args)) if args.reference else None
    settings = settings_from_args(args)
    spec = _spec(args, checkout, reference)
    runner = _runner(args, checkout.root, skip_sleeps=not (args.keep_sleeps or settings.real.enabled))
    request = RecordRequest(spec, checkout, runner, settings, work, Path(args.out), reference, args.server, progress=not args.quiet,
                            reuse_model_answers=args.reuse_model_answers)
    return record(request, _hooks(args.quiet))


def _rescore_with(args: argparse.Namespace) -> Any:
    """``--rescore BUNDLE --judge-model M``: the bundle's answers evaluated again by another judge, asked live through a
    server of ``--config``, into a new bundle at ``--out`` (reported beside the original's score)."""
    import dataclasses

    from stabletoolbench_mirror.scoring.bundle import open_bundle
    from stabletoolbench_mirror.scoring.checkout import find_checkout
    from stabletoolbench_mirror.scoring.runs import RecordRequest, record
    from stabletoolbench_mirror.scoring.session import RunSpec, SessionError

    for flag in ("config", "out"):
        if not getattr(args, flag):
            raise SessionError(f"--{flag}: --rescore BUNDLE --judge-model M asks the new judge through a server of --config and "
                               "writes a new bundle to --out; give both")
    checkout = find_checkout(args.stabletoolbench, args.tools)
    work = _work(args, lambda: _default_work(args.out))
    bundle = open_bundle(args.rescore, work / "downloads", progress=not args.quiet, limits=archive_limits(args))
    try:
        spec = dataclasses.replace(RunSpec.from_json(bundle.run), judge_model=args.judge_model)
    except TypeError as exc:
        raise SessionError(f"{bundle.root}: not a run this version can re-score ({exc})") from None
    settings = settings_from_args(args)
    runner = _runner(args, checkout.root, skip_sleeps=not (args.keep_sleeps or settings.real.enabled),
                     recorded_stand_ins=bundle.run.get("stand_ins") is True)
    runner.seed = spec.seed  # the bundle's: the evaluation's random streams drawn as they were
    request = RecordRequest(spec, checkout, runner, settings, work, Path(args.out), None, args.server, progress=not args.quiet,
                            reuse_model_answers=args.reuse_model_answers, answers_from=bundle)
    return record(request, _hooks(args.quiet))


def _replay(args: argparse.Namespace, spec_text: str, rescore: bool) -> Any:
    from stabletoolbench_mirror.scoring.bundle import open_bundle
    from stabletoolbench_mirror.scoring.checkout import find_checkout
    from stabletoolbench_mirror.scoring.runs import ReplayRequest, replay

    checkout = find_checkout(args.stabletoolbench, args.tools)
    work = _work(args, lambda: Path(tempfile.mkdtemp(prefix="stm-score-")))
    try:
        bundle = open_bundle(spec_text, work / "downloads", progress=not args.quiet, limits=archive_limits(args))
        runner = _runner(args, checkout.root, skip_sleeps=not args.keep_sleeps, recorded_stand_ins=bundle.run.get("stand_ins") is True)
        out = Path(args.out).expanduser().resolve() if args.out else None
        report = replay(ReplayRequest(bundle, checkout, runner, work, rescore, progress=not args.quiet, out=out), _hooks(args.quiet))
    finally:
        if not args.work:  # a temporary folder, however the run ended: removed (--work keeps one, to look at or resume)
            shutil.rmtree(work, ignore_errors=True)
    report.bundle = spec_text
    if not args.work:
        report.work = None
        if not report.identical:
            report.notes.append("the temporary work folder is removed: give --work DIR to keep the replayed files")
    return report


def _resume(args: argparse.Namespace, how: str) -> str:
    """How to go on after a stop: ``how``, unless the run's work folder was a temporary one (removed)."""
    if args.work or not (args.replay or args.rescore) or (args.rescore and args.judge_model):  # record's work folders are kept
        return how
    return "the temporary work folder is removed: give --work DIR to keep one, and the same command resumes from there"


def _run(args: argparse.Namespace) -> Any:
    """The run the arguments name: a re-score with another judge, a replay or re-score, or a record run."""
    if args.rescore and args.judge_model:
        return _rescore_with(args)
    if args.replay or args.rescore:
        return _replay(args, args.replay or args.rescore, rescore=bool(args.rescore))
    return _record(args)


def cmd_score(args: argparse.Namespace) -> int:
    """Run StableToolBench's own inference and evaluation (from --stabletoolbench, unmodified, with --python) through a
    server this command starts, and seal everything into one bundle; --replay BUNDLE runs it again with no model and no
    key and exits 0 only when every answer and label file is identical; --rescore BUNDLE re-runs the evaluation only.
    See docs/reproduce-a-score.md."""
    from stabletoolbench_mirror.scoring.assemble import ScoreDisagrees
    from stabletoolbench_mirror.scoring.bundle import BundleError, SealError
    from stabletoolbench_mirror.scoring.checkout import CheckoutError
    from stabletoolbench_mirror.scoring.session import SessionError
    from stabletoolbench_mirror.scoring.upstream_run import MissingRequirements, UpstreamFailed, UpstreamTimeout

    if args.replay and args.rescore:
        raise CommandError("give --replay or --rescore, not both")
    try:
        report = _run(args)
    except (SealError, ScoreDisagrees) as exc:  # changed since it was sealed, or a score its label files do not give
        raise CommandError(str(exc), EXIT_DIFFERENT) from None
    except BundleError as exc:
        raise CommandError(str(exc), EXIT_USAGE) from None
    except (CheckoutError, SessionError, MissingRequirements) as exc:
        raise CommandError(str(exc)) from None
    except (UpstreamFailed, UpstreamTimeout) as exc:
        raise CommandError(f"{exc}\n{_resume(args, 'the same command resumes the run from this phase')}", EXIT_UPSTREAM) from None
    except KeyboardInterrupt:
        print(f"interrupted: {_resume(args, 'the phases done are kept in the work folder; run the same command again to resume')}",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    if args.json:
        print_json(report.as_json())
    else:
        print(render(report))
    return 0 if report.kind == "record" or report.identical else EXIT_DIFFERENT


def render(report: Any) -> str:
    """The text report: each group's comparison (replay, re-score) and the score."""
    lines = []
    if report.original is not None:
        lines.append(f"re-score of {report.original['bundle']} with the judge {report.spec.judge_model} (recorded with "
                     f"{report.original['judge_model']}): a new score, not compared with the original's")
    if report.kind == "record":
        lines.append(f"bundle: {report.bundle} (content hash {report.content_hash})")
    else:
        lines.append(f"{report.kind} of {report.bundle} ({report.spec.label}, content hash {report.content_hash}):")
        for c in report.comparisons:
            answers = f"answers {c.answers[0]}/{c.answers[1]} identical, " if report.kind == "replay" else ""
            files = sum(c.files.values())
            verdict = "identical" if c.identical else "DIFFERENT"
            lines.append(f"  {c.group}: {answers}{files}/{len(c.files)} evaluation files identical: {verdict}")
            lines += [f"    differs: {path}" for path in c.differ]
    lines += _score_lines(report)
    lines += [f"note: {n}" for n in report.notes]
    if report.kind != "record":
        lines.append("every file identical, and the bundle's score is what its label files give" if report.identical
                     else "files differ from the bundle (listed above)")
    if report.out is not None:
        lines.append(f"this {report.kind}'s own bundle: {report.out['path']} (content hash {report.out['content_hash']}; "
                     f"`report` of it says {'verified' if report.identical else 'replayed, different'})")
    return "\n".join(lines)


def _score_lines(report: Any) -> list[str]:
    """Each group's SoPR (and SoWR), the original's beside it for a re-score with another judge, and the average."""
    lines = []
    score = report.score
    for group, rate in score.get("pass_rate", {}).items():
        win = score.get("win_rate", {}).get(group)
        extra = f", SoWR {100 * win['win']:.1f}% (tie {100 * win['tie']:.1f}%)" if win else ""
        before = (report.original or {}).get("score", {}).get("pass_rate", {}).get(group)
        extra += f"; the original's SoPR {before['solve_rate']:.1f}%" if before else ""
        lines.append(f"  {group}: SoPR {rate['solve_rate']:.1f}% (std {rate['std']:.1f}%, {rate['queries']} queries){extra}")
    if score.get("pass_rate_average") is not None:
        win_average = score.get("win_rate_average")
        extra = f", SoWR {100 * win_average:.1f}%" if win_average is not None else ""
        lines.append(f"  average: SoPR {score['pass_rate_average']:.1f}%{extra}")
    return lines


def register(sub: argparse._SubParsersAction) -> None:
    summary = "reproduce a StableToolBench score in one command: record a run into a sealed bundle, replay or re-score one"
    parser = add_command(sub, "score", cmd_score, summary=summary, mode=None, store_path=None)
    what = parser.add_argument_group("what to run (record)")
    what.add_argument("--config", "-c", help="the server's config: store, frozen caches, simulator, llm.upstreams for the agent and the judge")
    what.add_argument("--groups", help="comma-separated test groups, e.g. G1_instruction,G1_tool")
    what.add_argument("--method", help="upstream's method: CoT@1, DFS_woFilter_w2, ...")
    what.add_argument("--agent-model", help="the agent's model name (chatgpt_function: it must start with 'gpt')")
    what.add_argument("--backbone", default="chatgpt_function", help="chatgpt_function (default) or toolllama_vllm (/v1/completions)")
    what.add_argument("--judge-model", help="the judge's model (default: the evaluator's config.yaml completions_kwargs.model); with "
                      "--rescore BUNDLE, --config and --out: re-score the bundle's answers with this judge into a new bundle")
    what.add_argument("--evaluator", default="tooleval_gpt-3.5-turbo_default", help="upstream's evaluator (default: %(default)s)")
    what.add_argument("--evaluate-times", type=int, default=4, help="judge requests per answer (default: %(default)s, as eval_pass_rate's)")
    what.add_argument("--limit", type=int, help="only the first N queries of each group")
    what.add_argument("--query-ids", help="only these queries (comma-separated ids) of each group, in the group's order")
    what.add_argument("--label", help="the run's name in upstream's evaluation (default: <agent-model>_<method>)")
    what.add_argument("--reference", help="a bundle (folder, .tar.gz or URL#sha256=...) to compute the Solvable Win Rate against")
    what.add_argument("--pipeline", choices=["qa_pipeline", "qa_pipeline_multithread"],
                      help="upstream's inference script (default: qa_pipeline_multithread, as its own inference script; toolllama_vllm needs it)")
    what.add_argument("--threads", type=int, default=1, help="qa_pipeline_multithread's --num_thread (default 1: answers in a fixed order)")
    what.add_argument("--max-observation-length", type=int, default=1024, help="upstream's --max_observation_length (default: %(default)s)")
    what.add_argument("--server", help="a server already running with --config (it must set record.served_store) instead of starting one")
    what.add_argument("--out", help="the bundle to write: a new folder, or BUNDLE.tar.gz; with --replay/--rescore, the replay's own bundle "
                                    "(with its verdict.json), so that `report` can say it verified and `report A B` compare them")
    what.add_argument("--reuse-model-answers", action="store_true",
                      help="answer the agent and the judge from what the store and frozen caches recorded (default: this run's own "
                           "answers, drawn fresh; a resumed run still pays no call twice)")
    again = parser.add_argument_group("replay or re-score a bundle")
    again.add_argument("--replay", metavar="BUNDLE", help="run inference and evaluation again from the bundle's records; exit 0 iff identical")
    again.add_argument("--rescore", metavar="BUNDLE", help="run the evaluation again over the bundle's answers; exit 0 iff identical")
    how = parser.add_argument_group("how")
    how.add_argument("--stabletoolbench", required=True, help="a StableToolBench checkout (its scripts run from there, unmodified)")
    how.add_argument("--tools", help="the tools folder (default: the checkout's toolenv/tools, else server/tools)")
    how.add_argument("--python", help="the Python with StableToolBench's requirements (default: this one)")
    how.add_argument("--stand-ins", action=argparse.BooleanOptionalAction, default=None,
                     help="answer the GPU modules upstream imports but an API-model agent never calls (torch, transformers, ...) with "
                          "placeholders (kept in run.json: --replay and --rescore use the bundle's unless given)")
    how.add_argument("--seed", type=int, default=42, help="random.seed and PYTHONHASHSEED of upstream's processes (default: %(default)s; a replay uses the bundle's)")
    how.add_argument("--keep-sleeps", action="store_true", help="keep upstream's own sleeps (skipped unless the real API is enabled)")
    how.add_argument("--timeout", type=float, help="the longest one upstream script may run, in seconds (default: no limit)")
    how.add_argument("--work", help="the work folder (default: BUNDLE.work beside --out; for --replay/--rescore a temporary one, "
                                    "removed however the run ends)")
    how.add_argument("--quiet", "-q", action="store_true", help="no progress bars or start-up summary")
    add_archive_limit_arguments(how)
    add_json_argument(parser)
