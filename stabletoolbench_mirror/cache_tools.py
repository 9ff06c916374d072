"""Moving entries between the store and upstream ``tool_response_cache`` trees, and counting them.

Both directions stream: an import reads one API file at a time and writes it in batches, an
export holds one API's records at a time (:meth:`Store.iter_groups`), so memory stays flat
however large the store or the tree.  Each prints a progress bar and its throughput.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from .keys import canonical_from_upstream_key
from .records import Record
from .stores import Store
from .upstream_layout import iter_cache_entries, iter_cache_files, namespace_path, write_cache_file

log = logging.getLogger(__name__)

#: records written per store transaction during an import
IMPORT_BATCH = 1000


def _rate(n: int, seconds: float, unit: str) -> str:
    return f"{n / seconds:,.0f} {unit}/s" if seconds > 0 else "n/a"


@dataclass
class ImportSummary:
    files: int = 0
    entries: int = 0
    added: int = 0
    already_present: int = 0
    bad_files: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def lines(self) -> list[str]:
        out = [
            f"files read:       {self.files}",
            f"entries read:     {self.entries}",
            f"added:            {self.added}",
            f"already present:  {self.already_present}",
            f"time:             {self.seconds:.1f} s ({_rate(self.entries, self.seconds, 'entries')})",
        ]
        if self.bad_files:
            out.append(f"unreadable files: {len(self.bad_files)}")
            out.extend(f"  {f}" for f in self.bad_files)
        return out


def import_tree(store: Store, root: str | os.PathLike[str], *, progress: bool = True, allow_symlinks: bool = False) -> ImportSummary:
    """Copy every entry of an upstream tree into ``store`` as ``imported`` (idempotent).

    A file that cannot be served (not JSON, nested too deeply, a lone surrogate, a symbolic link
    out of the tree) is left out, reported in :attr:`ImportSummary.bad_files`, and the import goes on.
    """
    summary = ImportSummary()
    started = time.perf_counter()
    refused: list[str] = []
    files = list(iter_cache_files(root, allow_symlinks=allow_symlinks, refused=refused))
    summary.bad_files.extend(refused)
    origin_root = Path(root).name or str(root)
    batch: list[tuple[Record, str | None]] = []

    def flush() -> None:
        for added in store.add_many(batch):
            if added:
                summary.added += 1
            else:
                summary.already_present += 1
        batch.clear()

    with tqdm(total=len(files), desc="import", unit="file", disable=not progress) as bar:
        for namespace, path in files:
            bar.update(1)
            origin = f"import:{origin_root}/{namespace}.json"
            try:
                # the whole file is checked before any of it is written: a crafted file is left out entirely
                entries = list(iter_cache_entries(path))
            except (OSError, ValueError) as exc:
                log.warning("skipping %s: %s", path, exc)
                summary.bad_files.append(str(exc) if str(path) in str(exc) else f"{path}: {exc}")
                continue
            summary.files += 1
            for key, _answer, body in entries:
                summary.entries += 1
                record = Record(namespace=namespace, key=key, body=body, source="imported", origin=origin)
                batch.append((record, canonical_from_upstream_key(key)))
            if len(batch) >= IMPORT_BATCH:
                flush()
            if progress:
                bar.set_postfix_str(f"{summary.entries:,} entries", refresh=False)
    if batch:
        flush()
    summary.seconds = time.perf_counter() - started
    return summary


@dataclass
class ExportSummary:
    files: int = 0
    entries: int = 0
    skipped_namespaces: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def lines(self) -> list[str]:
        out = [
            f"files written:    {self.files}",
            f"entries written:  {self.entries}",
            f"time:             {self.seconds:.1f} s ({_rate(self.entries, self.seconds, 'entries')})",
        ]
        if self.skipped_namespaces:
            out.append(f"skipped (unsafe names): {len(self.skipped_namespaces)}")
        return out


def export_tree(store: Store, root: str | os.PathLike[str], *, progress: bool = True) -> ExportSummary:
    """Write the store as an upstream tree (one JSON object per API file), one API in memory at a time."""
    summary = ExportSummary()
    started = time.perf_counter()
    counts = store.counts()
    with tqdm(total=counts.entries if counts else None, desc="export", unit="entry", disable=not progress) as bar:
        for namespace, records in store.iter_groups():
            bar.update(len(records))
            path = namespace_path(root, namespace)
            if path is None:
                summary.skipped_namespaces.append(namespace)
                continue
            write_cache_file(path, {r.key: r.answer for r in records})
            summary.files += 1
            summary.entries += len(records)
    summary.seconds = time.perf_counter() - started
    return summary


def store_stats(store: Store) -> dict[str, Any]:
    """Entries by source and category, APIs, origins and size per entry: from the store's counters
    when it keeps them (no scan, fast at any size), else from one pass over the records."""
    counts = store.counts()
    if counts is not None:
        by_source, by_category, origins = counts.by_source, counts.by_category, Counter(counts.by_origin)
        entries, apis, scanned = counts.entries, counts.apis, False
        disk, memory = counts.disk_bytes, counts.memory_bytes
    else:
        by_source, by_category, origins = Counter(), Counter(), Counter()
        namespaces: set[str] = set()
        for record in store:
            by_source[record.source] += 1
            by_category[record.namespace.split("/", 1)[0]] += 1
            namespaces.add(record.namespace)
            if record.source != "imported":
                origins[record.origin] += 1
        entries, apis, scanned = sum(by_source.values()), len(namespaces), True
        disk = memory = None
    return {
        "entries": entries,
        "apis": apis,
        "by_source": dict(sorted(by_source.items())),
        "by_category": dict(sorted(by_category.items())),
        "origins": dict(origins.most_common()),
        "counted_by": "full scan" if scanned else "counters",
        "disk_bytes": disk,
        "memory_bytes": memory,
        "bytes_per_entry": (round((disk or memory) / entries) if entries and (disk or memory) else None),
    }
