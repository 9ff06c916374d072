"""What a live MCP server's records are named, and the tools ``/mcp`` offers from their listings.

* a tool's calls are recorded under the API ``@mcp/<server>/<tool>`` (:func:`tool_api`): ``@mcp`` is no
  StableToolBench category (``/virtual`` refuses a category with ``@``), so MCP records never share a name with
  a tool's or a model's, and travel where theirs do (``snapshot``, ``cache ls``, ``cache diff``, the content hash).
  A tool name that is not a safe file name (a ``/``, ``..``, a control character, over 64 characters) is
  recorded under ``x-<sha256 of the name>`` instead (:func:`name_part`), so no server's name reaches a path;
* a call's key is the SHA-256 of its canonical JSON (``{"arguments", "tool"}``, keys sorted, the server's
  ``ignore_fields`` left out: :func:`call_digest`), followed with ``by-order`` by ``#<occurrence>``: the n-th
  identical call of a run gets the n-th recorded answer, as model calls do (``exact``: the digest alone);
* a server's ``tools/list`` is one record, ``@mcp/<server>/@tools`` key ``tools/list`` (:func:`listing_record`):
  the tools as listed and when (``listed_at``), so a replay lists exactly the tools and schemas the run saw;
* a server's drift, each time it is measured, is one record more, ``@mcp/<server>/@drift`` key
  ``<seen>@<time>`` (:func:`drift_record`): what ``mcp-verify`` found (``seen: verify``), or the schema changes
  of a record run whose ``tools/list`` differs from the recorded one (``seen: record``); the environment's
  changelog, carried by snapshots and shown by ``report``.  Neither kind is ever a tool's answer.

Nothing here does I/O.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stabletoolbench_mirror.core.records import Record

log = logging.getLogger(__name__)

#: the category of every live MCP server's records
MCP_CATEGORY = "@mcp"
#: the last part of a server's listing record's API (never a tool's: :func:`name_part` has no ``@``)
LISTING_PART = "@tools"
#: the key of a server's listing record
LISTING_KEY = "tools/list"
#: the last part of a server's drift records' API
DRIFT_PART = "@drift"
#: a tool name recorded as it is (else as ``x-<sha256>``)
_SAFE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
#: the longest tool name offered (a longer one is left out of the listing, with a warning)
MAX_TOOL_NAME_CHARS = 128
#: what separates a server's name from a tool's when two servers list the same tool name
CLASH_SEPARATOR = "__"


def name_part(name: str) -> str:
    """``name`` as one part of an API: itself when it is a safe file name, else ``x-<its sha256's first 16 hex digits>``."""
    if _SAFE.fullmatch(name) and ".." not in name:
        return name
    return "x-" + hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def tool_api(server: str, tool: str) -> str:
    return f"{MCP_CATEGORY}/{server}/{name_part(tool)}"


def listing_api(server: str) -> str:
    return f"{MCP_CATEGORY}/{server}/{LISTING_PART}"


def drift_api(server: str) -> str:
    return f"{MCP_CATEGORY}/{server}/{DRIFT_PART}"


def is_answer_api(api: str) -> bool:
    """Whether an MCP record's API is a tool's (its calls' answers), not a server's listing or drift."""
    return not api.rpartition("/")[2].startswith("@")


def server_of(api: str) -> str | None:
    """The server of an MCP record's API, ``None`` for any other."""
    if not api.startswith(MCP_CATEGORY + "/"):
        return None
    server, _, rest = api[len(MCP_CATEGORY) + 1:].partition("/")
    return server if server and rest else None


def without_fields(value: Any, fields: Sequence[str]) -> Any:
    """``value`` (a JSON object) without the dotted paths ``fields`` (``meta.timestamp``); the rest as it is."""
    if not fields or not isinstance(value, dict):
        return value
    out = dict(value)
    nested: dict[str, list[str]] = {}
    for field in fields:
        head, _, rest = field.partition(".")
        if rest:
            nested.setdefault(head, []).append(rest)
        else:
            out.pop(head, None)
    for head, rests in nested.items():
        if head in out:
            out[head] = without_fields(out[head], rests)
    return out


def call_digest(tool: str, arguments: Mapping[str, Any], ignore_fields: Sequence[str]) -> str:
    """The SHA-256 of a call's canonical JSON, its ``ignore_fields`` left out."""
    kept = without_fields(dict(arguments), ignore_fields)
    text = json.dumps({"arguments": kept, "tool": tool}, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def call_key(digest: str, occurrence: int) -> str:
    """A call's record key: ``<digest>#<occurrence>`` (``by-order``), the digest alone for occurrence 0 (``exact``)."""
    return f"{digest}#{occurrence}" if occurrence else digest


def listing_record(server: str, tools: list[dict[str, Any]], listed_at: float | None = None) -> Record:
    """The record of a server's ``tools/list``: the tools as listed, and when."""
    listed_at = time.time() if listed_at is None else listed_at
    body = {"tools": tools, "listed_at": listed_at}
    return Record.from_answer(listing_api(server), LISTING_KEY, body, "mcp", f"mcp:{server}",
                              meta={"listed_at": listed_at, "tools": len(tools)})


def drift_record(server: str, drift: dict[str, Any], seen: str, at: float | None = None) -> Record:
    """The record of one measured drift of ``server`` (``drift``: :meth:`~.drift.ServerDrift.to_json`), ``seen`` by
    ``verify`` or ``record``, at ``at`` (now)."""
    at = time.time() if at is None else at
    body = {**drift, "seen": seen, "at": at}
    return Record.from_answer(drift_api(server), f"{seen}@{at:.6f}", body, "mcp", f"mcp:{server}",
                              meta={"seen": seen, "at": at, "drifted": bool(drift.get("drifted"))})


def listed_tools(record: Record) -> list[dict[str, Any]]:
    """The tools of a listing record (none when it holds none)."""
    try:
        tools = record.answer.get("tools")
    except (ValueError, AttributeError):
        return []
    return [t for t in tools if isinstance(t, dict)] if isinstance(tools, list) else []


@dataclass(frozen=True)
class LiveTool:
    """One tool ``/mcp`` offers: its server, its name there, the name offered, and the tool as listed."""

    server: str
    name: str
    offered: str
    listed: Mapping[str, Any]

    @functools.cached_property
    def api(self) -> str:
        """The API its calls are recorded under (:func:`tool_api`), worked out once."""
        return tool_api(self.server, self.name)

    def offered_tool(self) -> dict[str, Any]:
        """The tool as listed, under its offered name."""
        return {**self.listed, "name": self.offered}


def offered_tools(listings: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, LiveTool]:
    """The tools of every server's listing, by the name offered: a tool's own name, or ``<server>__<name>`` for
    every tool whose name more than one server lists (as MCP gateways name them).  A tool without a usable name
    (not a string, empty, over :data:`MAX_TOOL_NAME_CHARS`, a control character) is left out with a warning."""
    kept: list[tuple[str, str, Mapping[str, Any]]] = []
    for server, tools in listings.items():
        seen: set[str] = set()
        for tool in tools:
            name = tool.get("name")
            if not isinstance(name, str) or not name or len(name) > MAX_TOOL_NAME_CHARS or any(c < " " for c in name):
                log.warning("MCP server %r lists a tool without a usable name (%r): left out", server, str(name)[:80])
                continue
            if name in seen:
                log.warning("MCP server %r lists the tool %r twice: the first is kept", server, name[:80])
                continue
            seen.add(name)
            kept.append((server, name, tool))
    servers_of: dict[str, int] = {}
    for _, name, _ in kept:
        servers_of[name] = servers_of.get(name, 0) + 1
    offered: dict[str, LiveTool] = {}
    for server, name, tool in kept:
        shown = f"{server}{CLASH_SEPARATOR}{name}" if servers_of[name] > 1 else name
        offered.setdefault(shown, LiveTool(server, name, shown, tool))
    return offered
