"""`stabletoolbench-mirror cache import/export/stats`, run as the real console script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from stabletoolbench_mirror.stores import DiskcacheStore
from stabletoolbench_mirror.upstream.layout import iter_cache_files, read_cache_file


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STM_")}
    return subprocess.run([sys.executable, "-m", "stabletoolbench_mirror", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def _tree_content(root: Path) -> dict[str, dict]:
    return {ns: read_cache_file(path) for ns, path in iter_cache_files(root)}


def test_import_is_idempotent_and_export_reproduces_the_tree(reference_dir: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    first = cli("cache", "import", str(reference_dir / "cache"), "--store-path", str(store), cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    entries = sum(len(v) for v in _tree_content(reference_dir / "cache").values())
    assert f"added:            {entries}" in first.stdout
    second = cli("cache", "import", str(reference_dir / "cache"), "--store-path", str(store), cwd=tmp_path)
    assert "added:            0" in second.stdout and f"already present:  {entries}" in second.stdout

    with DiskcacheStore(store) as s:
        records = list(s)
    assert len(records) == entries
    assert {r.source for r in records} == {"imported"}
    assert all(r.origin.startswith("import:") for r in records)

    out = tmp_path / "exported"
    exported = cli("cache", "export", str(out), "--store-path", str(store), cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr
    assert _tree_content(out) == _tree_content(reference_dir / "cache")

    stats = cli("cache", "stats", "--json", "--store-path", str(store), cwd=tmp_path)
    data = json.loads(stats.stdout)
    assert data["entries"] == entries and data["by_source"] == {"imported": entries}
    assert data["by_category"] == {"Data": entries}


def test_import_reports_unreadable_files(tmp_path: Path) -> None:
    tree = tmp_path / "tree" / "Tools" / "t_for_Tools"
    tree.mkdir(parents=True)
    (tree / "good.json").write_text(json.dumps({"{'a': 1}": {"error": "", "response": "ok"}}))
    (tree / "bad.json").write_text("{ not json")
    (tree / "list.json").write_text("[1, 2]")
    result = cli("cache", "import", str(tmp_path / "tree"), "--store-path", str(tmp_path / "s"), "-q", cwd=tmp_path)
    assert result.returncode == 1
    assert "unreadable files: 2" in result.stdout
    assert "added:            1" in result.stdout


def test_import_of_missing_folder_is_a_clear_error(tmp_path: Path) -> None:
    result = cli("cache", "import", str(tmp_path / "nope"), "--store-path", str(tmp_path / "s"), cwd=tmp_path)
    assert result.returncode == 2 and f"{tmp_path / 'nope'} does not exist" in result.stderr


# -- issue 18 item 7g: cache stats writes nothing to the store ------------------------------------


def _store_with_records(path: Path, n: int = 40) -> None:
    from stabletoolbench_mirror.core.records import Record

    with DiskcacheStore(path) as store:
        store.add_many([
            (Record(api="Data/t_for_Data/a", key=f"{{'q': {i}}}", body=json.dumps({"error": "", "response": f"r{i}"}),
                    source="simulated", origin="m", created_at=float(i)), None)
            for i in range(n)
        ])


def _files(folder: Path) -> dict[str, tuple[int, int, str]]:
    import hashlib

    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest()) for p in sorted(folder.iterdir())}


def test_cache_stats_writes_nothing_while_a_server_holds_the_store(tmp_path: Path, serve, settings_factory) -> None:
    import requests

    store = tmp_path / "store"
    _store_with_records(store)
    server = serve(settings_factory(mode="replay"))  # a server holding the store open, in another process than stats
    hit = requests.post(server.url + "/virtual", json={"category": "Data", "tool_name": "t", "api_name": "a",
                                                       "tool_input": '{"q": 3}', "strip": "", "toolbench_key": ""}, timeout=30)
    assert hit.json()["response"] == "r3", hit.text
    # SQLite's shared-memory index (-shm) is not data: readers mark their place in it
    before = {k: v for k, v in _files(store).items() if not k.endswith("-shm")}
    assert "cache.db-wal" in before
    outputs = []
    for _ in range(3):
        result = cli("cache", "stats", "--store-path", str(store), cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        outputs.append(result.stdout)
        after = {k: v for k, v in _files(store).items() if not k.endswith("-shm")}
        assert after == before, "cache stats changed the store's files"
    assert "entries: 40" in outputs[0] and outputs[0] == outputs[1] == outputs[2]  # bytes per entry does not creep up


def test_cache_stats_of_a_closed_store_leaves_its_file_as_it_was(tmp_path: Path) -> None:
    store = tmp_path / "store"
    _store_with_records(store)
    before = _files(store)
    result = cli("cache", "stats", "--json", "--store-path", str(store), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["entries"] == 40
    after = _files(store)
    # the files there are as they were; SQLite's read-only open may leave its empty log and index beside them
    assert {k: after[k] for k in before} == before
    assert set(after) - set(before) <= {"cache.db-wal", "cache.db-shm"} and after.get("cache.db-wal", (0,))[0] == 0
    missing = cli("cache", "stats", "--store-path", str(tmp_path / "nothing"), cwd=tmp_path)
    assert missing.returncode == 2 and "error: no diskcache store at" in missing.stderr and "(no cache.db there): check store.path" in missing.stderr
    assert not (tmp_path / "nothing").exists()  # no empty store made on the way


def test_cache_stats_sends_redis_no_write(tmp_path: Path) -> None:
    import redis

    from stabletoolbench_mirror.core.records import Record
    from stabletoolbench_mirror.stores.redis_store import RedisStore
    from tests.helpers.redis_server import RedisServer, require_redis_server

    require_redis_server()
    with RedisServer(tmp_path / "redis") as server:
        with RedisStore(server.url) as store:
            store.add(Record(api="Data/t_for_Data/a", key="{}", body='{"error": "", "response": "x"}', source="simulated",
                             origin="m", created_at=1.0), None)
        client = redis.Redis.from_url(server.url)
        client.config_resetstat()
        dirty = client.info("persistence")["rdb_changes_since_last_save"]
        cfg = tmp_path / "redis.yml"
        cfg.write_text(json.dumps({"store": {"kind": "redis", "url": server.url}}))
        result = cli("cache", "stats", "--config", str(cfg), cwd=tmp_path)
        assert result.returncode == 0 and "entries: 1" in result.stdout, result.stdout + result.stderr
        assert client.info("persistence")["rdb_changes_since_last_save"] == dirty
        commands = {name.removeprefix("cmdstat_") for name in client.info("commandstats")}
        # reads only (GET: the store's format marker)
        assert commands <= {"hgetall", "scard", "info", "get", "config|resetstat", "config", "client|setinfo", "client", "hello"}, commands


# -- issue 18 items 3d and 8: a file too large, or with a name that is not UTF-8, is skipped with a warning ----


def test_import_skips_a_file_over_frozen_max_file_mb_and_one_named_in_bytes_that_are_not_utf8(tmp_path: Path) -> None:
    tool = tmp_path / "tree" / "Tools" / "t_for_Tools"
    tool.mkdir(parents=True)
    (tool / "good.json").write_text(json.dumps({"{'a': 1}": {"error": "", "response": "ok"}}))
    sparse = tool / "huge.json"
    with open(sparse, "wb") as fh:
        fh.truncate(200 * 1024 * 1024)  # 200 MB of holes: nothing on disk
    # a real file name that is not UTF-8 (latin-1 "café"), made through a bytes path
    latin1 = os.path.join(os.fsencode(tool), b"caf\xe9.json")
    with open(latin1, "wb") as fh:
        fh.write(json.dumps({"{}": {"error": "", "response": "latin"}}).encode())
    config = tmp_path / "import.yml"
    config.write_text(json.dumps({"store": {"path": str(tmp_path / "store")}, "frozen_max_file_mb": 1}))
    result = cli("cache", "import", "tree", "--config", str(config), "-q", cwd=tmp_path)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 1, result.stdout + result.stderr
    assert "added:            1" in result.stdout and "unreadable files: 2" in result.stdout
    too_large = ("tree/Tools/t_for_Tools/huge.json: 200.0 MB, over frozen_max_file_mb (1 MB): not parsed; "
                 "raise frozen_max_file_mb to read it (parsing takes about twice its size in memory)")
    not_utf8 = ("tree/Tools/t_for_Tools/caf\\xe9.json: the name is not UTF-8 (an API's name is text): "
                "rename the file or folder (e.g. convmv -f latin1 -t utf8) and import again")
    for why in (too_large, not_utf8):
        assert f"  {why}" in result.stdout.splitlines()
        assert result.stderr.count(f"skipping {why}") == 1
    with DiskcacheStore(tmp_path / "store") as store:
        assert [(r.api, r.key) for r in store] == [("Tools/t_for_Tools/good", "{'a': 1}")]
