"""The live MCP servers (``mcp_servers``) at ``/mcp``: their recorded listings in pages, their calls as ``CallToolResult`` s.

:class:`LiveFront` is what :class:`~.mcp_front.McpFront` asks when ``mcp_servers`` is set: ``/mcp`` lists
the live servers' tools (as their servers listed them, a name two servers list prefixed with its server's,
:func:`~stabletoolbench_mirror.responders.mcp_live.tools.offered_tools`) in the same pages as StableToolBench's
(:class:`~.mcp_catalog.Catalog`), and a call goes the live path
(:class:`~stabletoolbench_mirror.responders.mcp_live.calls.LiveCalls`).  The run of a call's occurrences is its
MCP session's server session (or ``X-STM-Session``'s), else the server's own run (``llm.run``'s).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from stabletoolbench_mirror.config import ConfigError, McpServerConfig, Mode, Settings, read_mcp_servers
from stabletoolbench_mirror.core.secrets import Redactor
from stabletoolbench_mirror.engine.layer import MirrorLayer
from stabletoolbench_mirror.responders.mcp_live.calls import LiveCalls, error_result
from stabletoolbench_mirror.responders.simulator.responder import Simulator
from stabletoolbench_mirror.serving.mcp_catalog import Catalog
from stabletoolbench_mirror.upstream.failures import MANIFEST_NAME

log = logging.getLogger(__name__)


def _recorded_servers(layer: MirrorLayer) -> dict[str, McpServerConfig]:
    """In ``replay`` without ``mcp_servers``: the servers of the first frozen snapshot whose manifest's settings name
    some (a snapshot of an MCP run is served alone: its servers' matchers and ignored fields are its manifest's)."""
    if layer.mode is not Mode.REPLAY:
        return {}
    for tier in layer.frozen:
        manifest = getattr(tier, "root", None)
        path = Path(manifest) / MANIFEST_NAME if manifest is not None else None
        if path is None or not path.is_file():
            continue
        try:
            recorded = json.loads(path.read_text(encoding="utf-8")).get("settings", {}).get("mcp_servers")
            servers = read_mcp_servers(recorded, str) if isinstance(recorded, dict) and recorded else {}
        except (OSError, ValueError, AttributeError) as exc:
            log.warning("%s: its mcp_servers cannot be read (%s)", path, exc)
            continue
        if servers:
            log.info("live MCP servers replayed from %s: %s", path, ", ".join(servers))
            return servers
    return {}


class LiveFront:
    """The live servers' tools and calls as the MCP front serves them."""

    def __init__(self, calls: LiveCalls) -> None:
        self.calls = calls
        self.catalog = Catalog.of_tools([])

    @classmethod
    def build(cls, settings: Settings, layer: MirrorLayer, run: str, limiter: Any = None) -> LiveFront | None:
        """The live front of ``mcp_servers`` (``None`` without any); :class:`ConfigError` naming the key when they are wrong."""
        servers = settings.live_servers() or _recorded_servers(layer)
        if not servers:
            return None
        try:
            import mcp  # noqa: F401
        except ImportError:
            raise ConfigError("mcp_servers: live MCP servers need the official MCP SDK: pip install 'stabletoolbench-mirror[mcp]'") from None
        simulator = next((r for r in layer.responders if isinstance(r, Simulator)), None)
        calls = LiveCalls(servers, layer.store, mode=layer.mode, stats=layer.stats, run=run, frozen=layer.frozen, simulator=simulator,
                          save=settings.save, store_timeout_s=settings.store.timeout_s, limiter=limiter,
                          redactor=Redactor(settings.secrets()))
        return cls(calls)

    def start(self) -> None:
        """Read the servers' listings (live ones started); in a worker thread, before ``/mcp`` is served."""
        import mcp_types as types

        self.calls.start()
        tools = []
        for tool in self.calls.tools.values():
            try:
                tools.append(types.Tool.model_validate(tool.offered_tool()))
            except ValueError as exc:
                log.warning("MCP server %r: its tool %r is not a valid MCP tool, left out (%s)", tool.server, tool.name[:80],
                            str(exc).splitlines()[0][:200])
        self.catalog = Catalog.of_tools(tools)

    def offers(self, name: str) -> bool:
        return name in self.calls.tools

    def page(self, cursor: str | None) -> Any:
        return self.catalog.page(None, cursor)

    async def call(self, name: str, arguments: dict[str, Any], session: str | None) -> Any:
        """The ``CallToolResult`` of one call (an MCP error result when a recorded one is no longer valid)."""
        import mcp_types as types

        result = await self.calls.call(name, arguments, session)
        try:
            return types.CallToolResult.model_validate(result if result is not None else error_result(f"no tool {name!r}"))
        except ValueError as exc:
            message = f"stabletoolbench-mirror: the answer of {name[:80]!r} is not a valid CallToolResult ({str(exc).splitlines()[0][:200]})"
            return types.CallToolResult.model_validate(error_result(message))

    def close(self) -> None:
        self.calls.close()
