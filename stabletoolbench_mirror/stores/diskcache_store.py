"""The embedded default store: a diskcache (SQLite + files) folder, safe across threads and processes."""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
import time
from typing import Iterator

import diskcache

from ..records import Record
from .base import Store, StoreError
from .filelock import ByteRangeLocks
from .leases import MAX_LOCK_WAIT_S

log = logging.getLogger(__name__)

_ENTRY = "e"
_CANONICAL = "c"


def _entry_key(namespace: str, key: str) -> str:
    return f"{_ENTRY}\x00{namespace}\x00{key}"


def _canonical_key(namespace: str, canonical: str) -> str:
    return f"{_CANONICAL}\x00{namespace}\x00{canonical}"


def _is_failure(raw: str) -> bool:
    return Record.from_json(raw).is_failure


class DiskcacheStore(Store):
    """Records as JSON text in a :class:`diskcache.Cache` (no pickles: the data stays inspectable).

    Several processes (``serve --workers N``, ``warm``) may use one folder at once: SQLite
    serialises the writes, each write is one transaction (never torn), and ``add`` is
    add-if-absent, so the first answer for a key wins in every process.  :meth:`flight_lock`
    is a kernel byte-range lock on a file in the folder, so the processes of one host also
    share single flight (one simulation per call).
    """

    kind = "diskcache"
    is_local = True

    #: the lock file beside SQLite's (diskcache's consistency check skips names containing ``cache.db``)
    LOCK_FILE = "cache.db-flightlock"

    def __init__(self, path: str | os.PathLike[str], *, lock_poll_s: float = 0.02) -> None:
        self.path = os.fspath(path)
        self.lock_poll_s = float(lock_poll_s)
        self._write_lock = threading.Lock()
        try:
            os.makedirs(self.path, exist_ok=True)
            # no eviction: a response cache that forgets is not reproducible
            self._cache = diskcache.Cache(self.path, eviction_policy="none", size_limit=2**62, timeout=60)
            self._locks = ByteRangeLocks(os.path.join(self.path, self.LOCK_FILE))
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"cannot open diskcache store at {self.path}: {exc}") from exc

    def get(self, namespace: str, key: str) -> Record | None:
        try:
            raw = self._cache.get(_entry_key(namespace, key))
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"diskcache read failed: {exc}") from exc
        return None if raw is None else Record.from_json(raw)

    def get_canonical(self, namespace: str, canonical: str) -> Record | None:
        try:
            key = self._cache.get(_canonical_key(namespace, canonical))
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"diskcache read failed: {exc}") from exc
        return None if key is None else self.get(namespace, key)

    def add(self, record: Record, canonical: str | None) -> bool:
        # one writer at a time per process: threads queue on a lock instead of on SQLite's busy loop
        with self._write_lock:
            return self._add(record, canonical)

    def _add(self, record: Record, canonical: str | None) -> bool:
        entry = _entry_key(record.namespace, record.key)
        try:
            # one SQLite transaction: the decision and the writes are atomic across processes
            with self._cache.transact():
                current = self._cache.get(entry)
                written = current is None or (not record.is_failure and _is_failure(current))
                if written:
                    # the entry goes first: a canonical pointer never points at nothing
                    self._cache.set(entry, record.to_json())
                if canonical is not None:
                    pointer = _canonical_key(record.namespace, canonical)
                    target = self._cache.get(pointer)
                    if target is None or (target != record.key and not record.is_failure and self._points_at_failure(record.namespace, target)):
                        self._cache.set(pointer, record.key)
            return written
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"diskcache write failed: {exc}") from exc

    def _points_at_failure(self, namespace: str, key: str) -> bool:
        raw = self._cache.get(_entry_key(namespace, key))
        return raw is None or _is_failure(raw)

    def sample(self, namespace: str, limit: int) -> Iterator[Record]:
        prefix = _entry_key(namespace, "")
        try:
            # a key-range scan over diskcache's SQLite table (string keys are stored raw)
            rows = self._cache._sql(  # noqa: SLF001 - diskcache exposes no prefix query
                "SELECT key FROM Cache WHERE raw = 1 AND key >= ? AND key < ? LIMIT ?",
                (prefix, prefix + "\U0010ffff", int(limit)),
            ).fetchall()
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"diskcache read failed: {exc}") from exc
        for (key,) in rows:
            raw = self._cache.get(key)
            if raw is not None:
                yield Record.from_json(raw)

    @contextlib.contextmanager
    def flight_lock(self, namespace: str, canonical: str) -> Iterator[None]:
        """A byte-range lock on ``cache.db-flightlock`` in the store folder (see :mod:`.filelock`).

        Shared by every process that opens this folder on this host; the kernel drops it when
        its holder exits, even on ``kill -9``.  A waiter polls every ``lock_poll_s`` and goes
        ahead without it after :data:`~.leases.MAX_LOCK_WAIT_S`.
        """
        name = f"{namespace}\x00{canonical}"
        deadline = time.monotonic() + MAX_LOCK_WAIT_S
        try:
            while (offset := self._locks.try_acquire(name)) is None:
                if time.monotonic() >= deadline:
                    log.warning("single-flight lock for %s not acquired in %.0fs; filling without it", namespace, MAX_LOCK_WAIT_S)
                    break
                time.sleep(self.lock_poll_s)
        except OSError as exc:
            raise StoreError(f"diskcache lock failed: {exc}") from exc
        try:
            yield
        finally:
            if offset is not None:
                try:
                    self._locks.release(offset)
                except OSError as exc:  # pragma: no cover - unlocking an open file does not fail
                    log.warning("single-flight lock for %s not released: %s", namespace, exc)

    def __iter__(self) -> Iterator[Record]:
        for k in self._cache.iterkeys():
            if isinstance(k, str) and k.startswith(_ENTRY + "\x00"):
                raw = self._cache.get(k)
                if raw is not None:
                    yield Record.from_json(raw)

    def __len__(self) -> int:
        return sum(1 for k in self._cache.iterkeys() if isinstance(k, str) and k.startswith(_ENTRY + "\x00"))

    def close(self) -> None:
        self._locks.close()
        self._cache.close()
