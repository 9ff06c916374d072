"""``stabletoolbench-mirror mcp-verify``: a recorded MCP run's ``tools/list`` and calls asked of its live servers again.

Prints, per server, each tool whose schema changed (``added``, ``removed`` or the fields) and each tool whose
answers differ (the fields, JSON-aware, ``ignore_fields`` left out; see
:mod:`stabletoolbench_mirror.responders.mcp_live.drift`).  Exit 0: no drift; 1: drift, or a server that could
not be asked; 2: bad settings.  Each server's finding, drift or none, is kept in the store (``@mcp/<server>/@drift``,
:func:`~stabletoolbench_mirror.responders.mcp_live.tools.drift_record`; ``--no-record`` leaves the store as it is).
"""

from __future__ import annotations

import argparse
from typing import Any

from stabletoolbench_mirror.commands.cli_common import (
    CommandError,
    add_command,
    add_config_arguments,
    add_json_argument,
    open_store,
    print_json,
    settings_from_args,
)


def cmd_mcp_verify(args: argparse.Namespace) -> int:
    """Ask the live MCP servers of mcp_servers again for the recorded tools/list and calls, and report what drifted
    (schema changes per tool, answers that differ, JSON-aware with each server's ignore_fields); exit 1 on drift."""
    from stabletoolbench_mirror.responders.mcp_live.drift import verify_server

    servers = settings_from_args(args).live_servers()
    if args.server:
        unknown = sorted(set(args.server) - set(servers))
        if unknown:
            raise CommandError(f"--server {', '.join(unknown)}: not in mcp_servers ({', '.join(sorted(servers)) or 'none'})")
        servers = {k: v for k, v in servers.items() if k in args.server}
    if not servers:
        raise CommandError("mcp_servers names no server to verify: set mcp_servers in the config")
    with open_store(args) as store:  # read-only: a mistyped store path is an error, never an empty store made there
        drifts = [verify_server(name, config, store, calls=not args.schema_only) for name, config in sorted(servers.items())]
    if not args.no_record:
        _keep(args, drifts)
    if args.json:
        print_json({"drifted": any(d.drifted for d in drifts), "servers": [d.to_json() for d in drifts]})
    else:
        for drift in drifts:
            _print(drift)
    return 1 if any(d.drifted for d in drifts) else 0


def _keep(args: argparse.Namespace, drifts: list[Any]) -> None:
    """The environment's changelog: each server's finding kept in the store (for snapshots and ``report``)."""
    from stabletoolbench_mirror.responders.mcp_live.tools import drift_record
    from stabletoolbench_mirror.stores import StoreError

    try:
        with open_store(args, read_only=False) as store:
            for drift in drifts:
                store.add(drift_record(drift.server, drift.to_json(), "verify"), None)
    except StoreError as exc:
        raise CommandError(f"the finding is not kept in the store ({exc}); --no-record leaves the store as it is") from None


def _print(drift: Any) -> None:
    if drift.error:
        print(f"{drift.server}: cannot be asked: {drift.error}")
        return
    state = "drifted" if drift.drifted else "unchanged"
    print(f"{drift.server}: {state} ({drift.calls} calls asked again, {drift.differing} answered otherwise)")
    for tool, fields in drift.schema.items():
        print(f"  schema  {tool}: {', '.join(fields)}")
    for tool, fields in drift.answers.items():
        print(f"  answer  {tool}: {', '.join(fields)}")


def register(sub: Any) -> None:
    parser = add_command(sub, "mcp-verify", cmd_mcp_verify, summary="ask the live MCP servers again and report drift (exit 1)")
    add_config_arguments(parser)
    parser.add_argument("--server", action="append", metavar="NAME", help="verify this server of mcp_servers only (repeatable)")
    parser.add_argument("--schema-only", action="store_true", help="compare tools/list only, ask no recorded call again")
    parser.add_argument("--no-record", action="store_true",
                        help="leave the store as it is (by default each server's finding is kept in it, @mcp/<server>/@drift, "
                             "so snapshots carry it and report shows it)")
    add_json_argument(parser)
