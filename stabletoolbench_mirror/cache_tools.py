"""Moving entries between the store and upstream ``tool_response_cache`` trees."""

from __future__ import annotations

import logging
import os
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from .failures import TREE_FAILURE_REASON, is_tree_failure, tree_failure_entries
from .keys import canonical_from_upstream_key
from .records import Record
from .stores import Store
from .upstream_layout import iter_cache_files, namespace_path, read_cache_file, write_cache_file

log = logging.getLogger(__name__)


@dataclass
class ImportSummary:
    files: int = 0
    entries: int = 0
    added: int = 0
    already_present: int = 0
    bad_files: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [
            f"files read:       {self.files}",
            f"entries read:     {self.entries}",
            f"added:            {self.added}",
            f"already present:  {self.already_present}",
        ]
        if self.bad_files:
            out.append(f"unreadable files: {len(self.bad_files)}")
            out.extend(f"  {f}" for f in self.bad_files)
        return out


def import_tree(store: Store, root: str | os.PathLike[str], *, progress: bool = True) -> ImportSummary:
    """Copy every entry of an upstream tree into ``store`` as ``imported`` (idempotent)."""
    summary = ImportSummary()
    files = list(iter_cache_files(root))
    origin_root = Path(root).name or str(root)
    listed = tree_failure_entries(root)
    for namespace, path in tqdm(files, desc="import", unit="file", disable=not progress):
        try:
            entries = read_cache_file(path)
        except (OSError, ValueError) as exc:
            log.warning("skipping %s: %s", path, exc)
            summary.bad_files.append(f"{path}: {exc}")
            continue
        summary.files += 1
        for key, answer in entries.items():
            summary.entries += 1
            origin = f"import:{origin_root}/{namespace}.json"
            record = Record.from_answer(namespace, key, answer, "imported", origin)
            if is_tree_failure(namespace, key, record.body, listed):
                record = Record.failure(namespace, key, answer, "imported", origin, reason=TREE_FAILURE_REASON)
            if store.add(record, canonical_from_upstream_key(key)):
                summary.added += 1
            else:
                summary.already_present += 1
    return summary


@dataclass
class ExportSummary:
    files: int = 0
    entries: int = 0
    skipped_namespaces: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [f"files written:    {self.files}", f"entries written:  {self.entries}"]
        if self.skipped_namespaces:
            out.append(f"skipped (unsafe names): {len(self.skipped_namespaces)}")
        return out


def group_by_namespace(records: Any) -> dict[str, list[Record]]:
    """Records grouped per API file, each group in recording order."""
    groups: dict[str, list[Record]] = defaultdict(list)
    for record in records:
        groups[record.namespace].append(record)
    for group in groups.values():
        group.sort(key=lambda r: (r.created_at, r.key))
    return dict(sorted(groups.items()))


def export_tree(store: Store, root: str | os.PathLike[str], *, progress: bool = True) -> ExportSummary:
    """Write the store as an upstream tree (one JSON object per API file)."""
    summary = ExportSummary()
    groups = group_by_namespace(tqdm(store, desc="read store", unit="entry", disable=not progress))
    for namespace, records in tqdm(groups.items(), desc="export", unit="file", disable=not progress):
        path = namespace_path(root, namespace)
        if path is None:
            summary.skipped_namespaces.append(namespace)
            continue
        write_cache_file(path, {r.key: r.answer for r in records})
        summary.files += 1
        summary.entries += len(records)
    return summary


def store_stats(store: Store) -> dict[str, Any]:
    by_source: Counter[str] = Counter()
    by_category: Counter[str] = Counter()
    namespaces: set[str] = set()
    origins: Counter[str] = Counter()
    failures: Counter[str] = Counter()
    replaced = 0
    for record in store:
        by_source[record.source] += 1
        if record.is_failure:
            failures[record.reason] += 1
        elif record.replaced is not None:
            replaced += 1
        by_category[record.namespace.split("/", 1)[0]] += 1
        namespaces.add(record.namespace)
        if record.source != "imported":
            origins[record.origin] += 1
    return {
        "entries": sum(by_source.values()),
        "apis": len(namespaces),
        "by_source": dict(sorted(by_source.items())),
        "by_category": dict(sorted(by_category.items())),
        "origins": dict(origins.most_common()),
        "failure_records": sum(failures.values()),
        "failure_reasons": dict(failures.most_common()),
        "replaced_failures": replaced,
    }
