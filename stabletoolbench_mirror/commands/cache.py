"""``cache import``, ``cache export`` and ``cache stats``; ``cache ls``, ``show``, ``delete`` and ``diff`` come from :mod:`.curation`."""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import asdict

from stabletoolbench_mirror.commands.cli_common import (
    CommandError,
    add_config_arguments,
    add_json_argument,
    open_store,
    print_json,
    settings_from_args,
)


def cmd_cache_import(args: argparse.Namespace) -> int:
    from stabletoolbench_mirror.snapshots.tree_import import ImportFailed, import_tree
    from stabletoolbench_mirror.upstream.archives import ArchiveError, ArchiveLimits, is_archive, local_tree, manifest_problem
    from stabletoolbench_mirror.upstream.trees import frozen_cache_problem

    settings = settings_from_args(args)
    try:  # a snapshot archive or a URL to one: fetched into download_dir and checked first
        if is_archive(args.directory):
            args.directory = local_tree(args.directory, settings.resolve(settings.download_dir), progress=not args.quiet, limits=ArchiveLimits.of(settings))
    except ArchiveError as exc:
        raise CommandError(str(exc)) from None
    # a folder with no cache files (often one level above or below the tree) would import nothing
    problem = frozen_cache_problem(os.path.abspath(args.directory)) or manifest_problem(args.directory)
    if problem is not None:
        raise CommandError(problem)
    from stabletoolbench_mirror.factory import build_store

    with build_store(settings) as store:
        try:
            summary = import_tree(store, args.directory, progress=not args.quiet, allow_symlinks=settings.allow_symlinks, jobs=args.jobs,
                                  max_file_bytes=int(settings.frozen_max_file_mb * 1024 * 1024))
        except ImportFailed as exc:
            raise CommandError(str(exc), status=1) from None
        except KeyboardInterrupt:
            print("interrupted: the entries written so far are kept; run the same command again to go on "
                  "(entries already present are skipped)", file=sys.stderr)
            return 130
    if args.json:
        print_json({"source": args.directory, **summary.to_json()})
    else:
        print("\n".join(summary.lines()))
    return 1 if summary.bad_files else 0


def cmd_cache_export(args: argparse.Namespace) -> int:
    if args.format == "chat-jsonl":
        return _export_chat(args)
    if args.style or args.source or args.category:
        raise CommandError("--style, --source and --category belong to --format chat-jsonl")
    from stabletoolbench_mirror.snapshots.tree_export import export_tree

    with open_store(args) as store:
        summary = export_tree(store, args.directory, progress=not args.quiet)
    incomplete = bool(summary.left_out) and not args.skip_unsafe
    if args.json:
        print_json({"out": args.directory, "format": "tree", "ok": not incomplete, **summary.to_json()})
    else:
        print("\n".join(summary.lines()))
    if incomplete:
        raise CommandError("the export is incomplete (--skip-unsafe accepts that)", status=1)
    return 0


def _export_chat(args: argparse.Namespace) -> int:
    from stabletoolbench_mirror.factory import build_store
    from stabletoolbench_mirror.snapshots.chat_export import export_chat_jsonl

    if not args.style:
        raise CommandError("--format chat-jsonl needs --style mirrorapi-sft, mirrorapi-cot or mirrorapi-cache")
    if os.path.isdir(args.directory):
        raise CommandError(f"{args.directory} is a folder; chat-jsonl is written to a file (e.g. train.jsonl)")
    settings = settings_from_args(args)
    started = time.perf_counter()
    with build_store(settings, read_only=True) as store:
        summary = export_chat_jsonl(
            store, args.directory, settings, style=args.style, source=args.source, categories=args.category, progress=not args.quiet
        )
    if args.json:
        print_json({"out": args.directory, "format": "chat-jsonl", "style": args.style, **asdict(summary),
                    "elapsed_s": round(time.perf_counter() - started, 3)})
    else:
        print("\n".join(summary.lines()))
    return 0


def cmd_cache_stats(args: argparse.Namespace) -> int:
    from stabletoolbench_mirror.snapshots.tree_export import store_stats

    # counting writes nothing: a diskcache folder through a read-only SQLite connection (a server may
    # hold it open meanwhile), Redis through reads only (HGETALL, SCARD, INFO); a StoreError is the command line's exit 2
    with open_store(args) as store:
        stats = store_stats(store)
    if args.json:
        print_json(stats)
        return 0
    print(f"entries: {stats['entries']}  apis: {stats['apis']}  (from {stats['counted_by']})")
    if stats["bytes_per_entry"] is not None:
        size = stats["disk_bytes"] if stats["disk_bytes"] is not None else stats["memory_bytes"]
        where = "on disk" if stats["disk_bytes"] is not None else "in memory"
        print(f"size: {size / 1e6:,.1f} MB {where}, {stats['bytes_per_entry']:,} bytes per entry")
    print(f"failure records: {stats['failure_records']}  answers that replaced one: {stats['replaced_failures']}")
    for reason, n in (stats["failure_reasons"] or {}).items():
        print(f"  {n:>8}  {reason}")
    print("by source:")
    for source, n in stats["by_source"].items():
        print(f"  {source:<10} {n}")
    print("by category:")
    for category, n in stats["by_category"].items():
        print(f"  {category:<40} {n}")
    return 0


def _jobs(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 64:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of processes from 0 to 64")
    return value


def register(sub: argparse._SubParsersAction) -> None:
    cache = sub.add_parser("cache", help="import, export and inspect the response store")
    cache_sub = cache.add_subparsers(dest="cache_command", required=True)
    imp = cache_sub.add_parser("import", help="copy an upstream tool_response_cache tree into the store")
    imp.add_argument("directory", help="a tool_response_cache tree, a snapshot archive (.tar.gz), or an http(s):// URL to one [#sha256=<hex>]")
    imp.add_argument("--jobs", "-j", type=_jobs, metavar="N",
                     help="processes that parse the files while this one writes (default: one per core, at most 4, "
                          "for a tree of 16 MB or more; 0: parse in this process)")
    exp = cache_sub.add_parser(
        "export", help="write the store as an upstream tool_response_cache tree, or as chat training data (--format chat-jsonl)"
    )
    exp.add_argument("directory", metavar="OUT", help="the tree's folder (tree), or the .jsonl file (chat-jsonl)")
    exp.add_argument("--format", choices=["tree", "chat-jsonl"], default="tree", help="tree (default) or chat-jsonl")
    exp.add_argument("--style", choices=["mirrorapi-sft", "mirrorapi-cot", "mirrorapi-cache"], help="chat-jsonl: the prompt style")
    exp.add_argument("--source", choices=["real", "simulated", "imported"], help="chat-jsonl: only records of this source")
    exp.add_argument("--category", action="append", help="chat-jsonl: only this category (standardised name; repeatable)")
    exp.add_argument("--skip-unsafe", action="store_true", help="exit 0 even when entries had to be left out (API names too long for a file name)")
    stats = cache_sub.add_parser("stats", help="count the store's entries")
    for p, fn in ((imp, cmd_cache_import), (exp, cmd_cache_export), (stats, cmd_cache_stats)):
        add_config_arguments(p)
        add_json_argument(p)
        p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
        p.set_defaults(func=fn)
    from stabletoolbench_mirror.commands.curation import register_cache

    register_cache(cache_sub)  # ls, show, delete, diff
