"""A running replay server serves what its diskcache store holds now, whoever changed it.

Each writer here is one the server cannot count on: the package at a commit from before the
freshness signal of 0.2.0 existed (it tells nobody of its writes), the plain ``sqlite3`` module,
an import killed with SIGKILL in the middle.  The server (1 and 2 workers) held a kept miss or a
kept hit for each call before the write; it must serve the new content within 1 s.  Files beside
SQLite's (the flight lock, a 0.2.0 generation file) deleted or truncated crash nothing and stale
nothing; every file of a live store is in docs/large-caches.md's table of what is safe to touch, and
what it says of a truncated WAL index (SIGBUS) and value file (one call's store error) holds.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import diskcache
import pytest
import requests

from stabletoolbench_mirror.core.records import Record
from stabletoolbench_mirror.stores import DiskcacheStore
from stabletoolbench_mirror.stores import diskcache_layout as layout
from tests.helpers.paths import REPO
from tests.helpers.processes import ServeProcess

#: the last commit before 0.2.0's generation file (8bef793): its writers bump nothing
OLD_COMMIT = "a361a8a59161b2ce2b981256184c449a3ee06a8b"
API = "Tools/t_for_Tools/a"
WITHIN_S = 1.0


def payload(n: int) -> dict:
    return {"category": "Tools", "tool_name": "t", "api_name": "a", "tool_input": json.dumps({"a": n}), "strip": "", "toolbench_key": ""}


def ask(server: ServeProcess, n: int) -> str | None:
    """The response served for call ``n``, ``None`` when it is unanswered."""
    r = requests.post(server.url + "/virtual", json=payload(n), timeout=30)
    assert r.status_code == 200, r.text
    return None if r.headers["x-stm-outcome"] == "unanswered" else r.json()["response"]


def settle(server: ServeProcess, n: int, expected: str | None, what: str) -> float:
    """Seconds until call ``n`` is served as ``expected`` by every worker (20 answers in a row)."""
    start = time.monotonic()
    in_a_row = 0
    while in_a_row < 20:
        in_a_row = in_a_row + 1 if ask(server, n) == expected else 0
        assert time.monotonic() - start < WITHIN_S + 5, f"{what}: call {n} still not served as {expected!r}"
    took = time.monotonic() - start
    assert took < WITHIN_S + 0.5, f"{what}: call {n} took {took:.2f} s to be served as {expected!r}"  # 20 requests included
    return took


def keep(server: ServeProcess, n: int, expected: str | None) -> None:
    """Ask call ``n`` often enough that every worker keeps its read."""
    for _ in range(20):
        assert ask(server, n) == expected


def tree_with(folder: Path, answers: dict[int, str]) -> Path:
    path = folder.joinpath(*API.split("/")).with_suffix(".json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({str({"a": n}): {"error": "", "response": text} for n, text in answers.items()}))
    return folder


def cli(args: list[str], cwd: Path, pythonpath: Path = REPO) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STM_")}
    env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run([sys.executable, "-m", "stabletoolbench_mirror", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=180)


def old_package(tmp_path: Path) -> Path:
    """The package at :data:`OLD_COMMIT`, from this repository's history."""
    where = tmp_path / "old"
    where.mkdir()
    try:
        archive = subprocess.run(["git", "-C", str(REPO), "archive", OLD_COMMIT, "stabletoolbench_mirror"],
                                 capture_output=True, check=True, timeout=60).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"the repository's history (commit {OLD_COMMIT[:7]}) is not here: {exc}")
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive, check=True, timeout=60)
    return where


@pytest.fixture(params=[1, 2], ids=["1-worker", "2-workers"])
def replay(request: pytest.FixtureRequest, tmp_path: Path):
    store = tmp_path / "store"
    with ServeProcess(tmp_path, {"mode": "replay", "store": {"kind": "diskcache", "path": str(store)}}, workers=request.param) as server:
        yield server, store


def test_writes_of_a_version_that_signals_nothing_are_served_within_a_second(replay, tmp_path: Path) -> None:
    server, store = replay
    old = old_package(tmp_path)
    version = subprocess.run([sys.executable, "-c", "import stabletoolbench_mirror as m; print(m.__file__)"], cwd=tmp_path,
                             env={**os.environ, "PYTHONPATH": str(old)}, capture_output=True, text=True, timeout=60).stdout
    assert version.startswith(str(old)), version  # the old code runs, not this checkout's
    keep(server, 1, None)  # a kept miss in every worker
    imported = cli(["cache", "import", str(tree_with(tmp_path / "tree", {1: "imported by the old version"})),
                    "--store-path", str(store), "-q"], tmp_path, old)
    assert imported.returncode == 0, imported.stdout + imported.stderr
    settle(server, 1, "imported by the old version", "an old version's import")
    deleted = cli(["cache", "delete", "--api", API, "--yes", "--store-path", str(store)], tmp_path, old)
    assert deleted.returncode == 0, deleted.stdout + deleted.stderr
    settle(server, 1, None, "an old version's delete")


_PLAIN_SQLITE = """
import json, sqlite3, sys
con = sqlite3.connect(sys.argv[1], isolation_level=None)
what, value = json.load(sys.stdin)
if what == "insert":
    con.execute("INSERT INTO Cache(key, raw, store_time, expire_time, access_time, access_count, tag, size, mode,"
                " filename, value) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", value)
else:
    con.execute("DELETE FROM Cache WHERE key = ?", (value,))
con.close()
"""


def test_rows_written_with_the_plain_sqlite3_module_are_served_within_a_second(replay, tmp_path: Path) -> None:
    server, store = replay
    record = Record.from_answer(API, str({"a": 2}), {"error": "", "response": "inserted by sqlite3"}, "simulated", "shell")
    key = f"e\x00{API}\x00{record.key}"
    cache = diskcache.Cache(str(tmp_path / "scratch"))  # diskcache's own encoding of the value
    row = layout.row(cache, key, record.to_json(), time.time())
    cache.close()
    keep(server, 2, None)

    def sqlite_shell(what: str, value: object) -> None:
        subprocess.run([sys.executable, "-c", _PLAIN_SQLITE, str(store / "cache.db")], input=json.dumps([what, value]).encode(),
                       check=True, timeout=60)

    assert all(isinstance(v, (str, int, float, type(None))) for v in row)  # a plain row: JSON carries it
    sqlite_shell("insert", list(row))
    settle(server, 2, "inserted by sqlite3", "a plain sqlite3 insert")
    keep(server, 2, "inserted by sqlite3")  # a kept hit in every worker
    sqlite_shell("delete", key)
    settle(server, 2, None, "a plain sqlite3 delete")


def test_what_an_import_killed_midway_committed_is_served_within_a_second(replay, tmp_path: Path) -> None:
    server, store = replay
    # 40 files of 2,500 answers: the import commits a batch at a time, and is killed after its first
    answers = {n: f"answer {n}" for n in range(100_000)}
    tree = tmp_path / "tree"
    for f in range(40):
        path = tree / "Tools" / "t_for_Tools" / f"a{f:02d}.json"  # other APIs, one file each
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({str({"a": n}): {"error": "", "response": answers[n]} for n in range(f * 2500, (f + 1) * 2500)}))
    tree_with(tree, {n: answers[n] for n in range(0, 100_000, 1000)})  # the API asked here: 100 answers
    for n in range(0, 100_000, 10_000):
        keep(server, n, None)
    env = {k: v for k, v in os.environ.items() if not k.startswith("STM_")}
    proc = subprocess.Popen([sys.executable, "-m", "stabletoolbench_mirror", "cache", "import", str(tree), "--store-path", str(store),
                             "-q", "--jobs", "0"], cwd=tmp_path, env={**env, "PYTHONPATH": str(REPO)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    reader = DiskcacheStore(store, read_only=True)
    try:
        deadline = time.monotonic() + 120
        while (reader.counts().entries if reader.counts() else 0) == 0:
            assert proc.poll() is None, "the import ended before any batch was seen"
            assert time.monotonic() < deadline
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=60) == -signal.SIGKILL
        committed = {n for n in range(0, 100_000, 1000) if reader.get(API, str({"a": n})) is not None}
    finally:
        reader.close()
    assert committed, "the killed import committed none of the asked API's answers"
    for n in range(0, 100_000, 10_000):
        settle(server, n, answers[n] if n in committed else None, "an import killed with SIGKILL")


def test_files_beside_the_store_deleted_or_truncated_crash_nothing_and_stale_nothing(replay, tmp_path: Path) -> None:
    server, store = replay
    generation = store / "cache.db-generation"  # as a 0.2.0 process beside this one would have made it
    generation.write_bytes(os.urandom(8))
    step = 0

    def write_then_check(damage: Callable[[], None]) -> None:
        nonlocal step
        step += 1
        keep(server, step, None)
        damage()
        imported = cli(["cache", "import", str(tree_with(tmp_path / f"tree{step}", {step: f"after damage {step}"})),
                        "--store-path", str(store), "-q"], tmp_path)
        assert imported.returncode == 0, imported.stdout + imported.stderr
        settle(server, step, f"after damage {step}", f"damage {step}")
        assert requests.get(server.url + "/health", timeout=10).json()["status"] == "ok"

    write_then_check(lambda: os.truncate(generation, 0))
    write_then_check(generation.unlink)
    write_then_check(lambda: os.truncate(store / "cache.db-flightlock", 0))
    write_then_check((store / "cache.db-flightlock").unlink)
    assert server.proc is not None and server.proc.poll() is None


DOCS = REPO / "docs" / "large-caches.md"


def documented_files() -> dict[str, str]:
    """docs/large-caches.md's table of what is safe to touch beside a live store: each file named in its first
    column, with its row."""
    section = DOCS.read_text(encoding="utf-8").split("## What is safe to touch beside a live store", 1)[1]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    named: dict[str, str] = {}
    for row in rows:
        names = re.findall(r"`([^`]+)`", row.split("|")[1])
        base = names[0]
        for name in names:  # "`cache.db-occurrences`, `-wal`, `-shm`": the suffixes of the first name
            named[base + name if name.startswith("-") else name] = row
    return named


def store_file(path: Path, store: Path) -> str:
    """A file of the store folder as the docs name it (a value file as ``<2 hex>/<2 hex>/*.val``)."""
    relative = path.relative_to(store).as_posix()
    return "<2 hex>/<2 hex>/*.val" if relative.endswith(".val") else relative


def test_the_docs_name_every_file_of_a_live_store_and_a_truncated_wal_index_kills_as_they_say(tmp_path: Path) -> None:
    """Every file in the folder of a live store (records, sessions, an answer over 32 KB kept as a file) has its row in
    docs/large-caches.md.  As that table says: a value file cut short is one call's store error (HTTP 503), the server
    unharmed; ``cache.db-shm`` truncated under the server kills it with SIGBUS at its next read of SQLite; a restart
    serves every answer again."""
    store = tmp_path / "store"
    big = "x" * 100_000
    with DiskcacheStore(str(store)) as opened:
        for n, text in ((1, "small"), (2, big)):
            opened.add(Record.from_answer(API, str({"a": n}), {"error": "", "response": text}, "simulated", "t"), None)
    config = {"mode": "replay", "store": {"kind": "diskcache", "path": str(store)}, "sessions": {"allow_client_ids": True}}
    with ServeProcess(tmp_path, config) as server:
        assert ask(server, 1) == "small" and ask(server, 2) == big
        r = requests.post(server.url + "/virtual", json=payload(1), headers={"X-STM-Session": "s"}, timeout=30)
        assert r.status_code == 200
        present = {store_file(p, store) for p in store.rglob("*") if p.is_file()}
        assert {"cache.db", "cache.db-wal", "cache.db-shm", "sessions/cache.db-shm", "<2 hex>/<2 hex>/*.val"} <= present
        assert present - set(documented_files()) == set(), "a file beside a live store the docs do not name"
        [value_file] = store.rglob("*.val")
        os.truncate(value_file, 10)
        cut = requests.post(server.url + "/virtual", json=payload(2), timeout=30)
        assert cut.status_code == 503 and cut.headers["x-stm-outcome"] == "store_error" and "unreadable record" in cut.text
        assert ask(server, 1) == "small"  # the server is unharmed
        os.truncate(store / "cache.db-shm", 0)
        n = 100
        with pytest.raises(requests.ConnectionError):  # the server dies at its first read of SQLite (a new call)
            while n < 120:
                ask(server, n)
                n += 1
        assert server.proc is not None and server.proc.wait(timeout=30) == -signal.SIGBUS
    documented = documented_files()
    assert "SIGBUS" in documented["cache.db-shm"] and "safe" in documented["cache.db-flightlock"]
    with ServeProcess(tmp_path, config) as again:  # a restart: SQLite rebuilds the index
        assert ask(again, 1) == "small"


# -- Redis: what no invalidation message covers is bounded by age ----------------------------------


@pytest.mark.redis
def test_a_redis_record_removed_behind_the_stores_back_is_read_again_within_its_age_bound(tmp_path: Path) -> None:
    import redis as redis_client

    from stabletoolbench_mirror.stores.redis_kept import KEPT_MAX_AGE_S
    from stabletoolbench_mirror.stores.redis_store import RedisStore
    from tests.helpers.redis_server import RedisServer, require_redis_server

    require_redis_server()
    record = Record.from_answer(API, "{'a': 1}", {"error": "", "response": "remembered"}, "simulated", "t")
    with RedisServer(tmp_path / "redis") as server:
        store = RedisStore(server.url, prefix="p")
        try:
            store.add(record, None)
            assert store.get(API, record.key) is not None and store.recall(API, record.key) is not None  # remembered
            raw = redis_client.Redis.from_url(server.url)
            raw.hdel(f"p:e:{API}", record.key)  # as redis-cli would: no invalidation message
            raw.close()
            start = time.monotonic()
            while store.get(API, record.key) is not None:
                assert time.monotonic() - start < KEPT_MAX_AGE_S + 1.0, "a removed record was served past the memory's age bound"
                time.sleep(0.02)
        finally:
            store.close()


@pytest.mark.redis
def test_while_redis_is_down_the_memory_serves_what_it_holds_at_any_age(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from stabletoolbench_mirror.stores import redis_kept
    from stabletoolbench_mirror.stores.base import StoreError
    from stabletoolbench_mirror.stores.redis_store import RedisStore
    from tests.helpers.redis_server import RedisServer, require_redis_server

    require_redis_server()
    record = Record.from_answer(API, "{'a': 1}", {"error": "", "response": "remembered"}, "simulated", "t")
    with RedisServer(tmp_path / "redis") as server:
        monkeypatch.setattr(redis_kept, "KEPT_MAX_AGE_S", 0.05)
        store = RedisStore(server.url, prefix="p", timeout_s=0.5)
        try:
            store.add(record, "c")
            assert store.get_canonical(API, "c") is not None  # the pointer and the record remembered
            server.stop()
            time.sleep(0.1)  # older than the age bound: Redis would be asked, and cannot answer
            assert store.get(API, record.key) == store.get_canonical(API, "c")
            assert json.loads(store.get(API, record.key).body)["response"] == "remembered"
            with pytest.raises(StoreError):
                store.get(API, "{'a': 2}")  # never read: nothing to serve
        finally:
            store.close()
