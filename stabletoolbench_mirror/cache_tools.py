"""Moving entries between the store and upstream ``tool_response_cache`` trees."""

from __future__ import annotations

import logging
import os
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

from tqdm import tqdm

from .keys import canonical_from_upstream_key
from .records import Record
from .stores import Store
from .upstream_layout import ENCODED_PREFIX, iter_cache_files, namespace_path, read_cache_file, write_cache_file

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
            record = Record.from_answer(namespace, key, answer, "imported", f"import:{origin_root}/{namespace}.json")
            if store.add(record, canonical_from_upstream_key(key)):
                summary.added += 1
            else:
                summary.already_present += 1
    return summary


@dataclass
class ExportSummary:
    files: int = 0
    entries: int = 0
    encoded_names: int = 0
    """Files written under an encoded name (see :mod:`~stabletoolbench_mirror.upstream_layout`)."""
    left_out: dict[str, int] = field(default_factory=dict)
    """Entries per API whose name is too long for a file name even encoded: not written."""

    @property
    def left_out_entries(self) -> int:
        return sum(self.left_out.values())

    def lines(self, *, limit: int = 20) -> list[str]:
        out = [f"files written:    {self.files}", f"entries written:  {self.entries}"]
        if self.encoded_names:
            out.append(f"encoded names:    {self.encoded_names} files (names unsafe as paths, written as %%...)")
        if self.left_out:
            out.append(f"LEFT OUT:         {self.left_out_entries} entries of {len(self.left_out)} APIs whose names are too long for a file name:")
            out.extend(f"  {namespace[:300]} ({n} entries)" for namespace, n in list(self.left_out.items())[:limit])
            if len(self.left_out) > limit:
                out.append(f"  ... and {len(self.left_out) - limit} more")
        return out


def iter_api_groups(records: Iterable[Record]) -> Iterator[tuple[str, list[Record]]]:
    """Records grouped per API file, in namespace order, each group in recording order."""
    groups: dict[str, list[Record]] = defaultdict(list)
    for record in records:
        groups[record.namespace].append(record)
    for namespace in sorted(groups):
        group = groups.pop(namespace)
        group.sort(key=lambda r: (r.created_at, r.key))
        yield namespace, group


@dataclass(frozen=True)
class ExportedFile:
    """One API of the store as written by :func:`iter_export`: its file, or ``None`` when it was left out."""

    namespace: str
    records: list[Record]
    path: Path | None

    @property
    def encoded(self) -> bool:
        """Whether a part of its name was encoded (a literal name never starts with the marker)."""
        return self.path is not None and any(p.startswith(ENCODED_PREFIX) for p in self.path.parts[-3:])


def iter_export(store: Store, root: str | os.PathLike[str], *, progress: bool = True) -> Iterator[ExportedFile]:
    """Write the store as an upstream tree, one API file at a time, yielding each as it is written."""
    records = tqdm(store, desc="export", unit="entry", disable=not progress)
    for namespace, group in iter_api_groups(records):
        path = namespace_path(root, namespace)
        if path is not None:
            write_cache_file(path, {r.key: r.answer for r in group})
        yield ExportedFile(namespace, group, path)


def export_tree(store: Store, root: str | os.PathLike[str], *, progress: bool = True) -> ExportSummary:
    """Write the store as an upstream tree (one JSON object per API file)."""
    summary = ExportSummary()
    for exported in iter_export(store, root, progress=progress):
        count(summary, exported)
    return summary


def count(summary: ExportSummary, exported: ExportedFile) -> None:
    if exported.path is None:
        summary.left_out[exported.namespace] = len(exported.records)
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

    def add(self, record: Record) -> None:
        self.entries += 1
        self.by_source[record.source] += 1
        self.by_category[record.namespace.split("/", 1)[0]] += 1
        self.apis.add(record.namespace)
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
        }


def _origin_group(record: Record) -> str:
    # an import's origin names each file ("import:<root>/<namespace>.json"): keep the root
    if record.source == "imported":
        return record.origin.split("/", 1)[0]
    return record.origin


def store_stats(store: Store) -> dict[str, Any]:
    tally = Tally()
    for record in store:
        tally.add(record)
    return tally.to_json()
