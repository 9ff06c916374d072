"""Kept reads of a diskcache store are served only while SQLite says nobody wrote since.

The writers here cooperate in no way: plain ``sqlite3`` connections of this process (another
connection is all SQLite needs to count a commit), a diskcache of its own, a transaction rolled
back.  The watch of each folder is shared by the store objects of a process, so a write through one
is seen by all at once.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import diskcache
import pytest

from stabletoolbench_mirror.core.records import Record
from stabletoolbench_mirror.stores import DiskcacheStore, recent_reads
from stabletoolbench_mirror.stores import diskcache_layout as layout
from stabletoolbench_mirror.stores.recent_reads import UNKNOWN, ChangeWatch, RecentReads

API = "Tools/t_for_Tools/a"


def _db(tmp_path: Path) -> Path:
    cache = diskcache.Cache(str(tmp_path / "c"))
    cache.set("x", 1)
    cache.close()
    return tmp_path / "c" / "cache.db"


def test_the_token_moves_when_another_connection_commits_and_only_then(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = _db(tmp_path)
    monkeypatch.setattr(recent_reads, "CHECK_INTERVAL_S", 0)
    watch = ChangeWatch(str(db))
    before = watch.token()
    assert watch.token() == before  # nothing written: the same token, asked again
    writer = sqlite3.connect(db, isolation_level=None)
    writer.execute("BEGIN")
    writer.execute("UPDATE Cache SET access_count = access_count + 1")
    assert watch.token() == before  # not committed yet
    writer.execute("ROLLBACK")
    assert watch.token() == before  # rolled back: nothing changed
    writer.execute("UPDATE Cache SET access_count = access_count + 1")
    after = watch.token()
    assert after != before
    assert watch.token() == after
    writer.close()


def test_the_token_is_asked_at_most_once_per_interval_but_own_writes_count_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = _db(tmp_path)
    monkeypatch.setattr(recent_reads, "CHECK_INTERVAL_S", 3600)
    watch = ChangeWatch(str(db))
    before = watch.token()
    sqlite3.connect(db, isolation_level=None).execute("UPDATE Cache SET access_count = 5")
    assert watch.token() == before  # not asked again within the interval ...
    assert watch.check() != before  # ... unless asked now
    token = watch.token()
    watch.changed()  # this process wrote
    assert watch.token() != token


def test_a_database_that_cannot_be_asked_vouches_for_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = _db(tmp_path)
    monkeypatch.setattr(recent_reads, "CHECK_INTERVAL_S", 3600)
    watch = ChangeWatch(str(db))
    watch._con.close()  # noqa: SLF001 - as if SQLite failed under it
    tokens = {watch.check() for _ in range(3)}
    assert len(tokens) == 3  # a new token each time: nothing kept is served
    with pytest.raises(sqlite3.Error):
        ChangeWatch(str(tmp_path / "nothing-here.db"))


def test_the_store_objects_of_one_folder_share_one_watch(tmp_path: Path) -> None:
    first, second = DiskcacheStore(tmp_path / "s"), DiskcacheStore(tmp_path / "s")
    try:
        assert first.get(API, "k") is None  # a miss, kept
        token = first.change_token()
        second.add(Record.from_answer(API, "k", {"error": "", "response": "x"}, "simulated", "t"), None)
        assert first.change_token() != token
        assert first.get(API, "k") is not None  # at once: the same process wrote
    finally:
        first.close()
        second.close()
    assert first.change_token() is None  # a closed store vouches for nothing


def test_a_row_written_by_plain_sqlite_is_read_within_the_interval(tmp_path: Path) -> None:
    store = DiskcacheStore(tmp_path / "s")
    try:
        record = Record.from_answer(API, "k", {"error": "", "response": "written by sqlite3"}, "simulated", "t")
        cache = diskcache.Cache(str(tmp_path / "s"))  # diskcache's encoding of the row, written by a plain connection
        row = layout.row(cache, f"e\x00{API}\x00k", record.to_json(), time.time())
        cache.close()
        assert store.get(API, "k") is None
        time.sleep(0.05)
        assert store.get(API, "k") is None  # a miss, kept (the watch asked again meanwhile)
        con = sqlite3.connect(tmp_path / "s" / "cache.db", isolation_level=None)
        con.execute("INSERT INTO Cache(key, raw, store_time, expire_time, access_time, access_count, tag, size, mode,"
                    " filename, value) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", row)
        con.close()
        deadline = time.monotonic() + 1.0
        while store.get(API, "k") is None:
            assert time.monotonic() < deadline, "a committed row was not read within 1 s"
            time.sleep(0.005)
    finally:
        store.close()


def test_kept_reads_are_bounded_by_count_and_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recent_reads, "MAX_READS", 3)
    monkeypatch.setattr(recent_reads, "MAX_BODY_CHARS", 10)
    reads = RecentReads(ChangeWatch(str(_db(tmp_path))))
    for i in range(4):
        reads.put(("e", API, str(i)), 7, None)
    assert all(reads.get(("e", API, str(i)), 7) is UNKNOWN for i in range(3))  # full: all forgotten, then the new one kept
    assert reads.get(("e", API, "3"), 7) is None  # a kept miss
    assert reads.get(("e", API, "3"), 8) is UNKNOWN  # another token: not kept
    reads.put(("e", API, "big"), 7, "x", size=11)
    assert reads.get(("e", API, "big"), 7) is UNKNOWN
