"""Reproducibility reports: replay recorded calls and compare the answers with what was observed.

``stabletoolbench-mirror check`` takes

* a JSONL file of ``{"payload": <the /virtual body>, "observed": <the answer>}`` lines
  (``observed`` may also be the observation *text* the agent saw), or
* StableToolBench answer files / folders (each call's arguments and recorded observation),

sends each call to a running server (``--url``) or to the layer in-process (built from the
settings, in ``replay`` mode unless ``--mode record`` is given, so a check records nothing),
and reports per API how many answers are **identical**, **different** or a **miss**
(nothing recorded for the call); of the identical ones, how many are failures
(``identical_failure``: a failure record replayed, so both runs saw the same failure).  The answer compared is what the StableToolBench client
makes of the HTTP reply: the JSON body for a 200, its ``request invalid`` error otherwise.
The exit status is 1 when anything differs or misses (unless ``--report-only``): the
report a user attaches to a score.  Injected faults (``faults:``) are left out, so the answers are
compared with the unfaulted record (a server is asked with ``X-STM-Faults: off``);
``--with-faults`` compares with the faulted answers instead.

``check --apibank DIALOGUES`` replays API-Bank's dialogues instead, each call scored with the API's own check
(:mod:`stabletoolbench_mirror.checking.apibank`).
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections.abc import Iterable
from pathlib import Path

from stabletoolbench_mirror.checking.replay import CheckReport, LayerTarget, Target, UrlTarget, run_check
from stabletoolbench_mirror.commands.cli_common import (
    CommandError,
    add_answer_file_arguments,
    add_command,
    add_config_arguments,
    print_report,
    settings_from_args,
)
from stabletoolbench_mirror.config import Mode, Settings
from stabletoolbench_mirror.factory import build_layer
from stabletoolbench_mirror.upstream.answers import DEFAULT_MAX_OBSERVATION_LENGTH, function_index
from stabletoolbench_mirror.upstream.expectations import CheckInputError, Expectation, iter_calls_jsonl, load_answer_expectations


def cmd_check(args: argparse.Namespace) -> int:
    """Replay a JSONL of {payload, observed} calls or StableToolBench answer files against a running server (--url) or the
    layer in-process (replay mode), and report per API. Exit status 1 when anything differs or misses."""
    if args.apibank:
        return _cmd_apibank_check(args, settings_from_args(args, mode=args.mode or Mode.REPLAY))
    if not args.calls and not args.answers:
        raise CommandError("give --calls FILE.jsonl and/or --answers PATH (or --apibank DIALOGUES)")
    settings = settings_from_args(args, mode=args.mode or Mode.REPLAY)
    report = CheckReport()
    try:
        expectations, total = _expectations(args, settings, report)
    except ValueError as exc:  # CheckInputError, and the answer files' function index
        raise CommandError(str(exc)) from None
    if args.url:
        token = settings.auth_token.get_secret_value() if settings.auth_token else None
        try:
            target: Target = UrlTarget(args.url, token=token, with_faults=args.with_faults, connections=args.concurrency)
        except CheckInputError as exc:  # a URL that is not http(s)://HOST:PORT
            raise CommandError(str(exc)) from None
    else:
        # in replay mode without responders: nothing may fill a miss anyway
        layer = build_layer(settings, responders=[] if settings.mode is Mode.REPLAY else None)
        target = LayerTarget(layer, with_faults=args.with_faults)
    try:
        run_check(
            expectations,
            target,
            max_observation_length=args.max_observation_length,
            report=report,
            concurrency=max(1, args.concurrency if args.url else 1),
            progress=not args.quiet,
            total=total,
        )
    except CheckInputError as exc:
        raise CommandError(str(exc)) from None
    finally:
        target.close()
    print_report(report, args.json)
    return 0 if args.report_only or report.ok() else 1


def _expectations(args: argparse.Namespace, settings: Settings, report: CheckReport) -> tuple[Iterable[Expectation], int]:
    """The calls to replay (``--calls`` files read as the calls are sent, then ``--answers``) and how many there are;
    the answer files' problems go to ``report``."""
    expectations: list[Iterable[Expectation]] = []
    total = 0
    for path in args.calls or []:
        # read as the calls are sent; a first pass only counts lines (for the progress bar)
        total += _count_lines(path)
        expectations.append(iter_calls_jsonl(path))
    if args.answers:
        tools = args.tools_folder or (settings.resolve(settings.tools_folder) if settings.tools_folder else None)
        found, problems = load_answer_expectations(args.answers, function_index(args.queries or [], tools))
        expectations.append(found)
        total += len(found)
        report.problems.extend(problems)
    return itertools.chain.from_iterable(expectations), total


def _count_lines(path: str | Path) -> int:
    try:
        with open(path, "rb") as fh:
            return sum(1 for line in fh if line.strip())
    except OSError as exc:
        raise CheckInputError(f"{path}: cannot read: {exc}") from None


def register(sub: argparse._SubParsersAction) -> None:
    parser = add_command(sub, "check", cmd_check, summary="replay recorded calls and report identical / different / miss per API")
    parser.add_argument("--calls", action="append", metavar="FILE.jsonl", help='JSONL of {"payload", "observed"} lines (repeatable)')
    add_answer_file_arguments(parser)
    parser.add_argument("--url", help="a running server (http://HOST:PORT or .../virtual); default: the layer in-process")
    parser.add_argument(
        "--max-observation-length", type=int, default=DEFAULT_MAX_OBSERVATION_LENGTH, help="the client's cut for observation texts (1024)"
    )
    parser.add_argument("--json", metavar="FILE", nargs="?", const="-", help="also write the full report as JSON to FILE; alone: print it instead")
    parser.add_argument("--apibank", metavar="DIALOGUES", help="API-Bank dialogues (.jsonl file or folder): replay each in a session, score with each API's own check")
    parser.add_argument("--concurrency", type=int, default=8, help="calls in flight at once against --url (default 8)")
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    parser.add_argument("--report-only", action="store_true", help="exit 0 even when something differs")
    parser.add_argument(
        "--with-faults", action="store_true",
        help="compare the answers with the configured faults applied (default: the unfaulted record, see docs/faults.md)",
    )
    add_config_arguments(parser)


def _cmd_apibank_check(args: argparse.Namespace, settings: Settings) -> int:
    """``check --apibank DIALOGUES`` (see :mod:`stabletoolbench_mirror.checking.apibank`); imported only then."""
    from stabletoolbench_mirror.checking.apibank import (
        ApiBankReport,
        HttpSessions,
        LayerSessions,
        SessionTarget,
        dialogue_files,
        replay_dialogue,
        suite_for,
    )
    from stabletoolbench_mirror.core.progress import progress_bar

    try:
        files = dialogue_files(Path(args.apibank))
        suite = suite_for(settings, Path(args.apibank))
        if args.url:
            token = settings.auth_token.get_secret_value() if settings.auth_token else None
            target: SessionTarget = HttpSessions(args.url, token=token)
        else:
            if settings.apibank is None:
                raise ValueError("--apibank without --url runs the layer in-process: it needs apibank.path in the settings")
            target = LayerSessions(settings)
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    report = ApiBankReport()
    try:
        for path in progress_bar(files, desc="API-Bank dialogues", unit="dialogue", disable=args.quiet or args.json == "-", file=sys.stderr):
            replay_dialogue(target, suite, path, report)
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    finally:
        target.close()
    print_report(report, args.json)
    totals = report.totals()
    # the exit-code table (docs/json-output.md): 1 when the check found calls scored wrong (--report-only: 0)
    return 0 if args.report_only or (totals.correct == totals.total and not report.problems) else 1
