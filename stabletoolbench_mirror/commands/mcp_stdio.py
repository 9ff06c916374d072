"""``stabletoolbench-mirror mcp``: the MCP front over stdio, for MCP clients that start their servers themselves.

The same layer, tools and answers as ``serve``'s ``/mcp`` (see :mod:`stabletoolbench_mirror.serving.mcp_front`);
``--query GROUP/ID`` offers one query's tools; with ``mcp_servers`` (or a snapshot of an MCP run in replay)
the live servers' tools instead, each call recorded and replayed as ``/mcp``'s.  The whole run is one server
session.  Logs go to stderr (stdout carries the protocol; a live stdio server's own stdout is its pipe, never ours).
"""

from __future__ import annotations

from typing import Any

from stabletoolbench_mirror.commands.cli_common import CommandError, add_config_arguments, settings_from_args
from stabletoolbench_mirror.config import ConfigError


def cmd_mcp(args: Any) -> int:
    import anyio

    from stabletoolbench_mirror.core.fair import FairLimiter
    from stabletoolbench_mirror.core.logs import setup_logging
    from stabletoolbench_mirror.engine.model_calls import new_run_id
    from stabletoolbench_mirror.factory import build_layer
    from stabletoolbench_mirror.serving.mcp_front import McpFront
    from stabletoolbench_mirror.serving.mcp_live_front import LiveFront
    from stabletoolbench_mirror.serving.server import CallPath

    settings = settings_from_args(args)
    settings.mcp.enabled = True
    query = None
    if args.query:
        group, _, query_id = args.query.partition("/")
        if not group or not query_id:
            raise CommandError(f"--query {args.query!r}: give GROUP/QUERY_ID, e.g. G1_instruction/3")
        query = (group, query_id)
        if not settings.mcp.query_paths:
            raise ConfigError("mcp.queries: --query needs the query files: set mcp.queries in the config")
    setup_logging(settings.log_level, settings.secrets(), settings.resolve(settings.log_file) if settings.log_file else None)
    front = McpFront.from_settings(settings)
    if query is not None and query not in front.catalog.queries:
        raise CommandError(f"--query {args.query}: no such query in mcp.queries")
    layer = build_layer(settings)  # a StoreError is the command line's exit 2
    live = None
    try:
        path = CallPath(layer, FairLimiter(max(40, settings.limits.max_pending_misses + 32), reserve=32))
        for tier in layer.tiers:
            tier.use_threads(path.threads)
        if query is None:  # the live MCP servers (mcp_servers, or a snapshot's): their tools, started and listed first
            live = front.live = LiveFront.build(settings, layer, settings.llm.run or new_run_id(), path.threads)
            if live is not None:
                live.start()
        anyio.run(front.serve_stdio, path, query)
    finally:
        if live is not None:
            live.close()
        layer.close()
    return 0


def register(sub: Any) -> None:
    mcp = sub.add_parser("mcp", help="serve the layer as MCP tools over stdio (the mcp extra)")
    add_config_arguments(mcp)
    mcp.add_argument("--query", metavar="GROUP/ID", help="offer one query's tools (a query of mcp.queries, e.g. G1_instruction/3)")
    mcp.set_defaults(func=cmd_mcp, raw_output=True)  # stdout is the protocol's: written as it is
