"""The report's ``mcp`` part: a live-MCP run's servers, their tools, their calls by source, and their drift.

It reads the records named in :mod:`stabletoolbench_mirror.responders.mcp_live.tools`, handed over one at a
time by the single pass :func:`.tally.store_tallies` and :func:`.tally.snapshot_tallies` already make:

* ``@mcp/<server>/<tool-part>``: one tool call each, counted per server and tool, by source (a store's record:
  ``mcp``, ``simulated`` or ``failure``; a snapshot's entry, which keeps no provenance: ``answer`` or
  ``failure``, as the snapshot's other tools are counted).  These are tool answers, counted in ``records`` too;
* ``@mcp/<server>/@tools`` key ``tools/list``: the server's listing, its tools and ``listed_at``;
* ``@mcp/<server>/@drift``: each measured drift (``mcp-verify``'s ``seen: verify``, a record run's ``seen:
  record``), listed in time order.

A server's listing and drift records are no tool's answers: :meth:`McpTally.add_record` and
:meth:`McpTally.add_entry` say so, and the tallies leave them out of ``records``.  A tool is named as the
listing names it (the listing's names map to their API parts), else as a store's call records it
(``meta.tool``), else by its API part.  Every name here comes from a server: the page escapes it.
Nothing here does I/O.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from stabletoolbench_mirror.core.records import Record
from stabletoolbench_mirror.responders.mcp_live.tools import (
    DRIFT_PART,
    LISTING_KEY,
    LISTING_PART,
    is_answer_api,
    name_part,
    server_of,
)

#: a store's calls by source (its records' provenance)
STORE_COLUMNS = ("mcp", "simulated", "failure")
#: a snapshot's calls before the manifest listed its simulated MCP entries (``mcp_simulated_entries``): answers and
#: failure entries
SNAPSHOT_COLUMNS = ("answer", "failure")


def simulated_entries(manifest: Any) -> set[tuple[str, str]] | None:
    """The ``(api, key)`` pairs a snapshot's manifest lists as simulated MCP calls; ``None`` when it lists none
    (written before the list, or malformed)."""
    listed = manifest.get("mcp_simulated_entries") if isinstance(manifest, dict) else None
    if not isinstance(listed, list):
        return None
    pairs = {(item[0], item[1]) for item in listed if isinstance(item, list) and len(item) == 2 and all(isinstance(x, str) for x in item)}
    return pairs if len(pairs) == len(listed) else None


def iso_time(value: Any) -> str | None:
    """``value`` (seconds since the epoch) as ``YYYY-MM-DDTHH:MM:SSZ``; ``None`` for anything else."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    try:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(value))
    except (OverflowError, OSError, ValueError):
        return None


def _seconds(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) else None


def _fields(value: Any) -> dict[str, list[str]]:
    """A drift record's ``{tool: [fields]}`` (anything else: empty)."""
    if not isinstance(value, dict):
        return {}
    return {str(tool): [str(f) for f in fields] if isinstance(fields, list) else [str(fields)]
            for tool, fields in sorted(value.items(), key=lambda item: str(item[0]))}


def drift_entry(key: str, answer: Any) -> dict[str, Any] | None:
    """One drift record's row (docs/report.md), its time as a number under ``_at`` for the ordering."""
    if not isinstance(answer, dict):
        return None
    seen, _, stamp = key.partition("@")
    at = _seconds(answer.get("at"))
    if at is None:
        try:
            at = float(stamp)
        except ValueError:
            at = None
    error = answer.get("error")
    return {"seen": str(answer.get("seen") or seen), "at": iso_time(at), "drifted": bool(answer.get("drifted")),
            "schema": _fields(answer.get("schema")), "answers": _fields(answer.get("answers")),
            "calls": answer.get("calls") if isinstance(answer.get("calls"), int) else None,
            "differing": answer.get("differing") if isinstance(answer.get("differing"), int) else None,
            "error": str(error) if error else None, "_at": at if at is not None else -math.inf, "_key": key}


@dataclass
class _Server:
    listed: list[str] | None = None
    listed_at: float | None = None
    calls: Counter[str] = field(default_factory=Counter)
    by_source: Counter[str] = field(default_factory=Counter)
    meta_names: dict[str, str] = field(default_factory=dict)
    drift: list[dict[str, Any]] = field(default_factory=list)

    def listing(self, answer: Any) -> None:
        tools = answer.get("tools") if isinstance(answer, dict) else None
        tools = tools if isinstance(tools, list) else []
        self.listed = [str(t["name"]) for t in tools if isinstance(t, dict) and "name" in t]
        self.listed_at = _seconds(answer.get("listed_at")) if isinstance(answer, dict) else None

    def by_tool(self) -> Counter[str]:
        """Calls per tool, named as the listing names it, else as a call's ``meta.tool``, else by its API part."""
        names = {name_part(n): n for n in self.listed or []}
        by_tool: Counter[str] = Counter()
        for part, n in self.calls.items():
            by_tool[names.get(part) or self.meta_names.get(part) or part] += n
        return by_tool

    def to_json(self, columns: Sequence[str]) -> dict[str, Any]:
        by_tool = self.by_tool()
        drift = sorted(self.drift, key=lambda d: (d["_at"], d["_key"]))
        verified = [d for d in drift if d["seen"] == "verify"]
        rows = [{k: v for k, v in d.items() if not k.startswith("_")} for d in drift]
        return {
            "tools_listed": None if self.listed is None else len(self.listed),
            "listed_at": iso_time(self.listed_at),
            "tools_called": len(by_tool),
            "calls": sum(self.calls.values()),
            "calls_by_source": {**{c: 0 for c in columns}, **dict(sorted(self.by_source.items()))},
            "calls_by_tool": dict(sorted(by_tool.items(), key=lambda item: (-item[1], item[0]))),
            "drift": rows,
            "last_verified": {"at": verified[-1]["at"], "drifted": verified[-1]["drifted"]} if verified else None,
            "drifted": bool(drift and drift[-1]["drifted"]),
        }


@dataclass
class McpTally:
    """Per live MCP server: its listing, its calls, its drift records (see the module)."""

    columns: tuple[str, ...] = STORE_COLUMNS
    servers: dict[str, _Server] = field(default_factory=dict)
    own_records: int = 0
    """The servers' listing and drift records seen (none of them a tool answer)."""

    def add_record(self, record: Record) -> bool:
        """Count a store's ``record`` when it is an MCP one; whether it is a tool answer (all but a listing or drift)."""
        server = server_of(record.api)
        if server is None:
            return True
        if is_answer_api(record.api):
            meta = record.meta if isinstance(record.meta, dict) else {}
            tool = meta.get("tool")
            self._call(server, record.api, "failure" if record.is_failure else record.source,
                       tool if isinstance(tool, str) else None)
            return True
        try:
            answer = record.answer
        except ValueError:
            answer = None
        self._own(server, record.api, record.key, answer)
        return False

    def add_entry(self, api: str, key: str, answer: Any, failed: bool, simulated: set[tuple[str, str]] | None = None) -> bool:
        """Count a snapshot's entry (``failed``: a failure entry; ``simulated``: the manifest's simulated MCP entries,
        when it lists them: the other answers are the live servers'); whether it is a tool answer, as :meth:`add_record`."""
        server = server_of(api)
        if server is None:
            return True
        if is_answer_api(api):
            column = "failure" if failed else "answer" if simulated is None else "simulated" if (api, key) in simulated else "mcp"
            self._call(server, api, column, None)
            return True
        self._own(server, api, key, answer)
        return False

    def _server(self, name: str) -> _Server:
        return self.servers.setdefault(name, _Server())

    def _call(self, server: str, api: str, column: str, tool: str | None) -> None:
        part = api.rpartition("/")[2]
        row = self._server(server)
        row.calls[part] += 1
        row.by_source[column] += 1
        if tool is not None:
            row.meta_names.setdefault(part, tool)

    def _own(self, server: str, api: str, key: str, answer: Any) -> None:
        self.own_records += 1
        part, row = api.rpartition("/")[2], self._server(server)
        if part == LISTING_PART and key == LISTING_KEY:
            row.listing(answer)
        elif part == DRIFT_PART and (entry := drift_entry(key, answer)) is not None:
            row.drift.append(entry)

    def to_json(self) -> dict[str, Any] | None:
        """The ``mcp`` part of a report (docs/report.md); ``None`` when no MCP record was seen."""
        if not self.servers:
            return None
        servers = {name: self.servers[name].to_json(self.columns) for name in sorted(self.servers)}
        return {"servers": servers, "drifted": any(s["drifted"] for s in servers.values())}
