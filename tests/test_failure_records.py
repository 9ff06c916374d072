"""Failure records: a miss that ended without a usable answer is recorded as served, replayed byte for byte,
retried in record mode, kept or left out of snapshots, and counted apart by `check`, `cache stats` and /stats."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from stabletoolbench_mirror.keys import canonical_from_upstream_key
from stabletoolbench_mirror.records import Record
from stabletoolbench_mirror.snapshot import verify_snapshot, write_snapshot
from stabletoolbench_mirror.stores import DiskcacheStore, FrozenCache
from stabletoolbench_mirror.upstream_layout import iter_cache_files, read_cache_file

NS = "Data/flaky_for_Data/lookup"
UPSTREAM_FAILED = {"error": "Failed to generate fake response", "response": ""}


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STM_")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    return subprocess.run([sys.executable, "-m", "stabletoolbench_mirror", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def answer(key: str, text: str) -> Record:
    return Record.from_answer(NS, key, {"error": "", "response": text}, "simulated", "MirrorAPI")


def failure(key: str, served: dict) -> Record:
    return Record.failure(NS, key, served, "simulated", "MirrorAPI", reason="simulator output not parsable", tried=("simulated:MirrorAPI",))


MIXED = [
    answer("{'n': 1}", "one"),
    failure("{'n': 2}", UPSTREAM_FAILED),
    answer("{'n': 3}", "three"),
    failure("{'n': 4}", {"error": "Rate limit exceeded", "response": ""}),
]


def filled(path: Path, records=MIXED) -> DiskcacheStore:
    store = DiskcacheStore(path)
    for record in records:
        store.add(record, canonical_from_upstream_key(record.key))
    return store


def tree(root: Path) -> dict[str, dict]:
    return {ns: read_cache_file(path) for ns, path in iter_cache_files(root)}


def test_snapshot_writes_failures_as_served_and_lists_them(tmp_path: Path) -> None:
    with filled(tmp_path / "store") as store:
        manifest = write_snapshot(store, tmp_path / "snap")
    # the upstream layout: the served body is the value, failures included
    assert tree(tmp_path / "snap") == {NS: {r.key: r.answer for r in MIXED}}
    assert manifest["entries"] == 4 and manifest["failures"] == 2 and manifest["excluded_failures"] == 0
    assert manifest["failure_entries"] == [[NS, "{'n': 2}"], [NS, "{'n': 4}"]]
    assert manifest["failure_reasons"] == {"simulator output not parsable": 2}
    assert verify_snapshot(tmp_path / "snap").ok
    # served as a frozen cache, the same bytes, and the failures are known as failures
    frozen = FrozenCache(tmp_path / "snap")
    for record in MIXED:
        got = frozen.get(NS, record.key)
        assert got is not None and got.body == record.body and got.is_failure == record.is_failure
    assert [r.key for r in frozen.sample(NS, 10)] == ["{'n': 1}", "{'n': 3}"]  # failures are no few-shot examples


def test_exclude_failures_leaves_exactly_those_out(tmp_path: Path) -> None:
    filled(tmp_path / "store").close()
    result = cli("snapshot", str(tmp_path / "snap"), "--exclude-failures", "--store-path", str(tmp_path / "store"), "-q", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "failures:      0 included, 2 left out" in result.stdout
    assert tree(tmp_path / "snap") == {NS: {r.key: r.answer for r in MIXED if not r.is_failure}}
    manifest = json.loads((tmp_path / "snap" / "manifest.json").read_text())
    assert manifest["failures"] == 0 and manifest["excluded_failures"] == 2 and manifest["failure_entries"] == []
    assert cli("snapshot", "--verify", str(tmp_path / "snap"), cwd=tmp_path).returncode == 0


def test_verify_notices_a_failure_list_that_does_not_match(tmp_path: Path) -> None:
    with filled(tmp_path / "store") as store:
        write_snapshot(store, tmp_path / "snap")
    path = tmp_path / "snap" / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["failure_entries"].append([NS, "{'n': 99}"])
    path.write_text(json.dumps(manifest))
    result = verify_snapshot(tmp_path / "snap")
    assert not result.ok and any("failure" in p for p in result.problems)


def test_import_and_stats_keep_failures_failures(tmp_path: Path) -> None:
    with filled(tmp_path / "store") as store:
        write_snapshot(store, tmp_path / "snap")
    # upstream's own tree: its saved "Failed to generate fake response" is a failure too
    upstream = tmp_path / "upstream" / "Data" / "flaky_for_Data"
    upstream.mkdir(parents=True)
    (upstream / "other.json").write_text(json.dumps({"{'m': 1}": UPSTREAM_FAILED, "{'m': 2}": {"error": "", "response": "fine"}}))
    for source in (tmp_path / "snap", tmp_path / "upstream"):
        result = cli("cache", "import", str(source), "--store-path", str(tmp_path / "imported"), "-q", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
    with DiskcacheStore(tmp_path / "imported") as store:
        kinds = {(r.namespace.rsplit("/", 1)[1], r.key): r.is_failure for r in store}
    assert kinds == {("lookup", "{'n': 1}"): False, ("lookup", "{'n': 2}"): True, ("lookup", "{'n': 3}"): False,
                     ("lookup", "{'n': 4}"): True, ("other", "{'m': 1}"): True, ("other", "{'m': 2}"): False}
    stats = json.loads(cli("cache", "stats", "--json", "--store-path", str(tmp_path / "imported"), cwd=tmp_path).stdout)
    assert stats["entries"] == 6 and stats["failure_records"] == 3
    text = cli("cache", "stats", "--store-path", str(tmp_path / "imported"), cwd=tmp_path).stdout
    assert "failure records: 3" in text


def test_a_frozen_answer_takes_the_canonical_key_from_a_frozen_failure(tmp_path: Path) -> None:
    folder = tmp_path / "t" / "Data" / "flaky_for_Data"
    folder.mkdir(parents=True)
    (folder / "lookup.json").write_text(json.dumps({"{'a': 1, 'b': 2}": UPSTREAM_FAILED, "{'b': 2, 'a': 1}": {"error": "", "response": "ok"}}))
    frozen = FrozenCache(tmp_path / "t")
    canonical = canonical_from_upstream_key("{'a': 1, 'b': 2}")
    assert frozen.get_canonical(NS, canonical).answer == {"error": "", "response": "ok"}  # type: ignore[union-attr]
    assert frozen.get(NS, "{'a': 1, 'b': 2}").is_failure  # type: ignore[union-attr]
