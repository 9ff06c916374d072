"""``score``: reproduce a StableToolBench score in one command (record into a bundle, replay it, re-score it).

The command line only: the run, the bundle and the score are :mod:`stabletoolbench_mirror.scoring`'s.

Exit status: 0 when a record run wrote its bundle, or a replay / re-score gave every file identical; 1 when a
replay or re-score differs from its bundle (each file named), the bundle's seal does not hold, or its ``score.json``
is not what its label files give (each number named, before anything runs); 2 for what the user must fix first (a
checkout, a group, a missing requirement, a judge with no key, a config, a bundle that cannot be read or holds what
no bundle may: a name that is a path, a field of the wrong type or out of range, each named); 3 when one of StableToolBench's scripts failed or ran past ``--timeout`` (its log named);
130 when interrupted (the same command resumes).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from stabletoolbench_mirror.commands.cli_common import CommandError, add_command, add_json_argument, print_json, settings_from_args
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

    return Hooks(start_checks, write_snapshot)


def _runner(args: argparse.Namespace, root: Path, skip_sleeps: bool) -> Any:
    from stabletoolbench_mirror.scoring.upstream_run import UpstreamRunner

    return UpstreamRunner(root, python=args.python or sys.executable, stand_ins=args.stand_ins, skip_sleeps=skip_sleeps,
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


def _work(args: argparse.Namespace, default: Path) -> Path:
    """``--work`` (else ``default``), made absolute once, here: every path below is built from it."""
    return Path(args.work).expanduser().resolve() if args.work else default.resolve()


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
    work = _work(args, _default_work(args.out))
    reference = open_bundle(args.reference, work / "downloads", progress=not args.quiet) if args.reference else None
    settings = settings_from_args(args)
    spec = _spec(args, checkout, reference)
    runner = _runner(args, checkout.root, skip_sleeps=not (args.keep_sleeps or settings.real.enabled))
    request = RecordRequest(spec, checkout, runner, settings, work, Path(args.out), reference, args.server, progress=not args.quiet)
    return record(request, _hooks(args.quiet))


def _replay(args: argparse.Namespace, spec_text: str, rescore: bool) -> Any:
    from stabletoolbench_mirror.scoring.bundle import open_bundle
    from stabletoolbench_mirror.scoring.checkout import find_checkout
    from stabletoolbench_mirror.scoring.runs import ReplayRequest, replay

    checkout = find_checkout(args.stabletoolbench, args.tools)
    work = _work(args, Path(tempfile.mkdtemp(prefix="stm-score-")))
    try:
        bundle = open_bundle(spec_text, work / "downloads", progress=not args.quiet)
        runner = _runner(args, checkout.root, skip_sleeps=not args.keep_sleeps)
        out = Path(args.out).expanduser().resolve() if args.out else None
        report = replay(ReplayRequest(bundle, checkout, runner, work, rescore, progress=not args.quiet, out=out), _hooks(args.quiet))
    except BaseException:
        if not args.work:
            print(f"the work folder is kept: {work}", file=sys.stderr)
        raise
    report.bundle = spec_text
    if not args.work and report.identical:  # a temporary folder, nothing to look at: removed
        shutil.rmtree(work, ignore_errors=True)
        report.work = None
    return report


def cmd_score(args: argparse.Namespace) -> int:
    """Run StableToolBench's own inference and evaluation (from --stabletoolbench, unmodified, with --python) through a
    server this command starts, and seal everything into one bundle; --replay BUNDLE runs it again with no model and no
    key and exits 0 only when every answer and label file is identical; --rescore BUNDLE re-runs the evaluation only.
    See docs/reproduce-a-score.md."""
    from stabletoolbench_mirror.scoring.assemble import ScoreDisagrees
    from stabletoolbench_mirror.scoring.bundle import BundleError
    from stabletoolbench_mirror.scoring.checkout import CheckoutError
    from stabletoolbench_mirror.scoring.session import SessionError
    from stabletoolbench_mirror.scoring.upstream_run import MissingRequirements, UpstreamFailed, UpstreamTimeout

    if args.replay and args.rescore:
        raise CommandError("give --replay or --rescore, not both")
    try:
        if args.replay or args.rescore:
            report = _replay(args, args.replay or args.rescore, rescore=bool(args.rescore))
        else:
            report = _record(args)
    except ScoreDisagrees as exc:
        raise CommandError(str(exc), EXIT_DIFFERENT) from None
    except BundleError as exc:
        raise CommandError(str(exc), EXIT_DIFFERENT if "differ from the bundle's seal" in str(exc) else EXIT_USAGE) from None
    except (CheckoutError, SessionError, MissingRequirements) as exc:
        raise CommandError(str(exc)) from None
    except (UpstreamFailed, UpstreamTimeout) as exc:
        raise CommandError(f"{exc}\nthe same command resumes the run from this phase", EXIT_UPSTREAM) from None
    except KeyboardInterrupt:
        print("interrupted: the phases done are kept in the work folder; run the same command again to resume", file=sys.stderr)
        return EXIT_INTERRUPTED
    if args.json:
        print_json(report.as_json())
    else:
        print(render(report))
    return 0 if report.kind == "record" or report.identical else EXIT_DIFFERENT


def render(report: Any) -> str:
    """The text report: each group's comparison (replay, re-score) and the score."""
    lines = []
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
    score = report.score
    for group, rate in score.get("pass_rate", {}).items():
        win = score.get("win_rate", {}).get(group)
        extra = f", SoWR {100 * win['win']:.1f}% (tie {100 * win['tie']:.1f}%)" if win else ""
        lines.append(f"  {group}: SoPR {rate['solve_rate']:.1f}% (std {rate['std']:.1f}%, {rate['queries']} queries){extra}")
    if score.get("pass_rate_average") is not None:
        win_average = score.get("win_rate_average")
        extra = f", SoWR {100 * win_average:.1f}%" if win_average is not None else ""
        lines.append(f"  average: SoPR {score['pass_rate_average']:.1f}%{extra}")
    lines += [f"note: {n}" for n in report.notes]
    if report.kind != "record":
        lines.append("every file identical, and the bundle's score is what its label files give" if report.identical
                     else "files differ from the bundle (listed above)")
    if report.out is not None:
        lines.append(f"this {report.kind}'s own bundle: {report.out['path']} (content hash {report.out['content_hash']}; "
                     f"`report` of it says {'verified' if report.identical else 'replayed, different'})")
    return "\n".join(lines)


def register(sub: argparse._SubParsersAction) -> None:
    summary = "reproduce a StableToolBench score in one command: record a run into a sealed bundle, replay or re-score one"
    parser = add_command(sub, "score", cmd_score, summary=summary, mode=None, store_path=None)
    what = parser.add_argument_group("what to run (record)")
    what.add_argument("--config", "-c", help="the server's config: store, frozen caches, simulator, llm.upstreams for the agent and the judge")
    what.add_argument("--groups", help="comma-separated test groups, e.g. G1_instruction,G1_tool")
    what.add_argument("--method", help="upstream's method: CoT@1, DFS_woFilter_w2, ...")
    what.add_argument("--agent-model", help="the agent's model name (chatgpt_function: it must start with 'gpt')")
    what.add_argument("--backbone", default="chatgpt_function", help="chatgpt_function (default) or toolllama_vllm (/v1/completions)")
    what.add_argument("--judge-model", help="the judge's model (default: the evaluator's config.yaml completions_kwargs.model)")
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
    again = parser.add_argument_group("replay or re-score a bundle")
    again.add_argument("--replay", metavar="BUNDLE", help="run inference and evaluation again from the bundle's records; exit 0 iff identical")
    again.add_argument("--rescore", metavar="BUNDLE", help="run the evaluation again over the bundle's answers; exit 0 iff identical")
    how = parser.add_argument_group("how")
    how.add_argument("--stabletoolbench", required=True, help="a StableToolBench checkout (its scripts run from there, unmodified)")
    how.add_argument("--tools", help="the tools folder (default: the checkout's toolenv/tools, else server/tools)")
    how.add_argument("--python", help="the Python with StableToolBench's requirements (default: this one)")
    how.add_argument("--stand-ins", action="store_true",
                     help="answer the GPU modules upstream imports but an API-model agent never calls (torch, transformers, ...) with placeholders")
    how.add_argument("--seed", type=int, default=42, help="random.seed and PYTHONHASHSEED of upstream's processes (default: %(default)s; a replay uses the bundle's)")
    how.add_argument("--keep-sleeps", action="store_true", help="keep upstream's own sleeps (skipped unless the real API is enabled)")
    how.add_argument("--timeout", type=float, help="the longest one upstream script may run, in seconds (default: no limit)")
    how.add_argument("--work", help="the work folder (default: BUNDLE.work beside --out; a temporary one for --replay/--rescore)")
    how.add_argument("--quiet", "-q", action="store_true", help="no progress bars or start-up summary")
    add_json_argument(parser)
