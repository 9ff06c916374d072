"""Read-only layers over upstream ``tool_response_cache`` trees, served without conversion.

A tree of any size is served with bounded memory:

* nothing is read at start: an API file is parsed the first time one of its calls is looked up
  (a stat per lookup notices a file changed on disk, which is then parsed again);
* parsing keeps an **index** of the file in memory, not its answers: each upstream key and the
  byte span of its answer in the file.  A hit reads that span back (one ``pread`` on the file
  kept open), so memory grows with the number of keys, not with the size of the answers;
  answers served recently are also kept, in a bounded memory of their own;
* indexes and kept answers together stay under a **memory budget** (``frozen_memory_mb``, a
  fifth of it for answers): the least recently used are dropped and re-read when needed again
  (answers byte-identical);
* parsing runs off the event loop (:meth:`FrozenCache.aget`), one entry at a time, so a large
  file loading never holds up answers from files already indexed;
* a file that cannot be served (not a JSON object, nested too deeply, a lone surrogate, a
  symbolic link out of the tree, larger than ``frozen_max_file_mb``) is skipped with one warning naming it, and the lookup falls
  through to the next tier as if the file were absent.

The canonical index of a file is built only when a canonical lookup needs it.

The kept answers are a cachetools ``LRUCache``.  The file indexes are an ``OrderedDict`` kept by hand,
because cachetools' maps fit them in none of three ways: an index grows after it is kept (its canonical
index is added on demand, and counted against the budget then), the file just parsed stays even when it
alone is over the budget (cachetools refuses such an item), and every hit reads the map without a lock
(the order is touched only when the file is not already the most recent one).

An entry is a failure record when the tree's snapshot ``manifest.json`` lists it in
``failure_entries``, or when it is upstream's own failed answer (``Failed to generate fake
response``, which upstream's server saves like any answer): it is served as recorded, but a
usable answer for the same call wins over it (see :mod:`..failures`).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import threading
from array import array
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cachetools import LRUCache

from stabletoolbench_mirror.core.keys import canonical_from_upstream_key
from stabletoolbench_mirror.core.protocol import encode_answer
from stabletoolbench_mirror.core.records import ANSWER, FAILURE, Record
from stabletoolbench_mirror.stores.base import CacheTier
from stabletoolbench_mirror.upstream.failures import TREE_FAILURE_REASON, UPSTREAM_FAILURE_BODY, manifest_mtime_ns, tree_failure_entries
from stabletoolbench_mirror.upstream.layout import OutsideTree, api_file_parts, check_inside, iter_cache_spans

log = logging.getLogger(__name__)

DEFAULT_MEMORY_BUDGET = 320 * 1024 * 1024
#: ``frozen_max_file_mb``'s default: a larger file is refused, not parsed (about twice its size in memory)
DEFAULT_MAX_FILE_BYTES = 512 * 1024 * 1024
#: estimated bytes of one indexed entry beyond its key's characters (dict slot, str header, span)
_ENTRY_OVERHEAD = 140
_CANONICAL_OVERHEAD = 150
_BODY_OVERHEAD = 120
#: files kept open at once (for ``pread``); beyond it a hit opens its file for the read
MAX_OPEN_FILES = 2048


class _KeyLocks:
    """A lock per key, made while someone holds or waits for it and dropped after (memory: the keys in use)."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[str, list[Any]] = {}  # key -> [lock, holders and waiters]

    @contextlib.contextmanager
    def hold(self, key: str) -> Iterator[None]:
        with self._guard:
            entry = self._locks.get(key)
            if entry is None:
                entry = self._locks[key] = [threading.Lock(), 0]
            entry[1] += 1
        try:
            with entry[0]:
                yield
        finally:
            with self._guard:
                entry[1] -= 1
                if entry[1] == 0:
                    del self._locks[key]


_SERIALS = itertools.count(1)


@dataclass(eq=False)
class _Index:
    """One parsed API file: upstream key -> entry number, and each entry's answer span in the file."""

    path: str
    ident: tuple[int, int, int]
    """``(st_ino, st_size, st_mtime_ns)`` of the file the spans point into."""
    entries: dict[str, int]
    spans: array
    """``2 * n`` unsigned integers: byte offset and byte length of entry ``n``'s answer."""
    cost: int
    fd: int | None = None
    """The file, kept open while this index lives (closed when the last user drops it)."""
    canonical: dict[str, str] | None = None
    listed_failures: frozenset[str] = frozenset()
    """The keys the tree's manifest lists as failure records."""
    serial: int = field(default_factory=lambda: next(_SERIALS))
    """This index's own number, never reused (what a kept hit was looked up in: :meth:`FrozenCache.state_token`)."""

    def __del__(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            _OPEN_FILES.release()
            try:
                os.close(fd)
            except OSError:
                pass


#: how many index files are open, so a huge tree does not run the process out of descriptors
_OPEN_FILES = threading.BoundedSemaphore(MAX_OPEN_FILES)


class _NeedsLoad:
    """A lookup that would have to parse a file (the async path then goes to a thread)."""


NEEDS_LOAD = _NeedsLoad()


def too_large(path: str | os.PathLike[str], size: int, limit: int) -> str:
    """The warning for a cache file over ``frozen_max_file_mb``: the file, its size, the key to raise."""
    mb = 1024 * 1024
    return (f"{os.fspath(path)}: {size / mb:,.1f} MB, over frozen_max_file_mb ({limit / mb:g} MB): not parsed; "
            "raise frozen_max_file_mb to read it (parsing takes about twice its size in memory)")


def _ident(st: os.stat_result) -> tuple[int, int, int]:
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class FrozenCache(CacheTier):
    """One upstream tree, read-only, with a memory budget for its file indexes.

    A cache tier whose answers are served with ``source: frozen``.
    """

    kind = "frozen"

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        memory_budget: int = DEFAULT_MEMORY_BUDGET,
        allow_symlinks: bool = False,
        max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
    ) -> None:
        self.root = Path(root)
        self.max_file_bytes = int(max_file_bytes)
        self._root = str(self.root)
        self.origin = f"frozen:{self.root}"
        self.memory_budget = max(0, int(memory_budget))
        self.allow_symlinks = allow_symlinks
        self._threads: Any = None
        """The limiter of the threads that parse files (:meth:`use_threads`; anyio's default until then)."""
        self._files: OrderedDict[str, _Index] = OrderedDict()
        self.bodies_budget = self.memory_budget // 5
        self._bodies: LRUCache[tuple[str, str], tuple[tuple[int, int, int], str, int]] = LRUCache(
            max(1, self.bodies_budget), getsizeof=lambda kept: kept[2])
        """(api, key) -> (the file's identity, the answer, its estimated bytes)."""
        self._refused: dict[str, tuple[int, int, int]] = {}
        self._lock = threading.Lock()
        self._loading = _KeyLocks()
        """One lock per API being parsed or indexed: a file's load never holds up another API's."""
        self.memory_used = 0
        self.loads = 0
        self.evictions = 0
        self._manifest: tuple[int, dict[str, frozenset[str]]] = (-2, {})

    # -- what is known without reading files ---------------------------------------------------

    def use_threads(self, limiter: Any) -> None:
        """Parse files in threads under ``limiter`` (the server's, shared fairly between clients)."""
        self._threads = limiter

    def memory(self) -> dict[str, int]:
        """Indexed files, estimated bytes used, the budget, loads and evictions so far."""
        return {"files": len(self._files), "bytes": self.memory_used + int(self._bodies.currsize), "budget": self.memory_budget,
                "answers_kept": len(self._bodies), "loads": self.loads, "evictions": self.evictions}

    def _path(self, api: str) -> str | None:
        parts = api_file_parts(api)
        return None if parts is None else f"{self._root}/{parts[0]}/{parts[1]}/{parts[2]}.json"

    # -- loading -------------------------------------------------------------------------------

    def _state(self, api: str) -> _Index | None | _NeedsLoad:
        """The fresh index of ``api``, ``None`` (nothing to serve) or :data:`NEEDS_LOAD`; only stats the file.

        Every hit of a frozen tree passes here (and :meth:`state_token`): an indexed file's path is
        its index's, and the least-recently-used order is touched only when it changes.
        """
        files = self._files
        index = files.get(api)
        path = index.path if index is not None else self._path(api)
        if path is None:
            return None
        try:
            ident = _ident(os.stat(path))
        except OSError:
            if api in files:
                self._drop(api)
            return None
        if index is not None and index.ident == ident:
            if next(reversed(files), None) != api:
                with self._lock:
                    if api in files:
                        files.move_to_end(api)
            return index
        if self._refused.get(api) == ident:
            return None
        return NEEDS_LOAD

    def _index(self, api: str) -> _Index | None:
        """The index of ``api``, parsing the file when needed (blocking: call it off the event loop)."""
        state = self._state(api)
        if not isinstance(state, _NeedsLoad):
            return state
        with self._loading.hold(api):
            state = self._state(api)  # another thread may have loaded it meanwhile
            if not isinstance(state, _NeedsLoad):
                return state
            path = self._path(api)
            assert path is not None
            try:
                index = self._parse(path)
            except (OSError, ValueError) as exc:
                try:
                    self._refused[api] = _ident(os.stat(path))
                except OSError:
                    pass
                if isinstance(exc, OutsideTree):
                    log.warning("frozen cache: refused %s", exc)
                else:
                    log.warning("frozen cache file skipped: %s", exc if str(path) in str(exc) else f"{path}: {exc}")
                return None
            self._refused.pop(api, None)
            index.listed_failures = self._listed_failures().get(api, frozenset())
            self._insert(api, index)
            return index

    def _listed_failures(self) -> dict[str, frozenset[str]]:
        """The failure entries of the tree's snapshot manifest by API (re-read when it changes; read at file loads only)."""
        mtime_ns = manifest_mtime_ns(self.root)
        if self._manifest[0] != mtime_ns:
            by_api: dict[str, set[str]] = {}
            for api, key in tree_failure_entries(self.root) if mtime_ns != -1 else ():
                by_api.setdefault(api, set()).add(key)
            self._manifest = (mtime_ns, {api: frozenset(keys) for api, keys in by_api.items()})
        return self._manifest[1]

    def _parse(self, path: str) -> _Index:
        if not self.allow_symlinks:
            check_inside(path, self.root)
        fd = os.open(path, os.O_RDONLY)
        try:
            st = os.fstat(fd)
            ident = _ident(st)
            if st.st_size > self.max_file_bytes:
                raise ValueError(too_large(path, st.st_size, self.max_file_bytes))
            with open(fd, "rb", closefd=False) as fh:
                data = fh.read()
            index = self._index_text(path, ident, data)
        except BaseException:
            os.close(fd)
            raise
        if _OPEN_FILES.acquire(blocking=False):
            index.fd = fd  # kept for the hits' reads; closed with the index
        else:
            os.close(fd)
        return index

    def _index_text(self, path: str, ident: tuple[int, int, int], data: bytes) -> _Index:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"{path}: not UTF-8: {exc}") from None
        ascii_text = len(text) == len(data)
        entries: dict[str, int] = {}
        spans = array("Q")
        cost = 0
        char_pos = byte_pos = 0
        for key, _value, _body, start, end in iter_cache_spans(text, path, bodies=False):
            if ascii_text:
                byte_start, byte_len = start, end - start
            else:
                byte_start = byte_pos + len(text[char_pos:start].encode("utf-8"))
                byte_len = len(text[start:end].encode("utf-8"))
                char_pos, byte_pos = end, byte_start + byte_len
            number = len(spans) // 2
            spans.append(byte_start)
            spans.append(byte_len)
            if key not in entries:
                cost += len(key) + _ENTRY_OVERHEAD
            entries[key] = number
        return _Index(path, ident, entries, spans, cost)

    def _insert(self, api: str, index: _Index) -> None:
        with self._lock:
            old = self._files.pop(api, None)
            if old is not None:
                self.memory_used -= old.cost
            self._files[api] = index
            self.memory_used += index.cost
            self.loads += 1
            self._evict(keep=api)

    def _evict(self, keep: str) -> None:
        # least recently used first; the file just needed stays even when it alone exceeds the budget
        while self.memory_used > self.memory_budget - self.bodies_budget and len(self._files) > 1:
            api, index = next(iter(self._files.items()))
            if api == keep:
                self._files.move_to_end(api)
                continue
            del self._files[api]
            self.memory_used -= index.cost
            self.evictions += 1

    def _drop(self, api: str) -> None:
        with self._lock:
            index = self._files.pop(api, None)
            if index is not None:
                self.memory_used -= index.cost

    def _canonical(self, api: str, index: _Index) -> dict[str, str]:
        if index.canonical is None:
            with self._loading.hold(api):
                if index.canonical is None:
                    canonical: dict[str, str] = {}
                    for key in index.entries:
                        ckey = canonical_from_upstream_key(key)
                        if ckey is None:
                            continue
                        first = canonical.setdefault(ckey, key)
                        # spellings of one call: a usable answer takes the canonical key from a failure
                        if first != key and self._is_failure(api, index, first) and not self._is_failure(api, index, key):
                            canonical[ckey] = key
                    index.canonical = canonical
                    with self._lock:
                        extra = sum(len(k) + _CANONICAL_OVERHEAD for k in canonical)
                        index.cost += extra
                        if self._files.get(api) is index:
                            self.memory_used += extra
                            self._evict(keep=api)
        return index.canonical

    # -- answers -------------------------------------------------------------------------------

    def _body(self, api: str, index: _Index, key: str) -> str | None:
        number = index.entries.get(key)
        if number is None:
            return None
        where = (api, key)
        with self._lock:
            kept = self._bodies.get(where)
        if kept is not None and kept[0] == index.ident:
            return kept[1]
        raw = self._read(index, number)
        if raw is None:
            # changed since it was indexed (the stat that chose this index raced with a rewrite)
            self._drop(api)
            fresh = self._index(api)
            return None if fresh is None or fresh is index else self._body(api, fresh, key)
        body = encode_answer(json.loads(raw.decode("utf-8")))
        self._keep(where, index.ident, body)
        return body

    @staticmethod
    def _read(index: _Index, number: int) -> bytes | None:
        start, length = index.spans[2 * number], index.spans[2 * number + 1]
        fd = index.fd
        try:
            if fd is not None:
                raw = os.pread(fd, length, start)
            else:
                fd = os.open(index.path, os.O_RDONLY)
                try:
                    if _ident(os.fstat(fd)) != index.ident:
                        return None
                    raw = os.pread(fd, length, start)
                finally:
                    os.close(fd)
        except OSError:
            return None
        return raw if len(raw) == length else None

    def _keep(self, where: tuple[str, str], ident: tuple[int, int, int], body: str) -> None:
        size = len(body) + len(where[1]) + _BODY_OVERHEAD
        if size <= self.bodies_budget // 8:
            with self._lock:
                self._bodies[where] = (ident, body, size)

    def _is_failure(self, api: str, index: _Index, key: str) -> bool:
        return key in index.listed_failures or self._body(api, index, key) == UPSTREAM_FAILURE_BODY

    def _lookup(self, api: str, index: _Index | None, key: str) -> Record | None:
        if index is None:
            return None
        body = self._body(api, index, key)
        if body is None:
            return None
        failure = key in index.listed_failures or body == UPSTREAM_FAILURE_BODY
        return Record(api=api, key=key, body=body, source="frozen", origin=self.origin, created_at=0.0,
                      outcome=FAILURE if failure else ANSWER, reason=TREE_FAILURE_REASON if failure else "")

    def get(self, api: str, key: str) -> Record | None:
        return self._lookup(api, self._index(api), key)

    def get_canonical(self, api: str, canonical: str) -> Record | None:
        index = self._index(api)
        if index is None:
            return None
        key = self._canonical(api, index).get(canonical)
        return None if key is None else self._lookup(api, index, key)

    def state_token(self, api: str) -> object:
        """What this tree's answers for ``api`` come from now (only stats the file): equal tokens, equal answers.

        The index's serial number, ``None`` when there is nothing to serve, and an object equal to
        nothing when the file is still to be parsed (see :mod:`..engine.recent_hits`).
        """
        state = self._state(api)
        if isinstance(state, _NeedsLoad):
            return object()
        return None if state is None else state.serial

    async def aget(self, api: str, key: str) -> Record | None:
        """:meth:`get` for the event loop: an indexed file is read at once, a file to parse in a thread."""
        state = self._state(api)
        if isinstance(state, _NeedsLoad):
            import anyio.to_thread

            return await anyio.to_thread.run_sync(self.get, api, key, limiter=self._threads)
        return self._lookup(api, state, key)

    async def aget_canonical(self, api: str, canonical: str) -> Record | None:
        """:meth:`get_canonical` for the event loop (parsing and the canonical index in a thread)."""
        state = self._state(api)
        if isinstance(state, _NeedsLoad) or (state is not None and state.canonical is None):
            import anyio.to_thread

            return await anyio.to_thread.run_sync(self.get_canonical, api, canonical, limiter=self._threads)
        if state is None:
            return None
        key = state.canonical.get(canonical) if state.canonical is not None else None
        return None if key is None else self._lookup(api, state, key)

    def sample(self, api: str, limit: int) -> list[Record]:
        """Up to ``limit`` usable entries of one API file, in file order (few-shot examples)."""
        index = self._index(api)
        if index is None or limit <= 0:
            return []
        out: list[Record] = []
        for key in index.entries:
            if len(out) >= limit:
                break
            record = self._lookup(api, index, key)
            if record is not None and not record.is_failure:
                out.append(record)
        return out
