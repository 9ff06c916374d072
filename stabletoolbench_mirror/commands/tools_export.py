"""``stabletoolbench-mirror tools export``: the exact functions StableToolBench's agent is offered, per query.

One JSON line per query: ``{"group", "query_id", "functions", "apis"}`` (see
:mod:`stabletoolbench_mirror.upstream.functions` for how the functions are built).
"""

from __future__ import annotations

import json
import os
from typing import Any

from stabletoolbench_mirror.commands.cli_common import CommandError, add_config_arguments, add_json_argument, print_json, settings_from_args
from stabletoolbench_mirror.core.files import atomic_write
from stabletoolbench_mirror.core.progress import progress_bar
from stabletoolbench_mirror.upstream.functions import ToolsFolderError, UpstreamTools, export_line, iter_query_functions
from stabletoolbench_mirror.upstream.queries import QueryFileError
from stabletoolbench_mirror.upstream.tooldocs import tools_dir_problem

FORMATS = ("openai", "mcp")


def export_functions(queries: list[str], tools_dir: str, out_path: str, fmt: str, *, progress: bool = True) -> tuple[int, list[str]]:
    """Write the lines of every query in ``queries``; the number written and the queries upstream skips.

    The file appears whole or not at all (written beside it, then renamed).  Raises
    :class:`QueryFileError` or :class:`ToolsFolderError` (both ``ValueError``) before anything is written.
    """
    tools = UpstreamTools(tools_dir)
    written = 0
    skipped: list[str] = []
    with atomic_write(out_path) as out:
        for item in progress_bar(iter_query_functions(queries, tools), desc="queries", unit="query", disable=not progress):
            if isinstance(item, tuple):
                skipped.append("/".join(item))
                continue
            out.write(json.dumps(export_line(item, fmt), ensure_ascii=False) + "\n")
            written += 1
    return written, skipped


def cmd_tools_export(args: Any) -> int:
    tools_dir = args.tools
    if not tools_dir:
        settings = settings_from_args(args)
        if not settings.tools_folder:
            raise CommandError("no tools folder: give --tools DIR, or set tools_folder in the config")
        tools_dir = settings.resolve(settings.tools_folder)
    problem = tools_dir_problem(tools_dir)
    if problem is not None:  # e.g. the folder above the tools folder: the hint names the one to use
        raise CommandError(f"tools folder: {problem}")
    if os.path.isdir(args.out):
        raise CommandError(f"{args.out} is a folder; the export is written to a file (e.g. functions.jsonl)")
    try:
        written, skipped = export_functions(args.queries, tools_dir, args.out, args.format, progress=not args.quiet)
    except (QueryFileError, ToolsFolderError) as exc:
        raise CommandError(str(exc)) from None
    except OSError as exc:
        raise CommandError(f"cannot write {args.out}: {exc}") from None
    if args.json:
        print_json({"out": args.out, "format": args.format, "queries": written, "skipped": skipped})
    else:
        _print_summary(args, written, skipped)
    if not written:
        raise CommandError(f"no query's functions were exported: check that --queries names query files and that "
                           f"{tools_dir} is the tools folder they were made with", status=1)
    return 0


def _print_summary(args: Any, written: int, skipped: list[str]) -> None:
    print(f"exported the functions of {written} queries to {args.out} ({args.format})")
    if skipped:
        shown = ", ".join(skipped[:5]) + (" ..." if len(skipped) > 5 else "")
        print(f"left out {len(skipped)} queries upstream's client skips (a tool not in the tools folder): {shown}")


def register(sub: Any) -> None:
    tools = sub.add_parser("tools", help="the functions StableToolBench's agent is offered")
    tools_sub = tools.add_subparsers(dest="tools_command", required=True)
    export = tools_sub.add_parser("export", help="write each query's functions (OpenAI tools or MCP tools) as one JSON line")
    export.add_argument("out", metavar="OUT.jsonl", help="the .jsonl file to write")
    export.add_argument("--queries", action="append", required=True, metavar="FILE|DIR",
                        help="a StableToolBench query file, or a folder of them (repeatable)")
    export.add_argument("--format", choices=FORMATS, default="openai",
                        help="openai: upstream's function entries exactly (default); mcp: clean JSON Schema tools")
    export.add_argument("--tools", metavar="DIR", help="the tools folder (default: tools_folder of the config)")
    add_config_arguments(export)
    export.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    add_json_argument(export)
    export.set_defaults(func=cmd_tools_export)
