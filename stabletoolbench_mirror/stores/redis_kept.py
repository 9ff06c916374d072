"""The Redis store's kept reads (the records it read, in process): bounded, invalidated, aged.

A hit on a Redis store costs no round trip while the record is remembered here; what keeps the
kept reads right is :mod:`.redis_invalidation` (messages) and the age bound below (what no message
covers).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from cachetools import LRUCache

from stabletoolbench_mirror.core.records import Record

#: how long a remembered record or pointer is served without asking Redis again (see :class:`KeptReads`)
KEPT_MAX_AGE_S = 1.0

RECORD, POINTER = "record", "pointer"


class KeptReads:
    """A bounded in-process copy of records and canonical pointers already read (least recently used ones
    go first, from one byte budget).

    Sound because usable answers never change once written (add-if-absent): a key, once
    found, names the same answer for good on every host.  Absent keys and failure records
    (which an answer may replace, and whose canonical pointers may move) are never remembered.
    Only what a hit serves is kept (not ``meta`` or ``replaced``).

    What changes an answer (``cache delete``, ``mode: refresh``) is heard on the invalidation
    channel (:mod:`.redis_invalidation`).  What that cannot cover (a message lost with the
    subscription, a Redis restarted from an older dump, a key deleted with ``redis-cli``) is
    bounded by age: an item read more than ``max_age_s`` ago is read from Redis again, and served
    as it is only while Redis cannot be read (:meth:`get` with ``stale=True``).
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max(0, int(max_bytes))
        self.max_age_s = KEPT_MAX_AGE_S
        # one bounded map for records and pointers: ("record" | "pointer", api, key) -> (value, size, monotonic time read)
        self._items: LRUCache[tuple[str, str, str], tuple[Any, int, float]] = LRUCache(max(1, self.max_bytes),
                                                                                  getsizeof=lambda item: item[1])
        self._lock = threading.Lock()
        self.live = False
        """Whether the kept reads serve: only while their store hears invalidations (:meth:`go_live`)."""
        self.epoch = 0
        """Bumped by every invalidation: a read begun before one is not remembered (see :meth:`put`)."""

    def go_live(self) -> None:
        """Invalidations are heard from now on: empty the kept reads (some may have been missed) and serve."""
        self.clear()
        self.live = True

    def clear(self) -> None:
        with self._lock:
            self.epoch += 1
            self._items.clear()

    def forget(self, where: tuple[str, str]) -> None:
        """Forget one record (it was replaced); pointers stay right, as they name keys."""
        with self._lock:
            self.epoch += 1
            self._items.pop((RECORD, *where), None)

    def _get(self, kind: str, where: tuple[str, str], stale: bool) -> Any:
        if not self.live:
            return None
        with self._lock:
            item = self._items.get((kind, *where))
        if item is None or (not stale and time.monotonic() - item[2] >= self.max_age_s):
            return None
        return item[0]

    def get(self, where: tuple[str, str], *, stale: bool = False) -> Record | None:
        """The record remembered for ``where`` if read within ``max_age_s`` (any age with ``stale``)."""
        fields = self._get(RECORD, where, stale)
        if fields is None:
            return None
        key, body, source, origin, created_at = fields
        return Record(api=where[0], key=key, body=body, source=source, origin=origin, created_at=created_at)

    def pointer(self, where: tuple[str, str], *, stale: bool = False) -> str | None:
        key: str | None = self._get(POINTER, where, stale)
        return key

    def put(self, where: tuple[str, str], record: Record, epoch: int | None = None) -> None:
        """Remember ``record`` (read when the kept reads' :attr:`epoch` was ``epoch``, if given)."""
        # kept as a tuple of strings and a float, which Python's garbage collector stops tracking:
        # kept reads of many records then cost the collector (and so the latency tail) nothing
        if record.is_failure:
            return
        fields = (record.key, record.body, record.source, record.origin, record.created_at)
        self._insert(RECORD, where, fields, len(record.body) + len(record.key) + len(record.origin) + 200, epoch)

    def unpoint(self, where: tuple[str, str]) -> None:
        """Forget a canonical pointer (it names a failure record, so it may move)."""
        with self._lock:
            self._items.pop((POINTER, *where), None)

    def point(self, where: tuple[str, str], key: str, epoch: int | None = None) -> None:
        self._insert(POINTER, where, key, len(key) + len(where[1]) + 100, epoch)

    def _insert(self, kind: str, where: tuple[str, str], value: Any, size: int, epoch: int | None) -> None:
        if size > self.max_bytes // 4 or not self.live:
            return
        with self._lock:
            if epoch is None or epoch == self.epoch:
                # read again (it had aged): the new read's time counts
                self._items[(kind, *where)] = (value, size, time.monotonic())
