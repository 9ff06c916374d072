"""``stabletoolbench-mirror warm``: the command line over :mod:`stabletoolbench_mirror.warming` (the plan, the runners and the report)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from typing import Any

from stabletoolbench_mirror.commands.cli_common import (
    CommandError,
    add_answer_file_arguments,
    add_command,
    add_config_arguments,
    add_json_argument,
    print_json,
    settings_from_args,
)
from stabletoolbench_mirror.config import Mode
from stabletoolbench_mirror.core.logs import setup_logging
from stabletoolbench_mirror.engine.layer import MirrorLayer
from stabletoolbench_mirror.factory import build_layer
from stabletoolbench_mirror.upstream.answers import function_index
from stabletoolbench_mirror.warming.inputs import add_answers, add_payloads, add_queries
from stabletoolbench_mirror.warming.plan import WarmInputError, WarmPlan, WarmReport
from stabletoolbench_mirror.warming.pool import default_processes, run_warm_processes
from stabletoolbench_mirror.warming.runner import STOP_AFTER_FAILURES, run_warm, warm_settings


def cmd_warm(args: argparse.Namespace) -> int:
    """Make the calls a StableToolBench run will make and record their answers: the default call of every API in query
    files, the calls in answer files, or /virtual payloads. Cached calls are skipped (resumable); the rest go through
    the real API -> simulator chain."""
    from stabletoolbench_mirror.startup.checks import start_checks

    _check_arguments(args)
    settings = warm_settings(settings_from_args(args), args.concurrency)
    setup_logging("warning" if not args.verbose else "info", settings.secrets())
    if not settings.save:
        raise CommandError("'save' is false: warming would record nothing")
    # the start-up checks of serve: wrong paths and a simulator without tool docs stop here;
    # endpoints that do not answer are a warning (the first calls then show it: see --stop-after-failures)
    if not start_checks(settings, probe_endpoints=args.engine != "vllm-offline" and not args.dry_run):
        return 2
    layer, processes = _engine(args, settings)
    try:
        plan = build_plan(args, settings, layer.prepare)
        if not layer.responders and not args.dry_run:
            raise CommandError("neither the real API nor the simulator is enabled: nothing can answer a miss")
        report = _run(args, settings, layer, plan, processes)
    except WarmInputError as exc:
        raise CommandError(str(exc)) from None
    finally:
        layer.close()
    return _print_report(args, report)


def _check_arguments(args: argparse.Namespace) -> None:
    if not (args.queries or args.answers or args.payloads):
        raise CommandError("give at least one input: --queries, --answers or --payloads")
    if args.concurrency is None:
        args.concurrency = 256 if args.engine == "vllm-offline" else 8
    if args.concurrency < 1:
        raise CommandError("--concurrency must be at least 1")
    if args.mode == Mode.REPLAY:
        raise CommandError("warm records answers; it cannot run in replay mode")
    if args.engine == "vllm-offline" and args.processes not in (None, 1):
        raise CommandError("--engine vllm-offline runs in one process (vLLM batches the calls)")
    if args.engine != "vllm-offline" and args.model:
        raise CommandError("--model is for --engine vllm-offline")
    if args.processes is not None and args.processes < 1:
        raise CommandError("--processes must be at least 1")


def _engine(args: argparse.Namespace, settings: Any) -> tuple[MirrorLayer, int]:
    """The layer that makes the calls, and the number of processes to make them in."""
    if args.engine != "vllm-offline":
        processes = default_processes(args.concurrency) if args.processes is None else args.processes
        return build_layer(settings), processes
    from stabletoolbench_mirror.warming.offline import OfflineEngineError, offline_layer

    try:
        layer = offline_layer(settings, model=args.model, concurrency=args.concurrency, llm_options=vllm_options(args.vllm_option or []))
    except (OfflineEngineError, ValueError) as exc:
        raise CommandError(str(exc)) from None
    return layer, 1


def build_plan(args: argparse.Namespace, settings: Any, prepare: Callable[[Any], Any]) -> WarmPlan:
    plan = WarmPlan()
    if args.queries:
        add_queries(plan, args.queries, include_optional=args.include_optional)
    if args.answers:
        tools = args.tools_folder or (settings.resolve(settings.tools_folder) if settings.tools_folder else None)
        try:
            index = function_index([*(args.queries or []), *(args.index or [])], tools)
        except ValueError as exc:
            raise WarmInputError(str(exc)) from None
        add_answers(plan, args.answers, index, prepare)
    if args.payloads:
        add_payloads(plan, args.payloads, prepare)
    return plan


def _run(args: argparse.Namespace, settings: Any, layer: MirrorLayer, plan: WarmPlan, processes: int) -> WarmReport:
    if args.dry_run:
        return run_warm(layer, cached_only(layer, plan), concurrency=1, progress=False)
    stop_after = args.stop_after_failures
    if processes > 1:
        layer.close()  # the workers open their own store connections; none is carried across fork
        return run_warm_processes(
            settings, plan, concurrency=args.concurrency, processes=processes, progress=not args.quiet, stop_after_failures=stop_after
        )
    return run_warm(layer, plan, concurrency=args.concurrency, progress=not args.quiet, stop_after_failures=stop_after)


def _print_report(args: argparse.Namespace, report: WarmReport) -> int:
    if args.json:
        total = report.total
        print_json({**report.as_json(), "dry_run": args.dry_run, "to_make": total.calls - total.cached if args.dry_run else None})
    else:
        _print_table(args, report)
    if args.failures:
        with open(args.failures, "w", encoding="utf-8") as fh:
            for failure in report.failures:
                fh.write(json.dumps(failure.as_json(), ensure_ascii=False) + "\n")
    if report.interrupted:
        return 130
    if report.stopped:
        return 2
    return 1 if report.failures else 0


def _print_table(args: argparse.Namespace, report: WarmReport) -> None:
    print(report.table())
    if args.dry_run:
        total = report.total
        print(f"dry run: {total.calls - total.cached} of {total.calls} distinct calls would be made")
    for failure in report.failures[: args.show_failures]:
        print(f"FAILED {failure.location}: {failure.reason}")
    if len(report.failures) > args.show_failures:
        print(f"... {len(report.failures) - args.show_failures} more failures" + ("" if args.failures else " (write them all with --failures FILE)"))
    if args.verbose:
        for skipped in report.skipped:
            print(f"SKIPPED {skipped.location}: {skipped.reason}")


def vllm_options(items: Sequence[str]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs (values read as YAML: numbers, booleans, strings) for ``vllm.LLM``."""
    import yaml

    options: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--vllm-option expects KEY=VALUE, got {item!r}")
        try:
            options[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError:
            options[key.strip()] = value
    return options


def cached_only(layer: MirrorLayer, plan: WarmPlan) -> WarmPlan:
    """``--dry-run``: count what is cached; report the rest as to do without calling anything."""
    dry = WarmPlan(counts=plan.copy_counts(), skipped=list(plan.skipped))
    dry.items = [item for item in plan.items if layer.settled(item.call)]
    return dry


def register(sub: argparse._SubParsersAction) -> None:
    parser = add_command(sub, "warm", cmd_warm, summary="fill the store from query files, answer files or payloads before a run")
    add_answer_file_arguments(parser, queries="StableToolBench query files or folders (their APIs' default calls)")
    parser.add_argument("--payloads", action="append", metavar="FILE.jsonl", help="JSONL of /virtual bodies (repeatable)")
    parser.add_argument("--index", action="append", metavar="PATH", help="query files used only to map answer-file function names")
    parser.add_argument("--include-optional", action="store_true", help="default calls also fill the optional parameters")
    parser.add_argument("--concurrency", "-j", type=int, help="calls in flight; the offline engine's batch size (default 8; 256 with vllm-offline)")
    parser.add_argument(
        "--processes", type=int, help="worker processes sharing the concurrency (default: one per 64 in flight, at most one per two CPUs)"
    )
    parser.add_argument("--engine", choices=["http", "vllm-offline"], default="http", help="http: the configured chain (default); vllm-offline: in-process vLLM")
    parser.add_argument("--model", help="model path or name for --engine vllm-offline")
    parser.add_argument("--vllm-option", action="append", metavar="KEY=VALUE", help="extra vllm.LLM() argument, e.g. max_model_len=8192 (repeatable)")
    parser.add_argument("--failures", metavar="FILE.jsonl", help="write the failed calls here (usable again as --payloads)")
    parser.add_argument("--show-failures", type=int, default=20, help="failures to print (default 20)")
    parser.add_argument(
        "--stop-after-failures", type=int, default=STOP_AFTER_FAILURES, metavar="N",
        help=f"stop early when the first N calls all fail for the same cause (default {STOP_AFTER_FAILURES}; 0: never)",
    )
    parser.add_argument("--dry-run", action="store_true", help="count the calls and what is cached; call nothing")
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    parser.add_argument("--verbose", "-v", action="store_true", help="log more, list skipped calls")
    add_json_argument(parser)
    add_config_arguments(parser)
