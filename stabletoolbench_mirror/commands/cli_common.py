"""Command-line helpers every command module shares: a command's parser (:func:`add_command`), the config options
and the settings they give, the store a command reads, the ``--json`` report.

Every command module imports this module; nothing imports :mod:`stabletoolbench_mirror.commands.cli`,
which only assembles the commands.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from stabletoolbench_mirror.config import Mode, Settings, load_settings

if TYPE_CHECKING:
    from stabletoolbench_mirror.stores.base import Store
    from stabletoolbench_mirror.upstream.archive_limits import ArchiveLimits

#: what ``score`` and ``report`` let a bundle or archive they fetch be by default: unpacked, downloaded (MiB), unpacked per byte
MAX_UNPACKED_MB, MAX_DOWNLOAD_MB, MAX_RATIO = 4096.0, 2048.0, 100.0


class CommandError(Exception):
    """What ends a command early: ``error: <message>`` on stderr, exit status ``status`` (2: what the user must fix first)."""

    def __init__(self, message: str, status: int = 2) -> None:
        super().__init__(message)
        self.status = status


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", "-c", help="config file (default: $STM_CONFIG, ./server_config.yml, else StableToolBench's ./config.yml)")
    parser.add_argument("--mode", choices=[m.value for m in Mode], help="override 'mode'")
    parser.add_argument("--store-path", help="override 'store.path' (diskcache folder)")


def add_answer_file_arguments(parser: Any, *, queries: str = "query files or folders mapping answer-file function names to APIs") -> None:
    """``--answers``, ``--queries`` and ``--tools-folder``, as every command that reads StableToolBench's run files takes them."""
    parser.add_argument("--answers", action="append", metavar="PATH", help="StableToolBench answer files or folders (repeatable)")
    parser.add_argument("--queries", action="append", metavar="PATH", help=f"{queries} (repeatable)")
    parser.add_argument("--tools-folder", help="a ToolBench tools folder, also used to map answer-file function names (default: 'tools_folder')")


def _above_zero(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text}: must be above 0")
    return value


def add_archive_limit_arguments(parser: Any) -> None:
    """``--max-unpacked-mb``, ``--max-download-mb`` and ``--max-ratio``: how large a bundle or archive a command fetches may be."""
    parser.add_argument("--max-unpacked-mb", type=_above_zero, default=MAX_UNPACKED_MB,
                        help="the most an archive (.tar.gz, or a URL to one) may unpack to, MiB; a larger one is refused and nothing "
                             "of it kept (default: %(default)g, 4 GiB)")
    parser.add_argument("--max-download-mb", type=_above_zero, default=MAX_DOWNLOAD_MB,
                        help="the largest archive downloaded from a URL, MiB; a larger one is stopped and nothing of it kept "
                             "(default: %(default)g, 2 GiB)")
    parser.add_argument("--max-ratio", type=_above_zero, default=MAX_RATIO,
                        help="the most an archive may unpack to per byte of it, counted as it unpacks (past 16 MiB): more is "
                             "refused as an archive bomb (default: %(default)g)")


def archive_limits(args: argparse.Namespace, settings: Settings | None = None) -> ArchiveLimits:
    """The :class:`~stabletoolbench_mirror.upstream.archive_limits.ArchiveLimits` of :func:`add_archive_limit_arguments`'s
    flags (the settings' others, when given), each refusal naming its flag."""
    import dataclasses

    from stabletoolbench_mirror.upstream.archive_limits import ArchiveLimits, LimitNames

    unpacked = int(args.max_unpacked_mb * 2**20)
    names = LimitNames(member="--max-unpacked-mb", total="--max-unpacked-mb", ratio="--max-ratio", download="--max-download-mb")
    return dataclasses.replace(ArchiveLimits() if settings is None else ArchiveLimits.of(settings), max_member_bytes=unpacked,
                               max_total_bytes=unpacked, download_max_bytes=int(args.max_download_mb * 2**20),
                               max_ratio=args.max_ratio, names=names)


def print_json(data: Any) -> None:
    """A command's ``--json`` report on stdout: one JSON document (schemas: docs/json-output.md)."""
    import json

    print(json.dumps(data, indent=2, ensure_ascii=False))


def print_report(report: Any, json_to: str | None) -> None:
    """A check's report (``lines()``, ``to_json()``) as text, and as JSON to the ``--json`` file (``--json`` alone: only
    the JSON, printed)."""
    import json

    if json_to == "-":
        print(json.dumps(report.to_json(), ensure_ascii=False))
        return
    print("\n".join(report.lines()))
    if json_to:
        with open(json_to, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(report.to_json(), indent=2, ensure_ascii=False) + "\n")


def add_json_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object (see docs/json-output.md)")


def settings_from_args(args: argparse.Namespace, **extra: Any) -> Settings:
    """The settings of ``--config``, with ``--mode``, ``--store-path`` and ``extra`` (when not ``None``) on top."""
    overrides: dict[str, Any] = {"mode": getattr(args, "mode", None)}
    if getattr(args, "store_path", None):
        overrides["store"] = {"path": os.path.abspath(args.store_path)}
    overrides.update({k: v for k, v in extra.items() if v is not None})
    return load_settings(args.config, overrides=overrides)


def open_store(args: argparse.Namespace, *, read_only: bool = True) -> Store:
    """The store a command reads: opened read-only, so a mistyped path is an error (exit 2), never an empty store made there."""
    from stabletoolbench_mirror.factory import build_store

    return build_store(settings_from_args(args), read_only=read_only)


def add_command(sub: Any, name: str, func: Callable[[argparse.Namespace], int], *, summary: str, **defaults: Any) -> argparse.ArgumentParser:
    """Command ``name``, run by ``func``: ``summary`` is its line in the list of commands, ``func``'s docstring
    its ``--help`` description (argparse folds the docstring's lines and indentation into paragraphs of its own;
    under ``python -OO``, which drops docstrings, the summary)."""
    parser: argparse.ArgumentParser = sub.add_parser(name, help=summary, description=func.__doc__ or summary)
    parser.set_defaults(func=func, **defaults)
    return parser
