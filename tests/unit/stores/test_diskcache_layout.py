"""diskcache's private table layout, read and written directly by one module, is checked when a store opens."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import diskcache
import pytest

from stabletoolbench_mirror.core.records import Record
from stabletoolbench_mirror.stores import DiskcacheStore, StoreError
from stabletoolbench_mirror.stores import diskcache_layout as layout


def test_the_installed_diskcache_lays_its_table_out_as_the_store_expects(tmp_path: Path) -> None:
    cache = diskcache.Cache(str(tmp_path / "c"))
    try:
        found = tuple((name, kind) for _cid, name, kind, *_ in cache._sql("PRAGMA table_info(Cache)").fetchall())  # noqa: SLF001
    finally:
        cache.close()
    assert found == layout.COLUMNS, (
        f"diskcache {diskcache.__version__} changed its table: update stabletoolbench_mirror/stores/diskcache_layout.py"
    )


def test_a_bulk_row_reads_back_through_diskcache_itself(tmp_path: Path) -> None:
    cache = diskcache.Cache(str(tmp_path / "c"))
    try:
        with cache.transact():
            layout.insert(cache, [layout.row(cache, "k\x00text", "a value"), layout.row(cache, "k\x00n", 7)])
        assert cache.get("k\x00text") == "a value" and cache.get("k\x00n") == 7
        assert layout.present(cache, ["k\x00text", "k\x00n", "k\x00none"]) == {"k\x00text", "k\x00n"}
        assert list(layout.scan(cache, "k\x00", "k\x01", inclusive=False, page=1)) == [("k\x00n", 7), ("k\x00text", "a value")]
    finally:
        cache.close()


@pytest.mark.parametrize("read_only", [False, True])
def test_a_table_laid_out_otherwise_is_refused_naming_diskcaches_version(tmp_path: Path, read_only: bool) -> None:
    with DiskcacheStore(tmp_path / "store") as store:
        store.add(Record.from_answer("C/t_for_C/a", "{}", {"error": "", "response": "x"}, "simulated"), "{}")
    con = sqlite3.connect(tmp_path / "store" / "cache.db")
    con.execute("ALTER TABLE Cache ADD COLUMN shard INTEGER")
    con.commit()
    con.close()
    with pytest.raises(StoreError) as raised:
        DiskcacheStore(tmp_path / "store", read_only=read_only)
    assert f"diskcache {diskcache.__version__}" in str(raised.value) and "diskcache_layout.py" in str(raised.value)
