"""Stores at scale: counters kept on every write (``cache stats`` without a scan), batched adds, one API at a time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from stabletoolbench_mirror.core.records import Record, origin_key
from stabletoolbench_mirror.snapshots.tree_export import export_tree, store_stats
from stabletoolbench_mirror.stores import DiskcacheStore, Store
from tests.helpers import paths
from tests.helpers.redis_server import RedisServer, redis_prefix, redis_server  # noqa: F401
from tests.helpers.store_fixtures import spec, store  # noqa: F401

REPO = paths.REPO


def records(n: int) -> list[tuple[Record, str]]:
    out = []
    for i in range(n):
        category = ["Data", "Sports", "Finance"][i % 3]
        ns = f"{category}/t{i % 7}_for_{category}/api_{i % 11}"
        source = ["real", "simulated", "imported"][i % 3]
        origin = f"model-{i % 2}" if source == "simulated" else ("https://host" if source == "real" else f"import:x/{ns}.json")
        key = str({"i": i})
        out.append((Record.from_answer(ns, key, {"error": "", "response": f"answer {i}"}, source, origin), json.dumps({"i": i})))  # type: ignore[arg-type]
    return out


def scanned(store: Store) -> dict[str, Any]:
    by_source: Counter[str] = Counter()
    by_category: Counter[str] = Counter()
    origins: Counter[str] = Counter()
    apis = set()
    for r in store:
        by_source[r.source] += 1
        by_category[r.api.split("/", 1)[0]] += 1
        apis.add(r.api)
        origins[origin_key(r)] += 1
    return {"entries": sum(by_source.values()), "apis": len(apis), "by_source": dict(by_source),
            "by_category": dict(by_category), "origins": dict(origins)}


def test_counters_match_a_full_scan(store: Store) -> None:
    items = records(300)
    for record, canonical in items[:100]:
        assert store.add(record, canonical)
    assert store.add_many(items[50:300]) == [False] * 50 + [True] * 200  # duplicates are not counted twice
    again = Record.from_answer(items[0][0].api, "{'i': 'new'}", {"error": "", "response": "once"}, "real", "https://h")
    twice = Record.from_answer(items[0][0].api, "{'i': 'new'}", {"error": "", "response": "twice"}, "real", "https://h")
    assert store.add_many([(again, "c-new"), (twice, "c-new")]) == [True, False]  # the first of a batch wins
    assert store.get(again.api, again.key).answer["response"] == "once"
    assert store.get_canonical(again.api, "c-new").key == again.key
    items.append((again, "c-new"))
    counts = store.counts()
    assert counts is not None
    truth = scanned(store)
    assert counts.entries == truth["entries"] == 301 == len(store)
    assert counts.apis == truth["apis"]
    assert counts.by_source == truth["by_source"]
    assert counts.by_category == truth["by_category"]
    assert counts.by_origin == truth["origins"]
    stats = store_stats(store)
    assert stats["counted_by"] == "counters" and stats["entries"] == 301
    assert stats["bytes_per_entry"] and stats["bytes_per_entry"] > 0


def test_iter_groups_one_api_at_a_time_in_order(store: Store) -> None:
    store.add_many(records(120))
    groups = list(store.iter_groups())
    names = [ns for ns, _ in groups]
    assert names == sorted(set(names)) and len(names) == len({r.api for r in store})
    assert sum(len(g) for _, g in groups) == 120
    for ns, group in groups:
        assert all(r.api == ns for r in group)
        assert [r.created_at for r in group] == sorted(r.created_at for r in group)


def test_a_store_written_before_counters_is_scanned(tmp_path: Path) -> None:
    """A diskcache folder whose records predate the counters: stats fall back to a scan, still right."""
    import diskcache

    from stabletoolbench_mirror.stores.diskcache_keys import canonical_key, entry_key

    with diskcache.Cache(str(tmp_path / "old"), eviction_policy="none") as raw:  # written as the old code did
        for record, canonical in records(30):
            raw.add(entry_key(record.api, record.key), record.to_json())
            raw.add(canonical_key(record.api, canonical), record.key)
    with DiskcacheStore(tmp_path / "old") as store:
        assert store.counts() is None
        stats = store_stats(store)
        assert stats["counted_by"] == "full scan" and stats["entries"] == 30 == len(store)
        assert stats["apis"] == scanned(store)["apis"]


def test_cache_stats_command_reports_counts_and_size(tmp_path: Path) -> None:
    with DiskcacheStore(tmp_path / "store") as store:
        store.add_many(records(90))
    env = {k: v for k, v in os.environ.items() if not k.startswith("STM_")}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run([sys.executable, "-m", "stabletoolbench_mirror", "cache", "stats", "--store-path", str(tmp_path / "store")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "entries: 90" in proc.stdout and "(from counters)" in proc.stdout
    assert "bytes per entry" in proc.stdout


def test_export_streams_the_same_tree(store: Store, tmp_path: Path) -> None:
    store.add_many(records(200))
    summary = export_tree(store, tmp_path / "out", progress=False)
    assert summary.entries == 200
    from stabletoolbench_mirror.upstream.layout import iter_cache_files, read_cache_file

    seen = {}
    for ns, path in iter_cache_files(tmp_path / "out"):
        for key, answer in read_cache_file(path).items():
            seen[(ns, key)] = answer
    assert seen == {(r.api, r.key): r.answer for r in store}
