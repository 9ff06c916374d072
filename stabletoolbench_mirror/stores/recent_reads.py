"""The store's recent reads, kept in memory while no process has written to the store since.

A hit on a frozen tree first looks its call up in the store (the store comes first) and misses
there: one SQLite read per request, most of what is left of a hit's own cost.  The answers of
recent reads (``None`` for a miss included) are kept here by their key, each with the store's
**generation** at the time of the read, and served again only while the generation is unchanged.

The generation is 8 bytes in a small file beside SQLite's (:data:`FILE`), mapped into memory by
every process that opens the store: reading it is a memory read, no system call.  Every write of
the store (``add``, ``add_many``, ``replace``, ``delete``, in any process that uses
:class:`~stabletoolbench_mirror.stores.diskcache_store.DiskcacheStore`) writes 8 new random bytes
there *after* its transaction commits.  So a read that starts after a write has committed and
bumped sees a new generation and reads SQLite again: another worker's or ``cache import``'s new
records are served by the next request.  (A read taken between a commit and its bump is
the read of a request a moment earlier.)  Random bytes, not a counter: two processes bumping at
once can never leave the value a reader already saw.

Bounded: at most :data:`MAX_READS` reads (all forgotten when full), and only records whose body
is up to :data:`MAX_BODY_CHARS` characters are kept (a miss always is).  A read-only store whose
folder has no generation file (written by an older version) keeps nothing.
"""

from __future__ import annotations

import mmap
import os
from typing import Any

#: the generation file, beside SQLite's (diskcache's consistency check skips names containing ``cache.db``)
FILE = "cache.db-generation"
MAX_READS = 8192
MAX_BODY_CHARS = 16384
_SIZE = 8
#: what :meth:`RecentReads.get` returns for a read it does not hold (``None`` is a kept miss)
UNKNOWN: Any = object()


class Generation:
    """The store's generation: 8 bytes of a shared, memory-mapped file."""

    __slots__ = ("_map", "_fd")

    def __init__(self, folder: str, *, writable: bool) -> None:
        """Map the generation file of ``folder`` (created when ``writable``); OSError when it cannot be."""
        path = os.path.join(folder, FILE)
        fd = os.open(path, (os.O_RDWR | os.O_CREAT) if writable else os.O_RDONLY, 0o644)
        try:
            if os.fstat(fd).st_size < _SIZE:
                if not writable:
                    raise OSError(f"{path} is not a generation file")
                os.pwrite(fd, os.urandom(_SIZE), 0)
            self._map = mmap.mmap(fd, _SIZE, access=mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    def read(self) -> bytes:
        return self._map[:_SIZE]

    def bump(self) -> None:
        """A new generation (after a write committed): every process's kept reads are out of date."""
        self._map[:_SIZE] = os.urandom(_SIZE)

    def close(self) -> None:
        try:
            self._map.close()
        finally:
            os.close(self._fd)


class RecentReads:
    """Recent reads of one store by key, each valid while the generation it was read at holds (any thread)."""

    __slots__ = ("generation", "_reads", "max_reads", "max_body")

    def __init__(self, generation: Generation, max_reads: int = MAX_READS, max_body: int = MAX_BODY_CHARS) -> None:
        self.generation = generation
        self._reads: dict[tuple[str, str, str], tuple[bytes, Any]] = {}
        self.max_reads = max_reads
        self.max_body = max_body

    def get(self, where: tuple[str, str, str], now: bytes) -> Any:
        """The value kept for ``where`` at generation ``now``, else :data:`UNKNOWN`."""
        kept = self._reads.get(where)
        return kept[1] if kept is not None and kept[0] == now else UNKNOWN

    def put(self, where: tuple[str, str, str], at: bytes, value: Any, size: int = 0) -> None:
        """Keep ``value`` (of ``size`` characters), read at generation ``at`` (read *before* the value was)."""
        if size > self.max_body or self.max_reads <= 0:
            return
        reads = self._reads
        if len(reads) >= self.max_reads:
            reads.clear()
        reads[where] = (at, value)

    def __len__(self) -> int:
        return len(self._reads)
