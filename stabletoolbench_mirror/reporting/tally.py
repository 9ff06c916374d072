"""The report's counts of recorded answers, each record once: tool answers and model calls apart.

A record under ``@model/<model>/<endpoint>`` (``chat_completions``, ``completions``) is the agent's or
the judge's model call, never a tool answer: :class:`ModelTally` counts those (per model and
endpoint: occurrences, distinct requests, the prompt and completion tokens of each recorded
completion's ``usage``), :class:`ToolTally` the tool answers (by source, category, tool, simulator
model and prompt, tokens and latency of the simulator's generations).  The simulated share is a share
of tool answers only.  A store's records come with their provenance (:func:`store_tallies`); a
snapshot's files hold the served answers only, so its sources are the manifest's totals
(:func:`snapshot_tallies`).  The same pass feeds the ``mcp`` part (:class:`.mcp.McpTally`): a live MCP
server's calls are tool answers, its listing and drift records are not.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stabletoolbench_mirror.core.model_calls import model_endpoint, split_key, usage_of
from stabletoolbench_mirror.core.naming import ApiPath, category_of
from stabletoolbench_mirror.core.records import Record
from stabletoolbench_mirror.reporting.mcp import SNAPSHOT_COLUMNS, STORE_COLUMNS, McpTally, simulated_entries
from stabletoolbench_mirror.stores import Store
from stabletoolbench_mirror.upstream.failures import failure_entries
from stabletoolbench_mirror.upstream.layout import iter_cache_files, read_cache_file

#: the slowest APIs listed (by mean latency)
SLOWEST = 15


class ReportError(RuntimeError):
    """A source cannot be read (the message names it and the fix)."""


# -- the parts of a name ----------------------------------------------------------------------------


def tool_of(api: str) -> str:
    """``Category/tool_for_Category`` of ``Category/tool_for_Category/api`` (``api`` itself when it is no API path)."""
    path = ApiPath.parse(api)
    return api if path is None else path.tool_path


def sorted_counts(counts: Mapping[str, int]) -> dict[str, int]:
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def nested(table: Mapping[str, Counter[str]]) -> dict[str, dict[str, int]]:
    """``{name: {column: n}}`` with a ``total``, names by their total (largest first)."""
    rows = {name: {**dict(sorted(c.items())), "total": sum(c.values())} for name, c in table.items()}
    return dict(sorted(rows.items(), key=lambda item: (-item[1]["total"], item[0])))


def counts_of(value: Any) -> dict[str, int]:
    """``{str: int}`` of a manifest's count table (anything else: empty)."""
    if not isinstance(value, dict):
        return {}
    return {str(k): v for k, v in value.items() if isinstance(v, int) and not isinstance(v, bool)}


# -- model calls --------------------------------------------------------------------------------------


@dataclass
class _ModelRow:
    occurrences: int = 0
    digests: set[str] = field(default_factory=set)
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass
class ModelTally:
    """Recorded model calls per ``(model, endpoint)``: each occurrence once, its completion's ``usage``."""

    rows: dict[tuple[str, str], _ModelRow] = field(default_factory=lambda: defaultdict(_ModelRow))

    def add(self, model: str, endpoint: str, key: str, answer: Any) -> None:
        row = self.rows[(model, endpoint)]
        row.occurrences += 1
        parts = split_key(key)
        row.digests.add(parts[0] if parts else key)
        if isinstance(answer, Mapping):
            prompt, completion = usage_of(answer)
            row.prompt_tokens += prompt
            row.completion_tokens += completion

    def to_json(self) -> dict[str, Any] | None:
        """The ``models`` part of a report (``None`` when nothing was recorded)."""
        if not self.rows:
            return None
        rows = [
            model_row(model, endpoint, calls=row.occurrences, distinct_requests=len(row.digests),
                      prompt_tokens=row.prompt_tokens, completion_tokens=row.completion_tokens)
            for (model, endpoint), row in sorted(self.rows.items(), key=lambda item: (-item[1].occurrences, item[0]))
        ]
        return models_part(rows)


def model_row(model: str, endpoint: str | None, *, calls: int, distinct_requests: int | None, prompt_tokens: int,
              completion_tokens: int, outcomes: dict[str, int] | None = None) -> dict[str, Any]:
    """One row of ``models.models`` (docs/report.md): ``roles`` are filled in by a bundle's report."""
    return {"model": model, "endpoint": endpoint, "roles": [], "calls": calls, "distinct_requests": distinct_requests,
            "prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "outcomes": outcomes}


def models_part(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {"models": rows, "calls": sum(r["calls"] for r in rows), "prompt_tokens": sum(r["prompt_tokens"] for r in rows),
            "completion_tokens": sum(r["completion_tokens"] for r in rows)}


# -- tool answers ---------------------------------------------------------------------------------------


@dataclass
class _Latency:
    calls: int = 0
    total_s: float = 0.0
    max_s: float = 0.0

    def add(self, seconds: float) -> None:
        self.calls += 1
        self.total_s += seconds
        self.max_s = max(self.max_s, seconds)


@dataclass
class ToolTally:
    """A store's tool answers (each record once): sources, categories, tools, simulator generations."""

    entries: int = 0
    by_source: Counter[str] = field(default_factory=Counter)
    failure_reasons: Counter[str] = field(default_factory=Counter)
    by_category: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    by_tool: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    models: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    """Simulated records by (origin, meta model, meta prompt_sha256)."""
    model_failures: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    token_records: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency: dict[str, _Latency] = field(default_factory=lambda: defaultdict(_Latency))

    def add(self, record: Record) -> None:
        self.entries += 1
        self.by_source[record.source] += 1
        column = "failure" if record.is_failure else record.source
        if record.is_failure:
            self.failure_reasons[record.reason or "(no reason recorded)"] += 1
        self.by_category[category_of(record.api)][column] += 1
        self.by_tool[tool_of(record.api)][column] += 1
        meta = record.meta if isinstance(record.meta, dict) else {}
        if record.source == "simulated":
            generation = (record.origin, str(meta.get("model") or ""), str(meta.get("prompt_sha256") or ""))
            self.models[generation] += 1
            self.model_failures[generation] += record.is_failure
        self._add_meta(record.api, meta)

    def _add_meta(self, api: str, meta: dict[str, Any]) -> None:
        prompt, completion = meta.get("prompt_tokens"), meta.get("completion_tokens")
        if isinstance(prompt, int) or isinstance(completion, int):
            self.token_records += 1
            self.prompt_tokens += prompt if isinstance(prompt, int) else 0
            self.completion_tokens += completion if isinstance(completion, int) else 0
        latency = meta.get("latency_s")
        if isinstance(latency, (int, float)) and not isinstance(latency, bool) and latency >= 0:
            self.latency[api].add(float(latency))

    def to_json(self) -> dict[str, Any]:
        simulated = self.by_source.get("simulated", 0)
        by_model = [
            {"origin": origin, "model": model or None, "prompt_sha256": prompt or None, "entries": n,
             "failures": self.model_failures[(origin, model, prompt)]}
            for (origin, model, prompt), n in sorted(self.models.items(), key=lambda item: (-item[1], item[0]))
        ]
        return {
            "entries": self.entries,
            "by_source": dict(sorted(self.by_source.items())),
            "failures": sum(self.failure_reasons.values()),
            "failure_reasons": sorted_counts(self.failure_reasons),
            "by_category": nested(self.by_category),
            "by_tool": nested(self.by_tool),
            "simulated": simulated_part(simulated, self.entries, by_model),
            "tokens": self._tokens(),
            "slowest_apis": slowest(self.latency),
        }

    def _tokens(self) -> dict[str, int] | None:
        if not self.token_records:
            return None
        return {"records": self.token_records, "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}


def simulated_part(simulated: int, tool_entries: int, by_model: list[dict[str, Any]]) -> dict[str, Any]:
    """``records.simulated``: the simulated tool answers, their share of the tool answers, by model."""
    return {"entries": simulated, "share": round(simulated / tool_entries, 6) if tool_entries else 0.0, "by_model": by_model}


def slowest(latency: Mapping[str, _Latency], n: int = SLOWEST) -> list[dict[str, Any]]:
    """The ``n`` APIs of the highest mean recorded latency."""
    means = sorted(((-lat.total_s / lat.calls, api) for api, lat in latency.items() if lat.calls))[:n]
    return [{"api": api, "calls": latency[api].calls, "mean_s": round(-negative, 6), "max_s": round(latency[api].max_s, 6)}
            for negative, api in means]


Tallies = tuple[dict[str, Any], dict[str, Any] | None, dict[str, Any] | None]
"""``(records, models, mcp)``: three parts of a report."""


def store_tallies(store: Store) -> Tallies:
    """``(records, models, mcp)`` of a store: every record read once, streamed."""
    tools, models, mcp = ToolTally(), ModelTally(), McpTally()
    for record in store:
        if not mcp.add_record(record):
            continue
        parts = model_endpoint(record.api)
        if parts is None:
            tools.add(record)
            continue
        try:
            answer = record.answer
        except ValueError:
            answer = None
        models.add(*parts, record.key, answer)
    return tools.to_json(), models.to_json(), mcp.to_json()


# -- a snapshot's tree ----------------------------------------------------------------------------------


def snapshot_tallies(root: Path, manifest: dict[str, Any]) -> Tallies:
    """``(records, models, mcp)`` of a snapshot: the tree's entries per category and tool, the manifest's totals.

    A snapshot's files hold the served answers only (no provenance), so per category and tool it says how
    many answers and failure entries there are; tool answers by source and by simulator model are the
    manifest's totals, less its model calls (source ``model``) and its MCP servers' listing and drift records
    (source ``mcp``).  Model calls are counted from their files.
    """
    failed = failure_entries(manifest) or set()
    by_category: dict[str, Counter[str]] = defaultdict(Counter)
    by_tool: dict[str, Counter[str]] = defaultdict(Counter)
    simulated_mcp = simulated_entries(manifest)
    models, mcp = ModelTally(), McpTally(SNAPSHOT_COLUMNS if simulated_mcp is None else STORE_COLUMNS)
    entries = model_entries = 0
    for api, path in iter_cache_files(root, allow_symlinks=False):
        try:
            data = read_cache_file(path)
        except (OSError, ValueError) as exc:
            raise ReportError(f"{path}: unreadable ({exc}): check the snapshot with `stabletoolbench-mirror snapshot --verify`") from exc
        parts = model_endpoint(api)
        if parts is not None:
            for key, answer in data.items():
                models.add(*parts, key, answer)
            model_entries += len(data)
            continue
        for key, answer in data.items():
            column = "failure" if (api, key) in failed else "answer"
            if not mcp.add_entry(api, key, answer, column == "failure", simulated_mcp):
                continue
            by_category[category_of(api)][column] += 1
            by_tool[tool_of(api)][column] += 1
            entries += 1
    by_source = tool_sources(counts_of(manifest.get("by_source")), model_entries, mcp.own_records)
    simulated = by_source.get("simulated", 0)
    origins = counts_of(manifest.get("models"))
    return {
        "entries": entries,
        "by_source": by_source,
        "failures": manifest.get("failures", sum(c["failure"] for c in by_category.values())),
        "failure_reasons": manifest.get("failure_reasons") or {},
        "by_category": nested(by_category),
        "by_tool": nested(by_tool),
        "simulated": simulated_part(simulated, entries, [
            {"origin": origin, "model": None, "prompt_sha256": None, "entries": n, "failures": None}
            for origin, n in sorted_counts(origins).items()]),
        "tokens": None,
        "slowest_apis": [],
    }, models.to_json(), mcp.to_json()


def tool_sources(by_source: dict[str, int], model_entries: int, mcp_own: int = 0) -> dict[str, int]:
    """A manifest's entries by source, less its model calls: those recorded (``model``), and those a
    ``cache import`` brought in (counted under ``imported``), and less the ``mcp_own`` listing and drift records
    of its MCP servers (source ``mcp``), so that the rest are tool answers."""
    out = dict(by_source)
    if mcp_own and "mcp" in out:
        out["mcp"] = max(out["mcp"] - mcp_own, 0)
    left = model_entries - out.pop("model", 0)
    if left > 0 and "imported" in out:
        out["imported"] = max(out["imported"] - left, 0)
    return dict(sorted((k, v) for k, v in out.items() if v))
