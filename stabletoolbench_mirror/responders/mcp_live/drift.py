"""Drift of live MCP servers: a recorded run's ``tools/list`` and calls asked of the servers again, and compared.

For each server of ``mcp_servers``: its live ``tools/list`` against the recorded one, per tool (added, removed,
and each field that differs, as a dotted path: ``inputSchema.required``); then every recorded live answer's call
(its tool and arguments are on the record, ``meta``), in the order the run made them (stateful servers answer
the same calls the same way only from the same state: give ``mcp-verify`` servers started as the run's were),
its live ``CallToolResult`` against the recorded one, JSON-aware: a text content that holds JSON is compared as
JSON, the server's ``ignore_fields`` left out of both, ``_meta`` never compared.  The environment changelog the
live-MCP benchmarks lack: ``mcp-verify`` exits 1 on any drift.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from stabletoolbench_mirror.config import McpServerConfig
from stabletoolbench_mirror.core.records import Record
from stabletoolbench_mirror.responders.mcp_live.client import LiveServer, LiveServerDown
from stabletoolbench_mirror.responders.mcp_live.tools import (
    LISTING_KEY,
    MCP_CATEGORY,
    is_answer_api,
    listed_tools,
    listing_api,
    without_fields,
)
from stabletoolbench_mirror.stores.base import Store

#: differing paths reported per tool or call (the rest counted)
MAX_PATHS = 20


def differences(recorded: Any, live: Any, path: str = "") -> list[str]:
    """The dotted paths where two JSON values differ (``[]`` when they are equal)."""
    if isinstance(recorded, dict) and isinstance(live, dict):
        found: list[str] = []
        for key in sorted(set(recorded) | set(live), key=str):
            here = f"{path}.{key}" if path else str(key)
            if key not in recorded or key not in live:
                found.append(here)
            else:
                found += differences(recorded[key], live[key], here)
        return found
    if isinstance(recorded, list) and isinstance(live, list) and len(recorded) == len(live):
        return [p for i, (a, b) in enumerate(zip(recorded, live)) for p in differences(a, b, f"{path}[{i}]")]
    return [] if recorded == live else [path or "(the whole value)"]


def comparable(result: Mapping[str, Any], ignore_fields: Sequence[str]) -> dict[str, Any]:
    """A ``CallToolResult`` as compared: without ``_meta``, text contents holding JSON parsed, ``ignore_fields`` left out."""
    out = {k: v for k, v in result.items() if k != "_meta"}
    contents = []
    for content in out.get("content") or ():
        if isinstance(content, dict) and content.get("type") == "text" and isinstance(content.get("text"), str):
            try:
                parsed = json.loads(content["text"])
            except ValueError:
                parsed = content["text"]
            content = {**content, "text": without_fields(parsed, ignore_fields)}
        contents.append(content)
    if "content" in out:
        out["content"] = contents
    if isinstance(out.get("structuredContent"), dict):
        out["structuredContent"] = without_fields(out["structuredContent"], ignore_fields)
    return out


@dataclass
class ServerDrift:
    """One server's drift: its tools' schema changes, its calls' differing answers, and what could not be asked."""

    server: str
    schema: dict[str, list[str]] = field(default_factory=dict)
    """Per tool: ``added``, ``removed``, or the fields that changed."""
    answers: dict[str, list[str]] = field(default_factory=dict)
    """Per tool: the fields of its answers that differ (the first differing call's, with the count)."""
    calls: int = 0
    differing: int = 0
    error: str = ""

    @property
    def drifted(self) -> bool:
        return bool(self.schema or self.answers or self.error)

    def to_json(self) -> dict[str, Any]:
        return {"server": self.server, "drifted": self.drifted, "schema": self.schema, "answers": self.answers,
                "calls": self.calls, "differing": self.differing, "error": self.error}


def schema_drift(recorded: Iterable[Mapping[str, Any]], live: Iterable[Mapping[str, Any]]) -> dict[str, list[str]]:
    """Per tool name: ``["added"]``, ``["removed"]`` or the fields of the tool that changed."""
    before = {t.get("name"): t for t in recorded}
    after = {t.get("name"): t for t in live}
    out: dict[str, list[str]] = {}
    for name in sorted(set(before) | set(after), key=str):
        if name not in before:
            out[str(name)] = ["added"]
        elif name not in after:
            out[str(name)] = ["removed"]
        elif changed := differences(before[name], after[name]):
            out[str(name)] = changed[:MAX_PATHS]
    return out


def _recorded_calls(store: Store, server: str) -> list[Record]:
    """The recorded live answers of ``server``'s tools, in the order they were recorded."""
    prefix = f"{MCP_CATEGORY}/{server}/"
    found = [r for r in store if r.api.startswith(prefix) and is_answer_api(r.api)
             and r.source == "mcp" and not r.is_failure and isinstance((r.meta or {}).get("arguments"), dict)]
    return sorted(found, key=lambda r: r.created_at)


def verify_server(name: str, config: McpServerConfig, store: Store, calls: bool = True) -> ServerDrift:
    """Ask ``name`` again for its listing and the recorded calls, and compare (see the module)."""
    drift = ServerDrift(name)
    live = LiveServer(name, config)
    try:
        recorded = store.get(listing_api(name), LISTING_KEY)
        drift.schema = schema_drift(listed_tools(recorded) if recorded is not None else [], live.list_tools())
        for record in _recorded_calls(store, name) if calls else ():
            meta = record.meta or {}
            drift.calls += 1
            tool = str(meta.get("tool", ""))
            try:
                answer = live.call(tool, dict(meta["arguments"]))
            except LiveServerDown as exc:
                answer = {"content": [{"type": "text", "text": str(exc)}], "isError": True}
            changed = differences(comparable(record.answer, config.ignore_fields), comparable(answer, config.ignore_fields))
            if changed:
                drift.differing += 1
                drift.answers.setdefault(tool, changed[:MAX_PATHS])
    except LiveServerDown as exc:
        drift.error = str(exc)
    finally:
        live.close()
    return drift
