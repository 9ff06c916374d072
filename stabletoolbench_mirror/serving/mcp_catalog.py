"""The tools the MCP front offers (:mod:`.mcp_front`): everything at ``/mcp``, and each query's, in pages.

The tools are StableToolBench's functions (:mod:`stabletoolbench_mirror.upstream.functions`): those of
the queries in ``mcp.queries``, else every tool in ``tools_folder`` (and API-Bank's).  A ``tools/list``
answer is cut in pages small enough for the official SDK's client (:data:`PAGE_BYTES`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from typing import Any

from stabletoolbench_mirror.config import ConfigError, Settings
from stabletoolbench_mirror.factory import build_tool_docs
from stabletoolbench_mirror.upstream.functions import (
    Function,
    ToolsFolderError,
    UpstreamTools,
    all_functions,
    iter_query_functions,
    mcp_tool,
    unique_names,
)
from stabletoolbench_mirror.upstream.queries import QueryFileError

log = logging.getLogger(__name__)

#: the most bytes of tools one ``tools/list`` page holds (its JSON): the official SDK's client refuses a
#: server-sent event over 1 MiB, and the 2,490 tools of the solvable queries are 1.2 MB together
PAGE_BYTES = 256 * 1024
#: the most tools one page holds
PAGE_TOOLS = 500

QueryKey = tuple[str, str]
#: the start-up error of an MCP front with nothing to offer
NEEDS_DOCS = ("mcp.enabled: the MCP front needs tool docs: set tools_folder (StableToolBench's toolenv/tools), or mcp_servers "
              "(live MCP servers), or set mcp.enabled: false")


class Catalog:
    """The tools offered: everything at ``/mcp``, and each query's."""

    def __init__(self, everything: dict[str, Function], queries: dict[QueryKey, dict[str, Function]]) -> None:
        self.everything = everything
        self.queries = queries
        self._listings: dict[QueryKey | None, list[Any]] = {}
        self._pages: dict[QueryKey | None, list[int]] = {}

    @classmethod
    def from_settings(cls, settings: Settings) -> Catalog:
        """The tools of ``mcp.queries`` (or of the whole tools folder); :class:`ConfigError` naming the key when they cannot be read."""
        paths = [settings.resolve(p) for p in settings.mcp.query_paths]
        if _live_only(settings, paths):
            return cls({}, {})  # the live MCP servers' tools alone (serving.mcp_live_front; from a snapshot's in replay)
        if not settings.tools_folder and (paths or settings.apibank is None):
            raise ConfigError(NEEDS_DOCS)
        try:
            if not paths:
                return cls(unique_names(all_functions(_every_tool(settings))), {})
            tools = UpstreamTools(settings.resolve(settings.tools_folder or ""))
            queries: dict[QueryKey, dict[str, Function]] = {}
            listed: list[Function] = []
            for item in iter_query_functions(paths, tools):
                if isinstance(item, tuple):
                    log.warning("mcp.queries: query %s/%s is left out: a tool of it is not in tools_folder", *item)
                    continue
                queries[(item.group, item.query_id)] = unique_names(item.functions)
                listed.extend(item.functions)
        except ToolsFolderError as exc:
            raise ConfigError(f"tools_folder: {exc}; set tools_folder to StableToolBench's toolenv/tools") from None
        except QueryFileError as exc:
            raise ConfigError(f"mcp.queries: {exc}; give StableToolBench query files or folders of them") from None
        return cls(unique_names(listed), queries)

    @classmethod
    def of_tools(cls, tools: list[Any]) -> Catalog:
        """A catalog of ``types.Tool`` s listed as they are at ``/mcp`` (the live MCP servers' tools)."""
        catalog = cls({}, {})
        catalog._listings[None] = tools
        return catalog

    def scope(self, query: QueryKey | None) -> dict[str, Function] | None:
        """The tools of ``query`` (everything for ``None``); ``None`` when no such query is served."""
        return self.everything if query is None else self.queries.get(query)

    def listing(self, query: QueryKey | None) -> list[Any]:
        """The ``types.Tool`` list of a scope (built once)."""
        import mcp_types as types

        if query not in self._listings:
            scope = self.scope(query) or {}
            tools = []
            for name, fn in scope.items():
                tool = mcp_tool(fn.schema)
                tools.append(types.Tool(name=name, description=tool["description"], input_schema=tool["inputSchema"]))
            self._listings[query] = tools
        return self._listings[query]

    def page(self, query: QueryKey | None, cursor: str | None) -> Any:
        """One ``tools/list`` page of a scope (MCP's pagination: ``nextCursor`` names the next one, absent on the last).

        A page holds at most :data:`PAGE_TOOLS` tools and :data:`PAGE_BYTES` of them (one tool over that is
        a page of its own).  A cursor this server did not give is an ``INVALID_PARAMS`` error, as the spec says.
        """
        import mcp_types as types
        from mcp.shared.exceptions import MCPError

        tools = self.listing(query)
        starts = self._page_starts(query, tools)
        if cursor is None:
            number = 0
        else:
            number = int(cursor) if cursor.isdigit() and len(cursor) < 9 else -1
            if not 0 < number < len(starts):
                raise MCPError(types.INVALID_PARAMS, f"tools/list: unknown cursor {cursor[:40]!r} (list again from the first page)")
        end = starts[number + 1] if number + 1 < len(starts) else len(tools)
        return types.ListToolsResult(tools=tools[starts[number]:end], next_cursor=str(number + 1) if end < len(tools) else None)

    def _page_starts(self, query: QueryKey | None, tools: list[Any]) -> list[int]:
        if query not in self._pages:
            starts, size = [0], 0
            for i, tool in enumerate(tools):
                cost = len(tool.model_dump_json(by_alias=True, exclude_none=True)) + 1
                if i > starts[-1] and (size + cost > PAGE_BYTES or i - starts[-1] >= PAGE_TOOLS):
                    starts.append(i)
                    size = 0
                size += cost
            self._pages[query] = starts
        return self._pages[query]


def _live_only(settings: Settings, paths: list[str]) -> bool:
    """Whether ``/mcp`` may offer the live MCP servers' tools alone: no tool docs, queries or API-Bank, but
    ``mcp_servers`` (or frozen caches, a snapshot of an MCP run's; the server checks that one names servers)."""
    return not settings.tools_folder and not paths and settings.apibank is None and bool(settings.mcp_servers or settings.frozen_caches)


def _every_tool(settings: Settings) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """Every tool of ``tools_folder``, and API-Bank's (``apibank:``), as :meth:`ToolDocs.tools` gives them."""
    if settings.tools_folder:
        root = settings.resolve(settings.tools_folder)
        if not os.path.isdir(root):
            raise ToolsFolderError(f"{root}: the tools folder does not exist")
    docs = build_tool_docs(settings)
    return docs.tools() if docs is not None else iter(())
