"""The store as an upstream ``tool_response_cache`` tree (``cache export``, ``snapshot``), and its counts (``cache stats``).

The export streams: it holds one API's records at a time (:meth:`Store.iter_groups`), so memory stays flat
however large the store.  It shows a progress bar and prints its throughput.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stabletoolbench_mirror.core.naming import category_of
from stabletoolbench_mirror.core.progress import progress_bar
from stabletoolbench_mirror.core.records import Record
from stabletoolbench_mirror.snapshots.tree_import import rate
from stabletoolbench_mirror.stores import Store
from stabletoolbench_mirror.upstream.layout import ENCODED_PREFIX, api_path, write_cache_file


@dataclass
class ExportSummary:
    files: int = 0
    entries: int = 0
    encoded_names: int = 0
    """Files written under an encoded name (see :mod:`~stabletoolbench_mirror.upstream.layout`)."""
    left_out: dict[str, int] = field(default_factory=dict)
    """Entries per API whose name is too long for a file name even encoded: not written."""
    seconds: float = 0.0

    @property
    def left_out_entries(self) -> int:
        return sum(self.left_out.values())

    def to_json(self) -> dict[str, Any]:
        """``cache export --json`` (docs/json-output.md), without where it wrote."""
        return {"files": self.files, "entries": self.entries, "encoded_names": self.encoded_names, "left_out": dict(self.left_out),
                "elapsed_s": round(self.seconds, 3)}

    def lines(self, *, limit: int = 20) -> list[str]:
        out = [f"files written:    {self.files}", f"entries written:  {self.entries}"]
        if self.seconds:
            out.append(f"time:             {self.seconds:.1f} s ({rate(self.entries, self.seconds, 'entries')})")
        if self.encoded_names:
            out.append(f"encoded names:    {self.encoded_names} files (names unsafe as paths, written as %%...)")
        if self.left_out:
            out.append(f"LEFT OUT:         {self.left_out_entries} entries of {len(self.left_out)} APIs whose names are too long for a file name:")
            out.extend(f"  {api[:300]} ({n} entries)" for api, n in list(self.left_out.items())[:limit])
            if len(self.left_out) > limit:
                out.append(f"  ... and {len(self.left_out) - limit} more")
        return out


@dataclass(frozen=True)
class ExportedFile:
    """One API of the store as written by :func:`iter_export`: its file, or ``None`` when it was left out."""

    api: str
    records: list[Record]
    path: Path | None

    @property
    def encoded(self) -> bool:
        """Whether a part of its name was encoded (a literal name never starts with the marker)."""
        return self.path is not None and any(p.startswith(ENCODED_PREFIX) for p in self.path.parts[-3:])


def iter_export(
    store: Store, root: str | os.PathLike[str], *, progress: bool = True, desc: str = "export", exclude_failures: bool = False,
) -> Iterator[ExportedFile]:
    """Write the store as an upstream tree, one API file at a time (the only one in memory), yielding each as it is written.

    Failure records are written like any entry (their served body), unless ``exclude_failures``.
    """
    counts = store.counts()
    with progress_bar(total=counts.entries if counts else None, desc=desc, unit="entry", disable=not progress) as bar:
        for api, group in store.iter_groups():
            if exclude_failures:
                bar.update(sum(1 for r in group if r.is_failure))
                group = [r for r in group if not r.is_failure]
                if not group:
                    continue
            path = api_path(root, api)
            if path is not None:
                write_cache_file(path, {r.key: r.answer for r in group})
            bar.update(len(group))
            yield ExportedFile(api, group, path)


def export_tree(store: Store, root: str | os.PathLike[str], *, progress: bool = True) -> ExportSummary:
    """Write the store as an upstream tree (one JSON object per API file)."""
    summary = ExportSummary()
    started = time.perf_counter()
    for exported in iter_export(store, root, progress=progress):
        count(summary, exported)
    summary.seconds = time.perf_counter() - started
    return summary


def count(summary: ExportSummary, exported: ExportedFile) -> None:
    if exported.path is None:
        summary.left_out[exported.api] = len(exported.records)
        return
    summary.files += 1
    summary.entries += len(exported.records)
    summary.encoded_names += exported.encoded


@dataclass
class Tally:
    """Entry counts of a store or snapshot: by source, category, API, model and origin (``cache stats``, manifests)."""

    entries: int = 0
    by_source: Counter[str] = field(default_factory=Counter)
    by_category: Counter[str] = field(default_factory=Counter)
    models: Counter[str] = field(default_factory=Counter)
    """Simulated entries per model."""
    origins: Counter[str] = field(default_factory=Counter)
    """``<source>:<origin>``; an import's origin is cut to the imported folder."""
    apis: set[str] = field(default_factory=set)
    failures: Counter[str] = field(default_factory=Counter)
    """Failure records by reason."""
    replaced: int = 0
    """Usable answers that replaced a failure record."""

    def add(self, record: Record) -> None:
        self.entries += 1
        if record.is_failure:
            self.failures[record.reason] += 1
        elif record.replaced is not None:
            self.replaced += 1
        self.by_source[record.source] += 1
        self.by_category[category_of(record.api)] += 1
        self.apis.add(record.api)
        self.origins[f"{record.source}:{_origin_group(record)}"] += 1
        if record.source == "simulated":
            self.models[record.origin] += 1

    def to_json(self) -> dict[str, Any]:
        return {
            "entries": self.entries,
            "apis": len(self.apis),
            "by_source": dict(sorted(self.by_source.items())),
            "by_category": dict(sorted(self.by_category.items())),
            "models": dict(sorted(self.models.items())),
            "origins": dict(sorted(self.origins.items())),
            "failure_records": sum(self.failures.values()),
            "failure_reasons": dict(sorted(self.failures.items(), key=lambda item: (-item[1], item[0]))),
            "replaced_failures": self.replaced,
        }


def _origin_group(record: Record) -> str:
    # an import's origin names each file ("import:<root>/<api>.json"): keep the root
    if record.source == "imported":
        return record.origin.split("/", 1)[0]
    return record.origin


def store_stats(store: Store) -> dict[str, Any]:
    """Entries by source, category, model and origin, APIs, and size per entry.

    From the store's counters when it keeps them (no scan: fast at any size), else one pass over the records.
    """
    counts = store.counts()
    if counts is None:
        tally = Tally()
        for record in store:
            tally.add(record)
        out = tally.to_json()
        out.update(counted_by="full scan", disk_bytes=None, memory_bytes=None, bytes_per_entry=None)
        return out
    size = counts.disk_bytes if counts.disk_bytes is not None else counts.memory_bytes
    return {
        "entries": counts.entries,
        "apis": counts.apis,
        "by_source": dict(sorted(counts.by_source.items())),
        "by_category": dict(sorted(counts.by_category.items())),
        "models": dict(sorted((k.split(":", 1)[1], v) for k, v in counts.by_origin.items() if k.startswith("simulated:"))),
        "origins": dict(sorted(counts.by_origin.items())),
        "failure_records": counts.by_outcome.get("failure", 0),
        "failure_reasons": None,
        "replaced_failures": counts.by_outcome.get("replaced", 0),
        "counted_by": "counters",
        "disk_bytes": counts.disk_bytes,
        "memory_bytes": counts.memory_bytes,
        "bytes_per_entry": round(size / counts.entries) if size and counts.entries else None,
    }
