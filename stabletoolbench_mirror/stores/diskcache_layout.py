"""diskcache's private table layout, used in this one module.

:class:`diskcache.Cache` has no prefix query, no multi-row insert and no read-only open, so the
diskcache store reads and writes its SQLite table ``Cache`` directly for those: key-range scans
(:func:`scan`, :func:`first_key`, :func:`count_range`), a lookup of many
keys (:func:`present`), the bulk insert (:func:`insert`, rows made by :func:`row`) and
:class:`ReadOnlyCache`.  Values always go through diskcache's own :class:`diskcache.Disk`
encoder and decoder.  :func:`check` compares the table with :data:`COLUMNS` when a store opens,
so a diskcache release that changes the layout fails loudly, naming its version, instead of
writing rows it would misread.

Why not diskcache's public API (diskcache 5.6.3, measured on the 2-core development machine, a
store of 50,000 records in 500 APIs, best of 5): its only ordered read, ``Cache.iterkeys``, starts
at the first key and has no start key, so reading one API's 100 records (``iter_api``, ``delete``'s
pointers, ``sample``) takes 857 ms through ``iterkeys`` and ``get`` against 0.18 ms for :func:`scan`
(4,700x, and growing with the store); 5,000 ``Cache.add`` in one ``transact()`` take 392 ms against
126 ms for :func:`insert` (3.1x: ``cache import``); asking ``in`` for 5,000 keys takes 157 ms against
36 ms for :func:`present` (4.3x).  Opening a :class:`diskcache.Cache` writes (see :class:`ReadOnlyCache`).
Tags (``Cache.set(tag=)``) are indexed for eviction only: nothing reads by tag but ``evict``.
"""

from __future__ import annotations

import os
import sqlite3
import time
import urllib.parse
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import diskcache

from stabletoolbench_mirror.stores.base import StoreError

#: ``Cache``'s columns (name, type) as diskcache 5.6 creates them
COLUMNS = (
    ("rowid", "INTEGER"), ("key", "BLOB"), ("raw", "INTEGER"), ("store_time", "REAL"), ("expire_time", "REAL"),
    ("access_time", "REAL"), ("access_count", "INTEGER"), ("tag", "BLOB"), ("size", "INTEGER"), ("mode", "INTEGER"),
    ("filename", "TEXT"), ("value", "BLOB"),
)
_INSERT = (
    "INSERT INTO Cache(key, raw, store_time, expire_time, access_time, access_count, tag, size, mode, filename, value)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
Row = tuple[object, ...]


def _sql(cache: Any, query: str, params: Iterable[object] = ()) -> sqlite3.Cursor:
    return cache._sql(query, tuple(params))  # noqa: SLF001 - the one place diskcache's connection is used


def check(cache: Any) -> None:
    """:class:`StoreError` naming diskcache's version when ``Cache`` is not laid out as :data:`COLUMNS`."""
    found = tuple((name, kind) for _cid, name, kind, *_rest in _sql(cache, "PRAGMA table_info(Cache)").fetchall())
    if found != COLUMNS:
        raise StoreError(
            f"diskcache {diskcache.__version__} lays its table out as {found}, not as the {COLUMNS} this store "
            "reads and writes directly; install diskcache 5.6 (pip install 'diskcache>=5.6,<5.7') or update "
            "stabletoolbench_mirror/stores/diskcache_layout.py"
        )


def first_key(cache: Any, low: str, high: str) -> str | None:
    """The first string key from ``low`` (included) to ``high``."""
    found = _sql(cache, "SELECT key FROM Cache WHERE raw = 1 AND key >= ? AND key < ? ORDER BY key LIMIT 1", (low, high)).fetchone()
    return None if found is None else found[0]


def count_range(cache: Any, low: str, high: str) -> int:
    """How many string keys lie strictly between ``low`` and ``high``."""
    (n,) = _sql(cache, "SELECT COUNT(*) FROM Cache WHERE raw = 1 AND key > ? AND key < ?", (low, high)).fetchone()
    return int(n)


def scan(cache: Any, low: str, high: str, *, inclusive: bool, page: int) -> Iterator[tuple[str, object]]:
    """``(key, value)`` of the string keys from ``low`` to ``high`` in key order, ``page`` rows at a time."""
    disk = cache._disk  # noqa: SLF001 - values are read with diskcache's own decoder
    while True:
        rows = _sql(
            cache,
            f"SELECT key, mode, filename, value FROM Cache WHERE raw = 1 AND key {'>=' if inclusive else '>'} ? AND key < ?"
            " ORDER BY key LIMIT ?",
            (low, high, page),
        ).fetchall()
        for key, mode, filename, value in rows:
            try:
                yield key, disk.fetch(mode, filename, value, False)
            except OSError:  # its file was removed meanwhile
                continue
        if len(rows) < page:
            return
        low, inclusive = rows[-1][0], False


def _rows_of(cache: Any, columns: str, keys: list[str]) -> Iterator[Any]:
    """``columns`` of the rows of these string keys, 500 keys a query (inside the caller's transaction, if any)."""
    for i in range(0, len(keys), 500):
        chunk = keys[i : i + 500]
        yield from _sql(cache, f"SELECT {columns} FROM Cache WHERE raw = 1 AND key IN ({','.join('?' * len(chunk))})", chunk).fetchall()


def present(cache: Any, keys: list[str]) -> set[str]:
    """Which of ``keys`` the table holds (inside the caller's transaction, if any)."""
    return {key for (key,) in _rows_of(cache, "key", keys)}


def row(cache: Any, key: str, value: object, now: float | None = None) -> Row:
    """The row diskcache's own ``add`` writes for ``key`` (no expiry, no tag), its value through diskcache's encoder."""
    now = time.time() if now is None else now
    size, mode, filename, db_value = cache._disk.store(value, False, key=key)  # noqa: SLF001
    return (key, 1, now, None, now, 0, None, size, mode, filename, db_value)


def insert(cache: Any, rows: list[Row]) -> None:
    """Insert rows made by :func:`row` (inside the caller's transaction: ``cache.transact()``)."""
    cache._con.executemany(_INSERT, rows)  # noqa: SLF001 - the connection of the open transaction


_UPDATE_COUNT = "UPDATE Cache SET store_time = ?, value = ? WHERE rowid = ?"


def increment(cache: Any, deltas: Mapping[str, int]) -> None:
    """``cache.incr(key, delta)`` for each item, inside the caller's transaction, in fewer statements.

    One read of every counter, then one update statement for those that hold a plain count (the
    columns ``incr`` writes: ``store_time`` and ``value``); a counter not there yet, expiring or not
    an integer goes through ``incr`` itself (its row, its errors).  A delta of 0 is applied too, as
    ``incr`` applies it (a missing counter is written as 0).
    """
    # the expiry is checked here, not in the query: with ``expire_time IS NULL`` in it, SQLite 3.40
    # picks the ``expire_time`` index from five keys on and reads every row of the table
    rows = _rows_of(cache, "key, rowid, value, expire_time", list(deltas))
    found: dict[str, tuple[int, object]] = {key: (rowid, value) for key, rowid, value, expires in rows if expires is None}
    now = time.time()
    updates: list[tuple[float, int, int]] = []
    for key, delta in deltas.items():
        row = found.get(key)
        if row is None or type(row[1]) is not int:
            cache.incr(key, delta)
        else:
            updates.append((now, row[1] + delta, row[0]))
    if updates:
        cache._con.executemany(_UPDATE_COUNT, updates)  # noqa: SLF001 - the connection of the open transaction


class ReadOnlyCache:
    """The few :class:`diskcache.Cache` reads the store makes, over a read-only SQLite connection.

    Opening a :class:`diskcache.Cache` writes (its settings, its tables, a transaction per open):
    ``cache stats`` on a store a server holds open grew the write-ahead log ~100 KB per run.  This
    opens ``cache.db`` with ``mode=ro``: SQLite then refuses every write, and reads see what the
    writers committed (the WAL protocol, shared with them), never a torn page.
    """

    def __init__(self, path: str) -> None:
        db = os.path.join(path, "cache.db")
        if not os.path.isfile(db):
            raise StoreError(f"no diskcache store at {path} (no cache.db there): check store.path")
        uri = "file:" + urllib.parse.quote(os.path.abspath(db)) + "?mode=ro"
        self._con = sqlite3.connect(uri, uri=True, timeout=60, check_same_thread=False, isolation_level=None)
        self._disk = diskcache.Disk(path)

    def _sql(self, query: str, params: tuple[object, ...] = ()) -> sqlite3.Cursor:
        return self._con.execute(query, params)

    def get(self, key: str) -> object:
        rows = self._sql("SELECT mode, filename, value FROM Cache WHERE key = ? AND raw = 1", (key,)).fetchall()
        if not rows:
            return None
        try:
            return self._disk.fetch(*rows[0], False)
        except OSError:  # its file was removed meanwhile
            return None

    def __contains__(self, key: str) -> bool:
        return self._sql("SELECT 1 FROM Cache WHERE key = ? AND raw = 1", (key,)).fetchone() is not None

    def close(self) -> None:
        self._con.close()
