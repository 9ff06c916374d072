"""The store's recent reads, kept in memory while SQLite says nobody has written to the store since.

A hit on a frozen tree first looks its call up in the store (the store comes first) and misses
there: one SQLite read per request, most of what is left of a hit's own cost.  The answers of
recent reads (``None`` for a miss included) are kept here by their key, each with the store's
**change token** at the time of the read, and served again only while the token is unchanged.

The token comes from :class:`ChangeWatch`: SQLite's ``PRAGMA data_version`` on a connection of its
own that never writes.  SQLite changes that number whenever *any other* connection commits to the
database, in any process, whatever wrote it: this package at any version, a writer killed after
its commit, a ``sqlite3`` shell.  No writer has to cooperate, and no file beside the store is
trusted (deleting or truncating one stales nothing).  The number is asked for at most every
:data:`CHECK_INTERVAL_S` (a few µs each time), so another process's write is seen within that
interval; this process's own writes move the token at once (:meth:`ChangeWatch.changed`: every
store object of one folder in a process shares one watch, :meth:`ChangeWatch.of`), and
:meth:`ChangeWatch.check` looks at once (the single-flight lock does, so a miss that waited for
another process's answer reads it).

Bounded: at most :data:`MAX_READS` reads (all forgotten when full), and only records whose body
is up to :data:`MAX_BODY_CHARS` characters are kept (a miss always is).  When SQLite cannot be
asked, the token moves at every request and nothing kept is served.

Why a plain dict cleared when full, not a cachetools map like the other bounded maps: every hit of a frozen tree reads
it first.  On the development machine (timeit, a map of 8,192 reads) ``dict.get`` takes 60 ns, cachetools'
``FIFOCache.get`` 173 ns and ``LRUCache.get`` 281 ns.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
import urllib.parse
import weakref
from typing import Any

log = logging.getLogger(__name__)

MAX_READS = 8192
MAX_BODY_CHARS = 16384
#: how stale a kept read may be after *another process* wrote (this process's own writes: not at all)
CHECK_INTERVAL_S = 0.01
#: what :meth:`RecentReads.get` returns for a read it does not hold (``None`` is a kept miss)
UNKNOWN: Any = object()


class ChangeWatch:
    """A token that moves whenever the SQLite database at ``path`` may have changed (any thread).

    The watch's connection is read-only and used for nothing but ``PRAGMA data_version``; it is
    opened again in a forked child (a SQLite connection must not cross a fork), and closed when
    the last store object using it lets it go (:meth:`release`), before the store's own
    connections close: the last connection to close is then a writer's, which checkpoints and
    removes SQLite's log as it did before the watch existed.
    """

    __slots__ = ("path", "interval_s", "_lock", "_con", "_pid", "_version", "_token", "_next", "_users", "_key", "_released", "__weakref__")
    _shared: weakref.WeakValueDictionary[str, ChangeWatch] = weakref.WeakValueDictionary()
    _shared_lock = threading.Lock()

    def __init__(self, path: str) -> None:
        """Watch the database file ``path``; :class:`sqlite3.Error` when it cannot be opened."""
        self.path = path
        self.interval_s = CHECK_INTERVAL_S
        self._lock = threading.Lock()
        self._con: sqlite3.Connection | None = None
        self._pid = 0
        self._version: int | None = None
        self._token = 0
        self._next = 0.0
        self._users = 0
        self._key = ""
        self._released = False
        self._connect()
        self.check()

    @classmethod
    def of(cls, path: str) -> ChangeWatch:
        """The watch of the database ``path`` that every store object of this process shares."""
        where = os.path.realpath(path)
        try:
            found = os.stat(where)
        except OSError as exc:
            raise sqlite3.OperationalError(f"cannot watch {where}: {exc}") from None
        key = f"{where}\x00{found.st_dev}\x00{found.st_ino}"  # a file made anew under the same name is another
        with cls._shared_lock:
            watch = cls._shared.get(key)
            if watch is None:
                watch = cls._shared[key] = cls(where)
                watch._key = key
            watch._users += 1
            return watch

    def release(self) -> None:
        """One user less (a store object closed); the last one closes the connection (nothing is vouched for after)."""
        with self._shared_lock:
            self._users -= 1
            if self._users > 0:
                return
            if self._key and self._shared.get(self._key) is self:
                del self._shared[self._key]
        with self._lock:
            con, self._con = self._con, None
            self._token += 1
            self._released = True
            self._next = 0.0  # token() asks every time, and check() says "changed" every time
        if con is not None and self._pid == os.getpid():
            con.close()

    def _connect(self) -> sqlite3.Connection:
        uri = f"file:{urllib.parse.quote(os.path.abspath(self.path))}?mode=ro"
        con = sqlite3.connect(uri, uri=True, check_same_thread=False, isolation_level=None, timeout=1.0)
        self._con, self._pid, self._version = con, os.getpid(), None
        return con

    def token(self) -> int:
        """The token now: SQLite is asked when the last answer is older than ``interval_s``."""
        if time.monotonic() >= self._next:
            return self.check()
        return self._token

    def check(self) -> int:
        """Ask SQLite now; the token after it."""
        with self._lock:
            if self._released:  # vouches for nothing any more
                self._token += 1
                return self._token
            try:
                con = self._con if self._con is not None and self._pid == os.getpid() else self._connect()
                version = con.execute("PRAGMA data_version").fetchone()[0]
            except sqlite3.Error as exc:
                # cannot tell: nothing kept is served until SQLite answers again
                log.debug("store change check of %s failed: %s", self.path, exc)
                self._token += 1
                self._version = None
                self._next = 0.0
                return self._token
            if version != self._version:
                self._version = version
                self._token += 1
            self._next = time.monotonic() + self.interval_s
            return self._token

    def changed(self) -> None:
        """This process wrote (or tried to): every token taken before is out of date."""
        with self._lock:
            self._token += 1


class RecentReads:
    """Recent reads of one store by key, each valid while the token it was read at holds (any thread)."""

    __slots__ = ("watch", "_reads", "max_reads", "max_body")

    def __init__(self, watch: ChangeWatch) -> None:
        self.watch = watch
        self._reads: dict[tuple[str, str, str], tuple[int, Any]] = {}
        self.max_reads = MAX_READS
        self.max_body = MAX_BODY_CHARS

    def get(self, where: tuple[str, str, str], now: int) -> Any:
        """The value kept for ``where`` at token ``now``, else :data:`UNKNOWN`."""
        kept = self._reads.get(where)
        return kept[1] if kept is not None and kept[0] == now else UNKNOWN

    def put(self, where: tuple[str, str, str], at: int, value: Any, size: int = 0) -> None:
        """Keep ``value`` (of ``size`` characters), read at token ``at`` (taken *before* the value was read)."""
        if size > self.max_body or self.max_reads <= 0:
            return
        reads = self._reads
        if len(reads) >= self.max_reads:
            reads.clear()
        reads[where] = (at, value)
