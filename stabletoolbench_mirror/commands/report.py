"""``report SOURCE [SOURCE_B] [--html OUT.html] [--json] [--json-out OUT.json]``: the command line of a report.

What a report reads and computes lives in :mod:`stabletoolbench_mirror.reporting` (a store, a snapshot, a
score bundle, an archive of either, a running server; two bundles side by side); this module parses the
arguments, writes the page and the JSON, prints a summary and says how it went (exit status 0, 1 for a
bundle that is not as sealed or two bundles that differ, 2 for a source that cannot be read).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from typing import Any

from stabletoolbench_mirror.commands.cli_common import (
    CommandError,
    add_archive_limit_arguments,
    add_command,
    add_config_arguments,
    archive_limits,
    print_json,
    settings_from_args,
)
from stabletoolbench_mirror.config import ConfigError
from stabletoolbench_mirror.core.files import write_text
from stabletoolbench_mirror.reporting.server import MAX_MB
from stabletoolbench_mirror.reporting.sources import collect, collect_pair
from stabletoolbench_mirror.reporting.tally import ReportError


def summary_lines(report: dict[str, Any]) -> Iterable[str]:
    source = report["source"]
    yield f"source:        {source['kind']} {source['location']}"
    if report["bundle"]:
        yield from _bundle_lines(report)
    elif report["environment"]:
        yield f"content hash:  {report['environment']['content_hash']}"
    if report["records"]:
        records = report["records"]
        yield f"tool answers:  {records['entries']} (failure records {records['failures']}; simulated {100 * records['simulated']['share']:.1f}%)"
        yield "by source:     " + ", ".join(f"{k} {v}" for k, v in records["by_source"].items())
    if report["requests"]:
        requests = report["requests"]
        yield f"requests:      {requests['requests']}"
        yield "answered by:   " + ", ".join(f"{k} {v}" for k, v in requests["answered"].items() if v)
    if report["models"] and report["models"]["models"]:
        models = report["models"]
        yield (f"model calls:   {models['calls']} ({', '.join(row['model'] for row in models['models'])}; "
               f"{models['prompt_tokens']} prompt + {models['completion_tokens']} completion tokens)")
    if report.get("mcp"):
        yield from mcp_lines(report["mcp"])
    for problem in report["problems"]:
        yield f"PROBLEM:       {problem}"


def _plain(value: Any) -> str:
    """A server's name for a terminal: its control characters as ``?`` (a server names its own tools)."""
    return "".join("?" if ch < " " or ch == "\x7f" else ch for ch in str(value))


def mcp_lines(mcp: dict[str, Any]) -> Iterable[str]:
    """One line per live MCP server, then one per tool its latest drift record says drifted."""
    for server, s in mcp["servers"].items():
        listed = ("no tools/list recorded" if s["tools_listed"] is None
                  else f"{s['tools_listed']} tools listed ({s['listed_at'] or 'not recorded'})")
        sources = ", ".join(f"{k} {v}" for k, v in s["calls_by_source"].items() if v)
        last = s["last_verified"]
        verified = ("never verified" if last is None
                    else f"last verified {last['at']}: {'DRIFTED' if last['drifted'] else 'unchanged'}")
        yield (f"mcp server {_plain(server)}: {listed}, {s['tools_called']} called, {s['calls']} calls"
               f"{f' ({sources})' if sources else ''}, {verified}")
        if s["drift"] and s["drift"][-1]["drifted"]:
            yield from _drift_lines(s["drift"][-1])


def _drift_lines(drift: dict[str, Any]) -> Iterable[str]:
    """One line per tool a drift record names (its schema's fields, then its answers'), and its error."""
    when = f"{drift['seen']} {drift['at']}"
    for what in ("schema", "answers"):
        for tool, fields in drift[what].items():
            yield f"  drifted ({when}): {_plain(tool)} {what}: {_plain(', '.join(fields))}"
    if drift["error"]:
        yield f"  drift error ({when}): {_plain(drift['error'])}"


def _bundle_lines(report: dict[str, Any]) -> Iterable[str]:
    bundle, score = report["bundle"], report["score"]
    yield f"run:           {bundle['label']} ({', '.join(bundle['groups'] or [])})"
    if score["evaluated"]:
        yield "SoPR:          " + ", ".join(f"{g} {r['solve_rate']:.1f}%" for g, r in score["pass_rate"].items()) + (
            f"; average {score['pass_rate_average']:.1f}%" if score["pass_rate_average"] is not None else "")
        yield "SoWR:          " + _win_rates(report)
    else:
        yield "SoPR:          not evaluated (no score.json)"
    verification = bundle["verification"]
    replayed = f" ({verification['kind']} of {verification['replayed']})" if verification["replayed"] else ""
    yield f"verification:  {verification['status']}{replayed}"
    yield f"records hash:  {report['environment']['records_hash']}"
    yield f"bundle hash:   {report['environment']['bundle_hash']} ({'sealed' if bundle['sealed'] else 'CHANGED since its seal'})"


def _win_rates(report: dict[str, Any]) -> str:
    score, reference = report["score"], report["bundle"].get("reference")
    if not score["win_rate"]:
        return "not evaluated (the run named no reference)"
    named = reference.get("label") if isinstance(reference, dict) else reference
    average = score["win_rate_average"]
    return (", ".join(f"{g} {100 * w['win']:.1f}%" for g, w in score["win_rate"].items())
            + (f"; average {100 * average:.1f}%" if average is not None else "") + f" (against {named})")


def pair_lines(pair: dict[str, Any]) -> Iterable[str]:
    for side in ("a", "b"):
        report = pair[side]
        yield f"{side.upper()}:             {report['bundle']['label']} {report['source']['location']} ({report['environment']['bundle_hash']})"
    for group, c in pair["comparison"]["groups"].items():
        rates = " -> ".join("-" if r is None else f"{r:.1f}%" for r in (c["solve_rate_a"], c["solve_rate_b"]))
        yield (f"{group}: SoPR {rates}; answers differ {len(c['answers_differ'])}, only in A {len(c['answers_only_a'])}, "
               f"only in B {len(c['answers_only_b'])}; labels differ {len(c['labels_differ'])}")
    yield "records:       " + ("the same" if pair["comparison"]["records"]["same"] else "differ")
    replay = pair["comparison"]["replay"]
    if replay is not None:
        yield f"replay:        {replay['by'].upper()} is the {replay['kind']} of {replay['replayed'].upper()}: {replay['status']}"
    for side in ("a", "b"):
        for problem in pair[side]["problems"]:
            yield f"PROBLEM ({side.upper()}):   {problem}"
    yield "the two bundles agree" if pair["comparison"]["same"] else "the two bundles differ"


def cmd_report(args: argparse.Namespace) -> int:
    """Report how each call was answered (cache, store, real API, simulator, local tool, failure, fault), per category and
    tool, the simulated share of tool answers, the agent's and the judge's model calls with their tokens, failures,
    faults, the slowest APIs and a snapshot's content hash; for a score bundle its score, labels and environment hash;
    for two bundles where they differ. See docs/report.md."""
    _check_arguments(args)
    try:
        report, page, lines, ok = _gathered(args)
    except (ReportError, ConfigError) as exc:
        raise CommandError(str(exc)) from None
    if args.json_out:
        write_text(args.json_out, json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    if args.html:
        write_text(args.html, page)
    out = sys.stderr if args.json else sys.stdout
    for line in lines + [f"written:       {path}" for path in (args.html, args.json_out) if path]:
        print(line, file=out)
    if args.json:
        print_json(report)
    return 0 if ok else 1


def _check_arguments(args: argparse.Namespace) -> None:
    if not (args.html or args.json or args.json_out):
        raise CommandError("say where the report goes: --html OUT.html, --json (printed) and/or --json-out OUT.json")
    if not (args.timeout > 0 and args.max_mb > 0):
        raise CommandError("--timeout and --max-mb must be above 0")


def _gathered(args: argparse.Namespace) -> tuple[dict[str, Any], str, list[str], bool]:
    """The report of ``args.source`` (or of two bundles), its page, its summary lines, and whether it is all well."""
    from stabletoolbench_mirror.reporting.score_page import render, render_pair

    settings = settings_from_args(args)
    limits = archive_limits(args, settings)
    if args.source_b is not None:
        pair = collect_pair(args.source, args.source_b, settings, progress=not args.quiet, limits=limits)
        return pair, render_pair(pair), list(pair_lines(pair)), pair["comparison"]["same"]
    report = collect(args.source, settings, timeout_s=args.timeout, max_bytes=int(args.max_mb * 2**20), progress=not args.quiet,
                     limits=limits)
    return report, render(report), list(summary_lines(report)), not report["problems"]


def register(sub: argparse._SubParsersAction) -> None:
    parser = add_command(sub, "report", cmd_report, summary="one self-contained HTML page (and JSON) of a store, snapshot, score bundle or running server; two bundles side by side")
    parser.add_argument("source", nargs="?", default="store",
                        help="store (default: the configured store), a diskcache folder, redis://..., a snapshot folder, a score "
                             "bundle folder, an archive of either (.tar.gz or a URL to one), or a running server's http://HOST:PORT")
    parser.add_argument("source_b", nargs="?", metavar="BUNDLE_B", help="a second score bundle: the two side by side")
    parser.add_argument("--html", metavar="OUT.html", help="write the page here")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object on stdout (see docs/report.md)")
    parser.add_argument("--json-out", metavar="OUT.json", help="write the same JSON to a file")
    parser.add_argument("--timeout", type=float, default=30.0,
                        help="seconds for the whole fetch of a server's /stats and /health (default 30)")
    parser.add_argument("--max-mb", type=float, default=MAX_MB,
                        help=f"the most a server's /stats (or /health) may be, MiB; larger is refused (default {MAX_MB:g})")
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    add_archive_limit_arguments(parser)
    add_config_arguments(parser)
