"""The embedded default store: a diskcache (SQLite + files) folder, safe across threads and processes."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import sqlite3
import threading
import time
import uuid
from typing import Iterator

import diskcache

from ..records import Record
from .base import Store, StoreError
from .leases import MAX_LOCK_WAIT_S, LeaseKeeper

log = logging.getLogger(__name__)

_ENTRY = "e"
_CANONICAL = "c"
_LOCK = "l"


def _entry_key(namespace: str, key: str) -> str:
    return f"{_ENTRY}\x00{namespace}\x00{key}"


def _canonical_key(namespace: str, canonical: str) -> str:
    return f"{_CANONICAL}\x00{namespace}\x00{canonical}"


def _lock_key(namespace: str, canonical: str) -> str:
    digest = hashlib.sha256(f"{namespace}\x00{canonical}".encode("utf-8", "surrogatepass")).hexdigest()
    return f"{_LOCK}\x00{digest}"


class DiskcacheStore(Store):
    """Records as JSON text in a :class:`diskcache.Cache` (no pickles: the data stays inspectable).

    Several processes (``serve --workers N``, ``warm``) may use one folder at once: SQLite
    serialises the writes, each write is one transaction (never torn), and ``add`` is
    add-if-absent, so the first answer for a key wins in every process.  :meth:`flight_lock`
    is a lock entry with an expiry in the same database, so workers on one host also share
    single flight.
    """

    kind = "diskcache"
    is_local = True

    def __init__(self, path: str | os.PathLike[str], *, lock_ttl_s: float = 15.0, lock_poll_s: float = 0.02) -> None:
        self.path = os.fspath(path)
        self.lock_ttl_s = float(lock_ttl_s)
        self.lock_poll_s = float(lock_poll_s)
        self._leases = LeaseKeeper(self.lock_ttl_s)
        try:
            os.makedirs(self.path, exist_ok=True)
            # no eviction: a response cache that forgets is not reproducible
            self._cache = diskcache.Cache(self.path, eviction_policy="none", size_limit=2**62, timeout=60)
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
        try:
            # the entry goes first: a canonical pointer never points at nothing
            added = self._cache.add(_entry_key(record.namespace, record.key), record.to_json())
            if canonical is not None:
                self._cache.add(_canonical_key(record.namespace, canonical), record.key)
            return bool(added)
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"diskcache write failed: {exc}") from exc

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
        """An expiring lock entry (``add`` with ``expire``), polled every ``lock_poll_s``.

        The entry is a lease of ``lock_ttl_s``, renewed while held (see :mod:`.leases`): a
        process killed while holding it blocks the others for at most ``lock_ttl_s``.  A waiter
        goes ahead without it after :data:`~.leases.MAX_LOCK_WAIT_S`.
        """
        name = _lock_key(namespace, canonical)
        token = f"{os.getpid()}:{threading.get_ident()}:{uuid.uuid4().hex}"
        deadline = time.monotonic() + MAX_LOCK_WAIT_S
        acquired = False
        try:
            while not (acquired := self._cache.add(name, token, expire=self.lock_ttl_s)):
                if time.monotonic() >= deadline:
                    log.warning("single-flight lock for %s not acquired in %.0fs; filling without it", namespace, MAX_LOCK_WAIT_S)
                    break
                time.sleep(self.lock_poll_s)
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"diskcache lock failed: {exc}") from exc
        if not acquired:
            yield
            return

        def renew() -> bool:
            with self._cache.transact():
                return self._cache.get(name) == token and bool(self._cache.touch(name, expire=self.lock_ttl_s))

        def release() -> bool:
            try:
                with self._cache.transact():
                    if self._cache.get(name) == token:
                        self._cache.delete(name)
            except (OSError, sqlite3.Error):
                return False
            return True

        lease = self._leases.hold(renew)
        try:
            yield
        finally:
            self._leases.drop(lease)
            if not release():
                log.warning("single-flight lock for %s not released now (store error); retrying in the background", namespace)
                self._leases.release_later(release)

    def __iter__(self) -> Iterator[Record]:
        for k in self._cache.iterkeys():
            if isinstance(k, str) and k.startswith(_ENTRY + "\x00"):
                raw = self._cache.get(k)
                if raw is not None:
                    yield Record.from_json(raw)

    def __len__(self) -> int:
        return sum(1 for k in self._cache.iterkeys() if isinstance(k, str) and k.startswith(_ENTRY + "\x00"))

    def close(self) -> None:
        self._leases.close()
        self._cache.close()
