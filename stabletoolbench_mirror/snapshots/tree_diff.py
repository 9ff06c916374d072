"""What changed between two stores, snapshots or upstream trees (``cache diff A B``, :mod:`stabletoolbench_mirror.commands.cache_diff`).

Each side is read one API at a time in api order (a store through :meth:`Store.iter_groups`, a
tree one file at a time), and the two are merged: memory holds one API of each side, the bound
``cache export`` keeps, however large the two are.  Answers are compared in their served
encoding (what a client gets), so a store and the snapshot made from it are the same.

A side is one of: ``store`` (the configured store), a diskcache folder (it holds ``cache.db``),
``redis://host:port/db[#prefix=P]``, a snapshot or ``tool_response_cache`` folder, or a snapshot
archive (``.tar.gz``, or an ``http(s)://`` URL to one, fetched as ``frozen_caches`` fetches it).
Exit status: 0 the same, 1 different, 2 an error.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import groupby
from typing import Any

from stabletoolbench_mirror.config import ConfigError, Settings
from stabletoolbench_mirror.core.progress import progress_bar
from stabletoolbench_mirror.core.protocol import encode_answer
from stabletoolbench_mirror.stores import Store, StoreError
from stabletoolbench_mirror.stores.kinds import StoreSpec
from stabletoolbench_mirror.upstream.archives import ArchiveError, ArchiveLimits, is_archive, local_tree
from stabletoolbench_mirror.upstream.layout import iter_cache_files, read_cache_file

Group = tuple[str, dict[str, str]]
"""One API of a side: its name and ``key -> served body``."""


class DiffError(RuntimeError):
    """A side cannot be read (the message names it)."""


def _store_groups(store: Store) -> Iterator[Group]:
    for api, records in store.iter_groups():
        yield api, {r.key: r.body for r in records}


def _tree_groups(root: str, progress: bool, desc: str) -> Iterator[Group]:
    files = sorted(iter_cache_files(root, allow_symlinks=False))
    for api, items in groupby(progress_bar(files, desc=desc, unit="file", disable=not progress), key=lambda f: f[0]):
        entries: dict[str, str] = {}
        for _api, path in items:
            try:
                entries.update((key, encode_answer(answer)) for key, answer in read_cache_file(path).items())
            except (OSError, ValueError) as exc:
                raise DiffError(f"unreadable file {path}: {exc}") from exc
        yield api, entries


@contextlib.contextmanager
def open_side(spec: str, settings: Settings, *, progress: bool, desc: str) -> Iterator[Iterator[Group]]:
    """The API groups of one side, in api order (see the module docstring for what ``spec`` may be)."""
    from stabletoolbench_mirror.factory import build_store

    store: Store | None = None
    try:
        if spec == "store":
            store = build_store(settings, read_only=True)
        elif (named := StoreSpec.parse(spec, StoreSpec.of(settings))) is not None:
            store = named.open(read_only=True)
        elif is_archive(spec):
            spec = local_tree(spec, settings.resolve(settings.download_dir), progress=progress, limits=ArchiveLimits.of(settings))
        if store is None and not os.path.isdir(spec):
            raise DiffError(f"{spec}: not a store, a snapshot or a tree (no such folder)")
    except (StoreError, ArchiveError, ConfigError) as exc:
        raise DiffError(str(exc)) from exc
    try:
        yield _store_groups(store) if store is not None else _tree_groups(spec, progress, desc)
    finally:
        if store is not None:
            store.close()


@dataclass
class Diff:
    """What ``cache diff`` found: counts in all, per API, and the first changed keys with both answers."""

    show: int = 5
    entries_a: int = 0
    entries_b: int = 0
    by_api: dict[str, dict[str, int]] = field(default_factory=dict)
    """The APIs with any key added, removed or changed, and how many of each; the totals are their sums."""
    changed_keys: list[dict[str, str]] = field(default_factory=list)

    @property
    def same(self) -> bool:
        return not self.by_api

    @property
    def added(self) -> int:
        return sum(n["added"] for n in self.by_api.values())

    @property
    def removed(self) -> int:
        return sum(n["removed"] for n in self.by_api.values())

    @property
    def changed(self) -> int:
        return sum(n["changed"] for n in self.by_api.values())

    def compare(self, api: str, a: dict[str, str], b: dict[str, str]) -> None:
        self.entries_a += len(a)
        self.entries_b += len(b)
        added = sum(1 for key in b if key not in a)
        removed = sum(1 for key in a if key not in b)
        changed = 0
        for key, body in a.items():
            other = b.get(key)
            if other is not None and other != body:
                changed += 1
                if len(self.changed_keys) < self.show:
                    self.changed_keys.append({"api": api, "key": key, "a": body, "b": other})
        if added or removed or changed:
            self.by_api[api] = {"added": added, "removed": removed, "changed": changed}

    def to_json(self, a: str, b: str) -> dict[str, Any]:
        return {"a": a, "b": b, "same": self.same, "added": self.added, "removed": self.removed, "changed": self.changed,
                "entries_a": self.entries_a, "entries_b": self.entries_b, "by_api": self.by_api, "changed_keys": self.changed_keys}

    def lines(self, a: str, b: str) -> list[str]:
        out = [f"A: {a} ({self.entries_a:,} entries)", f"B: {b} ({self.entries_b:,} entries)"]
        for api, n in self.by_api.items():
            out.append(f"  {api}: {n['added']} added, {n['removed']} removed, {n['changed']} changed")
        for item in self.changed_keys:
            out += [f"changed: {item['api']} {item['key']}", f"  A: {item['a'][:500]}", f"  B: {item['b'][:500]}"]
        verdict = "the same" if self.same else f"different in {len(self.by_api)} APIs"
        out.append(f"added: {self.added}  removed: {self.removed}  changed: {self.changed}  ({verdict})")
        return out


def _in_order(groups: Iterator[Group], side: str) -> Iterator[Group]:
    """``groups``, checked to come in api order (the merge depends on it)."""
    last: str | None = None
    for api, entries in groups:
        if last is not None and api <= last:
            raise DiffError(f"{side}: APIs not in order ({api!r} after {last!r})")
        last = api
        yield api, entries


def diff(a: Iterator[Group], b: Iterator[Group], *, show: int = 5) -> Diff:
    """Merge two api-ordered sides, one API of each in memory."""
    result = Diff(show=show)
    a, b = _in_order(a, "A"), _in_order(b, "B")
    left, right = next(a, None), next(b, None)
    while left is not None or right is not None:
        if right is None or (left is not None and left[0] < right[0]):
            assert left is not None
            result.compare(left[0], left[1], {})
            left = next(a, None)
        elif left is None or right[0] < left[0]:
            result.compare(right[0], {}, right[1])
            right = next(b, None)
        else:
            result.compare(left[0], left[1], right[1])
            left, right = next(a, None), next(b, None)
    return result
