"""Read-only layers over upstream ``tool_response_cache`` trees, served without conversion.

An entry is a failure record when the tree's snapshot ``manifest.json`` lists it in
``failure_entries``, or when it is upstream's own failed answer (``Failed to generate fake
response``, which upstream's server saves like any answer): it is served as recorded, but a
usable answer for the same call wins over it, and ``record`` mode may try the call again.

Each API file is parsed once on first use and kept in memory (re-read when its
modification time changes), so a hit costs a dict lookup whatever the file's size.
The canonical index of a file is built only when a canonical lookup needs it.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

from ..failures import TREE_FAILURE_REASON, is_tree_failure, manifest_mtime_ns, tree_failure_entries
from ..keys import canonical_from_upstream_key
from ..protocol import encode_answer
from ..records import FAILURE, Record
from ..upstream_layout import namespace_path, read_cache_file

log = logging.getLogger(__name__)


@dataclass
class _LoadedFile:
    mtime_ns: int
    bodies: dict[str, str]
    failures: frozenset[str] = frozenset()
    """The keys of the file's failure records."""
    canonical: dict[str, str] | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


class FrozenCache:
    """One upstream tree, read-only."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.origin = f"frozen:{self.root}"
        self._files: dict[str, _LoadedFile | None] = {}
        self._lock = threading.Lock()
        self._failures: tuple[int, frozenset[tuple[str, str]]] = (-1, frozenset())

    def _load(self, namespace: str) -> _LoadedFile | None:
        path = namespace_path(self.root, namespace)
        if path is None:
            return None
        try:
            mtime_ns = os.stat(path).st_mtime_ns
        except OSError:
            return None
        loaded = self._files.get(namespace)
        if loaded is not None and loaded.mtime_ns == mtime_ns:
            return loaded
        with self._lock:
            loaded = self._files.get(namespace)
            if loaded is not None and loaded.mtime_ns == mtime_ns:
                return loaded
            try:
                entries = read_cache_file(path)
            except (OSError, ValueError) as exc:
                log.warning("frozen cache file %s cannot be read: %s", path, exc)
                return None
            bodies = {k: encode_answer(v) for k, v in entries.items()}
            listed = self._failure_entries()
            failures = frozenset(k for k, body in bodies.items() if is_tree_failure(namespace, k, body, listed))
            loaded = _LoadedFile(mtime_ns, bodies, failures)
            self._files[namespace] = loaded
            return loaded

    def _failure_entries(self) -> frozenset[tuple[str, str]]:
        """The entries the tree's snapshot manifest lists as failure records (re-read when it changes)."""
        mtime_ns = manifest_mtime_ns(self.root)
        if self._failures[0] != mtime_ns:
            self._failures = (mtime_ns, frozenset(tree_failure_entries(self.root)) if mtime_ns != -1 else frozenset())
        return self._failures[1]

    def _record(self, namespace: str, key: str, body: str, failure: bool = False) -> Record:
        if failure:
            return Record(namespace=namespace, key=key, body=body, source="imported", origin=self.origin, created_at=0.0,
                          outcome=FAILURE, reason=TREE_FAILURE_REASON)
        return Record(namespace=namespace, key=key, body=body, source="imported", origin=self.origin, created_at=0.0)

    def get(self, namespace: str, key: str) -> Record | None:
        loaded = self._load(namespace)
        if loaded is None:
            return None
        body = loaded.bodies.get(key)
        return None if body is None else self._record(namespace, key, body, key in loaded.failures)

    def get_canonical(self, namespace: str, canonical: str) -> Record | None:
        loaded = self._load(namespace)
        if loaded is None:
            return None
        if loaded.canonical is None:
            with loaded.lock:
                if loaded.canonical is None:
                    index: dict[str, str] = {}
                    for key in loaded.bodies:
                        ckey = canonical_from_upstream_key(key)
                        if ckey is not None:
                            # a usable answer takes the canonical key from a failure record
                            if ckey not in index or (index[ckey] in loaded.failures and key not in loaded.failures):
                                index[ckey] = key
                    loaded.canonical = index
        key = loaded.canonical.get(canonical)
        return None if key is None else self._record(namespace, key, loaded.bodies[key], key in loaded.failures)

    def sample(self, namespace: str, limit: int) -> list[Record]:
        """Up to ``limit`` usable entries of one API file, in file order (few-shot examples)."""
        loaded = self._load(namespace)
        if loaded is None or limit <= 0:
            return []
        out: list[Record] = []
        for key, body in loaded.bodies.items():
            if len(out) >= limit:
                break
            if key not in loaded.failures:
                out.append(self._record(namespace, key, body))
        return out
