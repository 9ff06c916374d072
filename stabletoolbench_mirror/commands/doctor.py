"""``stabletoolbench-mirror doctor``: the start-up checks (:mod:`stabletoolbench_mirror.startup`) alone, without serving;
``doctor --keys``: the store scanned for records written under another kind's key."""

from __future__ import annotations

import argparse
import sys

from stabletoolbench_mirror.commands.cli_common import add_command, add_config_arguments, add_json_argument, print_json, settings_from_args
from stabletoolbench_mirror.config import Settings
from stabletoolbench_mirror.startup.checks import inspect
from stabletoolbench_mirror.startup.key_report import planted_records, render


def cmd_doctor(args: argparse.Namespace) -> int:
    """Run every start-up check: frozen caches (with a hint when a path is one level off), the tools folder, the store, the
    real API relay and the simulator endpoints. Exit status 1 on any error."""
    settings = settings_from_args(args)
    if args.keys:
        return _doctor_keys(settings)
    report = inspect(settings, probe_endpoints=not args.no_probe, open_store=True, full_counts=True)
    if args.json:
        print_json(report.as_json())
        return 1 if report.errors else 0
    print(report.render("stabletoolbench-mirror doctor"))
    if report.errors:
        print(f"{len(report.errors)} error(s), {len(report.warnings)} warning(s)")
        return 1
    print(f"no errors, {len(report.warnings)} warning(s)")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    summary = "check a configuration without serving (paths, tool docs, store, endpoints)"
    parser = add_command(sub, "doctor", cmd_doctor, summary=summary)
    add_config_arguments(parser)
    parser.add_argument("--no-probe", action="store_true", help="do not contact the relay or the simulator")
    add_json_argument(parser)
    parser.add_argument(
        "--keys", action="store_true",
        help="scan the store once for records a string input wrote under another kind's key (exit 1 when any)",
    )


def _doctor_keys(settings: Settings) -> int:
    from stabletoolbench_mirror.factory import build_store

    with build_store(settings) as store:
        found = list(planted_records(store, progress=sys.stderr.isatty()))
    print(render(found))
    return 1 if found else 0
