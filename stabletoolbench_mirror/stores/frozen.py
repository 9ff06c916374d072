"""Read-only layers over upstream ``tool_response_cache`` trees, served without conversion.

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

from ..keys import canonical_from_upstream_key
from ..protocol import encode_answer
from ..records import Record
from ..upstream_layout import api_path, read_cache_file
from .base import CacheTier

log = logging.getLogger(__name__)


@dataclass
class _LoadedFile:
    mtime_ns: int
    bodies: dict[str, str]
    canonical: dict[str, str] | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


class FrozenCache(CacheTier):
    """One upstream tree, read-only: a cache tier whose answers are served with ``source: frozen``."""

    kind = "frozen"
    is_local = True

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.origin = f"frozen:{self.root}"
        self._files: dict[str, _LoadedFile | None] = {}
        self._lock = threading.Lock()

    def _load(self, api: str) -> _LoadedFile | None:
        path = api_path(self.root, api)
        if path is None:
            return None
        try:
            mtime_ns = os.stat(path).st_mtime_ns
        except OSError:
            return None
        loaded = self._files.get(api)
        if loaded is not None and loaded.mtime_ns == mtime_ns:
            return loaded
        with self._lock:
            loaded = self._files.get(api)
            if loaded is not None and loaded.mtime_ns == mtime_ns:
                return loaded
            try:
                entries = read_cache_file(path)
            except (OSError, ValueError) as exc:
                log.warning("frozen cache file %s cannot be read: %s", path, exc)
                return None
            loaded = _LoadedFile(mtime_ns, {k: encode_answer(v) for k, v in entries.items()})
            self._files[api] = loaded
            return loaded

    def _record(self, api: str, key: str, body: str) -> Record:
        return Record(api=api, key=key, body=body, source="frozen", origin=self.origin, created_at=0.0)

    def get(self, api: str, key: str) -> Record | None:
        loaded = self._load(api)
        if loaded is None:
            return None
        body = loaded.bodies.get(key)
        return None if body is None else self._record(api, key, body)

    def get_canonical(self, api: str, canonical: str) -> Record | None:
        loaded = self._load(api)
        if loaded is None:
            return None
        if loaded.canonical is None:
            with loaded.lock:
                if loaded.canonical is None:
                    index: dict[str, str] = {}
                    for key in loaded.bodies:
                        ckey = canonical_from_upstream_key(key)
                        if ckey is not None:
                            index.setdefault(ckey, key)
                    loaded.canonical = index
        key = loaded.canonical.get(canonical)
        return None if key is None else self._record(api, key, loaded.bodies[key])

    def sample(self, api: str, limit: int) -> list[Record]:
        """Up to ``limit`` entries of one API file, in file order (few-shot examples)."""
        loaded = self._load(api)
        if loaded is None or limit <= 0:
            return []
        out: list[Record] = []
        for key, body in loaded.bodies.items():
            if len(out) >= limit:
                break
            out.append(self._record(api, key, body))
        return out
