"""The diskcache store's occurrence counters: a small SQLite file of their own, ``cache.db-occurrences``.

A recorded model call claims its occurrence number on every request, hit or miss
(:func:`.rules.claim_occurrence`).  Kept in ``cache.db`` each claim would be a diskcache transaction
(its write lock, four statements) and would move SQLite's ``data_version``, so every process's kept
reads of tool answers (:mod:`.recent_reads`) would be dropped at each model call.  Here each claim is
one short ``BEGIN IMMEDIATE`` transaction on ``cache.db-occurrences`` (WAL, shared by every process of the
host): read the counter, ask the rules, write it back.  Rows of runs idle for
:data:`.rules.OCCURRENCE_TTL_S` are removed when the file is opened.  Written by hand because it is
the store's own table, not diskcache's; ``sqlite3`` is the library.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable

from stabletoolbench_mirror.stores import rules

#: beside SQLite's own (diskcache's consistency check skips names containing ``cache.db``)
FILE_NAME = "cache.db-occurrences"
_SCHEMA = ("CREATE TABLE IF NOT EXISTS occurrences (run TEXT NOT NULL, digest TEXT NOT NULL, state TEXT NOT NULL, "
           "touched REAL NOT NULL, PRIMARY KEY (run, digest)) WITHOUT ROWID")

Decide = Callable[[rules.Occurrences], tuple[int, rules.Occurrences]]


class OccurrenceFile:
    """Occurrence counters in ``<folder>/cache.db-occurrences``; one connection per thread."""

    def __init__(self, folder: str, timeout_s: float = 60.0) -> None:
        self.path = os.path.join(folder, FILE_NAME)
        self.timeout_s = timeout_s
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        """Every thread's connection, closed together by :meth:`close` (from any thread)."""
        self._lock = threading.Lock()
        con = self._connection()
        with con:
            con.execute("DELETE FROM occurrences WHERE touched < ?", (time.time() - rules.OCCURRENCE_TTL_S,))

    def _connection(self) -> sqlite3.Connection:
        con: sqlite3.Connection | None = getattr(self._local, "con", None)
        if con is None:
            con = sqlite3.connect(self.path, timeout=self.timeout_s, isolation_level=None, check_same_thread=False)
            self._set_up(con)
            self._local.con = con
            with self._lock:
                self._all.append(con)
        return con

    def _set_up(self, con: sqlite3.Connection) -> None:
        """WAL, the table.  SQLite answers "database is locked" at once, without its busy wait, to a journal
        mode switch while another process opens the file the same moment: tried again until ``timeout_s``."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                con.execute("PRAGMA journal_mode=WAL")
                con.execute("PRAGMA synchronous=NORMAL")
                con.execute(_SCHEMA)
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc) or time.monotonic() > deadline:
                    con.close()
                    raise
                time.sleep(0.01)

    def apply(self, run: str, digest: str, decide: Decide) -> int:
        """Read ``(run, digest)``'s counter, ask ``decide``, write the counter it returns; its number.  Raises ``sqlite3.Error``."""
        con = self._connection()
        con.execute("BEGIN IMMEDIATE")
        try:
            row = con.execute("SELECT state FROM occurrences WHERE run = ? AND digest = ?", (run, digest)).fetchone()
            number, after = decide(rules.Occurrences.from_json(row[0] if row else None))
            con.execute("INSERT OR REPLACE INTO occurrences (run, digest, state, touched) VALUES (?, ?, ?, ?)",
                        (run, digest, after.to_json(), time.time()))
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
        return number

    def close(self) -> None:
        with self._lock:
            connections, self._all = self._all, []
        for con in connections:
            con.close()
        self._local = threading.local()
