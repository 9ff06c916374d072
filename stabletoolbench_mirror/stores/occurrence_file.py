"""The diskcache store's occurrence counters: a small SQLite file of their own, ``cache.db-occurrences``.

A recorded model call claims its occurrence number on every request, hit or miss
(:func:`.rules.claim_occurrence`).  Kept in ``cache.db`` each claim would be a diskcache transaction
(its write lock, four statements) and would move SQLite's ``data_version``, so every process's kept
reads of tool answers (:mod:`.recent_reads`) would be dropped at each model call.  Here each claim is
one short ``BEGIN IMMEDIATE`` transaction on ``cache.db-occurrences`` (WAL, shared by every process of the
host): read the counter, ask the rules, write it back (a counter back at its start, every number given
back, is removed: a replay miss leaves nothing).  Rows of runs idle for :data:`.rules.OCCURRENCE_TTL_S`
are removed when the file is opened.

:meth:`OccurrenceFile.apply` waits for the write lock up to ``timeout_s`` (``store.timeout_s``: a worker
thread's call); :meth:`OccurrenceFile.apply_now` never waits (for the server's event loop: ``None`` when
another connection holds the lock, e.g. a backup or a ``sqlite3`` shell, and the caller goes to a thread).
A server's private run spills the counters it no longer keeps in memory to a file of its own with
:meth:`OccurrenceFile.put_many`.  Written by hand because it is the store's own table, not diskcache's;
``sqlite3`` is the library.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Iterable

from stabletoolbench_mirror.stores import rules

#: beside SQLite's own (diskcache's consistency check skips names containing ``cache.db``)
FILE_NAME = "cache.db-occurrences"
_SCHEMA = ("CREATE TABLE IF NOT EXISTS occurrences (run TEXT NOT NULL, digest TEXT NOT NULL, state TEXT NOT NULL, "
           "touched REAL NOT NULL, PRIMARY KEY (run, digest)) WITHOUT ROWID")



class OccurrenceFile:
    """Occurrence counters in ``<folder>/cache.db-occurrences``; one connection per thread."""

    def __init__(self, folder: str, timeout_s: float = 60.0, *, durable: bool = True) -> None:
        """``durable=False``: a file nobody needs after a crash (a private run's spill): written without syncing."""
        self.path = os.path.join(folder, FILE_NAME)
        self.durable = durable
        self.timeout_s = timeout_s
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        """Every thread's connection, closed together by :meth:`close` (from any thread)."""
        self._lock = threading.Lock()
        con = self._connection()
        with con:
            con.execute("DELETE FROM occurrences WHERE touched < ?", (time.time() - rules.OCCURRENCE_TTL_S,))

    def _connection(self, wait: bool = True) -> sqlite3.Connection:
        """This thread's connection: one that waits ``timeout_s`` for the write lock, or (``wait=False``) one that never waits."""
        name = "con" if wait else "quick"
        con: sqlite3.Connection | None = getattr(self._local, name, None)
        if con is None:
            con = sqlite3.connect(self.path, timeout=self.timeout_s if wait else 0.0, isolation_level=None, check_same_thread=False)
            self._set_up(con)
            setattr(self._local, name, con)
            with self._lock:
                self._all.append(con)
        return con

    def _set_up(self, con: sqlite3.Connection) -> None:
        """WAL, the table.  SQLite answers "database is locked" at once, without its busy wait, to a journal
        mode switch while another process opens the file the same moment: tried again until ``timeout_s``."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                # a file nobody needs after a crash (a private run's spill, one process) keeps no journal at all
                con.execute("PRAGMA journal_mode=WAL" if self.durable else "PRAGMA journal_mode=OFF")
                con.execute("PRAGMA synchronous=NORMAL" if self.durable else "PRAGMA synchronous=OFF")
                con.execute(_SCHEMA)
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc) or time.monotonic() > deadline:
                    con.close()
                    raise
                time.sleep(0.01)

    def apply(self, run: str, digest: str, decide: rules.Decide) -> int:
        """Read ``(run, digest)``'s counter, ask ``decide``, write the counter it returns; its number.  Raises ``sqlite3.Error``
        (``database is locked`` when another connection held the write lock for ``timeout_s``)."""
        con = self._connection()
        con.execute("BEGIN IMMEDIATE")
        return self._decide(con, run, digest, decide)

    def apply_now(self, run: str, digest: str, decide: rules.Decide) -> int | None:
        """:meth:`apply` if the write lock is free now; ``None`` (nothing done) when another connection holds it."""
        con = self._connection(wait=False)
        try:
            con.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc) or "busy" in str(exc):
                return None
            raise
        return self._decide(con, run, digest, decide)

    @staticmethod
    def _decide(con: sqlite3.Connection, run: str, digest: str, decide: rules.Decide) -> int:
        try:
            row = con.execute("SELECT state FROM occurrences WHERE run = ? AND digest = ?", (run, digest)).fetchone()
            number, after = decide(rules.Occurrences.from_json(row[0] if row else None))
            if after.at_start:
                con.execute("DELETE FROM occurrences WHERE run = ? AND digest = ?", (run, digest))
            else:
                con.execute("INSERT OR REPLACE INTO occurrences (run, digest, state, touched) VALUES (?, ?, ?, ?)",
                            (run, digest, after.to_json(), time.time()))
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
        return number

    def put_many(self, run: str, counters: Iterable[tuple[str, rules.Occurrences]]) -> None:
        """Write these counters of ``run`` over what is there, in one transaction (a private run's spill)."""
        con = self._connection()
        now = time.time()
        con.execute("BEGIN IMMEDIATE")
        try:
            con.executemany("INSERT OR REPLACE INTO occurrences (run, digest, state, touched) VALUES (?, ?, ?, ?)",
                            ((run, digest, held.to_json(), now) for digest, held in counters))
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise

    def close(self) -> None:
        with self._lock:
            connections, self._all = self._all, []
        for con in connections:
            con.close()
        self._local = threading.local()
