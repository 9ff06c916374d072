"""`snapshot OUT` / `snapshot --verify OUT`: upstream tree + manifest, stable content hash, tamper detection."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from stabletoolbench_mirror.config import load_settings
from stabletoolbench_mirror.core.keys import canonical_from_upstream_key
from stabletoolbench_mirror.core.records import Record
from stabletoolbench_mirror.snapshots.snapshot import verify_snapshot, write_snapshot
from stabletoolbench_mirror.stores import DiskcacheStore, FrozenCache
from stabletoolbench_mirror.upstream.archives import tree_hash
from stabletoolbench_mirror.upstream.content_hash import ContentHash

RECORDS = [
    Record.from_answer("Data/theclique_for_Data/transfermarkt_search", "{'name': 'messi'}", {"error": "", "response": "Messi é"}, "real", "relay:http://127.0.0.1:1"),
    Record.from_answer("Data/theclique_for_Data/transfermarkt_search", "{'name': 'neymar'}", {"error": "", "response": {"b": 1, "a": [1.5, None]}}, "simulated", "MirrorAPI@http://127.0.0.1:2/v1"),
    Record.from_answer("Sports/ball_for_Sports/get_score", "{'is_id': 5}", {"error": "", "response": "3-1"}, "simulated", "MirrorAPI-CoT@http://127.0.0.1:3/v1"),
    Record.from_answer("Sports/ball_for_Sports/get_score", "{}", {"error": "", "response": ""}, "imported", "import:cache/Sports/ball_for_Sports/get_score.json"),
]


def fill(path: Path, records) -> DiskcacheStore:
    store = DiskcacheStore(path)
    for record in records:
        store.add(record, canonical_from_upstream_key(record.key))
    return store


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STM_")}
    return subprocess.run([sys.executable, "-m", "stabletoolbench_mirror", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_same_store_twice_same_hash_and_order_independent(tmp_path: Path) -> None:
    with fill(tmp_path / "s1", RECORDS) as store:
        first = write_snapshot(store, tmp_path / "snap1")
        second = write_snapshot(store, tmp_path / "snap2")
    assert first["content_hash"] == second["content_hash"]
    assert first["content_hash"].startswith("sha256:")
    # the same answers recorded in another order (other times) in another store
    reordered = [Record(r.api, r.key, r.body, r.source, r.origin, created_at=1e9 - i) for i, r in enumerate(RECORDS)]
    with fill(tmp_path / "s2", reversed(reordered)) as other:
        third = write_snapshot(other, tmp_path / "snap3")
    assert third["content_hash"] == first["content_hash"]
    # any change to what is served changes it
    changed = RECORDS[:-1] + [Record.from_answer(RECORDS[-1].api, RECORDS[-1].key, {"error": "", "response": "x"}, "imported")]
    with fill(tmp_path / "s3", changed) as changed_store:
        assert write_snapshot(changed_store, tmp_path / "snap4")["content_hash"] != first["content_hash"]
    assert ContentHash().hexdigest() != first["content_hash"]  # the hash of no entries


def test_manifest_counts_models_and_served_tree(tmp_path: Path) -> None:
    with fill(tmp_path / "s", RECORDS) as store:
        manifest = write_snapshot(store, tmp_path / "snap")
    on_disk = json.loads((tmp_path / "snap" / "manifest.json").read_text())
    assert on_disk == manifest
    assert manifest["entries"] == 4 and manifest["files"] == 2
    assert manifest["by_source"] == {"imported": 1, "real": 1, "simulated": 2}
    assert manifest["by_category"] == {"Data": 2, "Sports": 2}
    assert manifest["models"] == {"MirrorAPI-CoT@http://127.0.0.1:3/v1": 1, "MirrorAPI@http://127.0.0.1:2/v1": 1}
    assert manifest["origins"]["imported:import:cache"] == 1
    # the tree is an upstream cache: served as a frozen layer it gives the recorded bytes
    frozen = FrozenCache(tmp_path / "snap")
    for record in RECORDS:
        assert frozen.get(record.api, record.key).body == record.body
    assert verify_snapshot(tmp_path / "snap").ok


def test_manifest_settings_carry_no_secret(tmp_path: Path) -> None:
    settings = load_settings(
        None,
        overrides={
            "store": {"path": str(tmp_path / "s")},
            "auth_token": "tok-abcdef123",
            "real": {"enabled": True, "relay_url": "http://alice:pw-xyz-987@relay.local:8080/rapidapi", "toolbench_key": "tbk-secret-42"},
            "simulator": {"enabled": True, "api_key": "sk-simkey-777", "api_base": "http://127.0.0.1:9/v1", "model": "MirrorAPI"},
        },
        environ={},
    )
    with fill(tmp_path / "s", RECORDS) as store:
        manifest = write_snapshot(store, tmp_path / "snap", settings=settings)
    text = (tmp_path / "snap" / "manifest.json").read_text()
    for secret in ("tok-abcdef123", "pw-xyz-987", "tbk-secret-42", "sk-simkey-777", "alice:"):
        assert secret not in text
    assert manifest["settings"]["simulator"]["model"] == "MirrorAPI"
    assert manifest["settings"]["real"]["toolbench_key"] == "***"
    assert manifest["settings"]["real"]["relay_url"] == "http://relay.local:8080/rapidapi"


def test_verify_detects_tampering(tmp_path: Path) -> None:
    with fill(tmp_path / "s", RECORDS) as store:
        write_snapshot(store, tmp_path / "snap")
    original = tmp_path / "snap"
    # reformatting or reordering a file is not a change
    file = original / "Data" / "theclique_for_Data" / "transfermarkt_search.json"
    data = json.loads(file.read_text())
    file.write_text(json.dumps(dict(reversed(list(data.items())))))
    assert verify_snapshot(original).ok

    changed = tmp_path / "changed"
    shutil.copytree(original, changed)
    f = changed / "Data" / "theclique_for_Data" / "transfermarkt_search.json"
    d = json.loads(f.read_text())
    d["{'name': 'messi'}"]["response"] = "Messi e"
    f.write_text(json.dumps(d))
    result = verify_snapshot(changed)
    assert not result.ok and any("content hash" in p for p in result.problems)

    added = tmp_path / "added"
    shutil.copytree(original, added)
    extra = added / "Data" / "other_for_Data"
    extra.mkdir()
    (extra / "api.json").write_text(json.dumps({"{}": {"error": "", "response": "new"}}))
    result = verify_snapshot(added)
    assert not result.ok and any("entry count" in p for p in result.problems)

    broken = tmp_path / "broken"
    shutil.copytree(original, broken)
    (broken / "Sports" / "ball_for_Sports" / "get_score.json").write_text("{oops")
    result = verify_snapshot(broken)
    assert not result.ok and any("unreadable" in p for p in result.problems)

    assert not verify_snapshot(tmp_path / "nowhere").ok


def test_snapshot_cli_of_imported_reference_cache(reference_dir: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    assert cli("cache", "import", str(reference_dir / "cache"), "--store-path", str(store), "-q", cwd=tmp_path).returncode == 0
    out = tmp_path / "snap"
    first = cli("snapshot", str(out), "--store-path", str(store), "-q", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    # the hash of the snapshot is the hash of the reference tree itself
    assert manifest["content_hash"] == tree_hash(reference_dir / "cache", progress=False)
    assert manifest["content_hash"] in first.stdout
    second = cli("snapshot", str(tmp_path / "snap2"), "--store-path", str(store), "-q", cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert json.loads((tmp_path / "snap2" / "manifest.json").read_text())["content_hash"] == manifest["content_hash"]
    ok = cli("snapshot", "--verify", str(out), cwd=tmp_path)
    assert ok.returncode == 0 and "OK" in ok.stdout
    # into a non-empty folder: refused
    again = cli("snapshot", str(out), "--store-path", str(store), "-q", cwd=tmp_path)
    assert again.returncode == 2 and "not empty" in again.stderr
    victim = next(out.glob("Data/*/*.json"))
    data = json.loads(victim.read_text())
    key = next(iter(data))
    data[key]["error"] = "tampered"
    victim.write_text(json.dumps(data))
    bad = cli("snapshot", "--verify", str(out), cwd=tmp_path)
    assert bad.returncode == 1 and "FAILED" in bad.stdout


def test_failed_verify_names_the_apis_and_files_that_changed(tmp_path: Path) -> None:
    more = RECORDS + [Record.from_answer("Travel/trip_for_Travel/find", "{}", {"error": "", "response": "t"}, "real", "relay")]
    with fill(tmp_path / "s", more) as store:
        write_snapshot(store, tmp_path / "snap")
    snap = tmp_path / "snap"
    changed = snap / "Data" / "theclique_for_Data" / "transfermarkt_search.json"
    data = json.loads(changed.read_text())
    data["{'name': 'messi'}"]["response"] = "Messi e"
    changed.write_text(json.dumps(data))
    grown = snap / "Sports" / "ball_for_Sports" / "get_score.json"
    grown.write_text(json.dumps({**json.loads(grown.read_text()), "{'is_id': 6}": {"error": "", "response": "0-0"}}))
    (snap / "Travel" / "trip_for_Travel" / "find.json").unlink()
    (snap / "Data" / "other_for_Data").mkdir()
    (snap / "Data" / "other_for_Data" / "api.json").write_text(json.dumps({"{}": {"error": "", "response": "new"}}))
    result = cli("snapshot", "--verify", str(snap), "--quiet", cwd=tmp_path)
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    for expected in [
        "  - changed: Data/theclique_for_Data/transfermarkt_search (Data/theclique_for_Data/transfermarkt_search.json): entries changed",
        "  - changed: Sports/ball_for_Sports/get_score (Sports/ball_for_Sports/get_score.json): entries: manifest 2, files 3",
        "  - missing: Travel/trip_for_Travel/find (Travel/trip_for_Travel/find.json): the manifest has 1 entries, the files none",
        "  - added: Data/other_for_Data/api (Data/other_for_Data/api.json): 1 entries the manifest does not have",
    ]:
        assert expected in lines, result.stdout
    assert len([line for line in lines if line.startswith(("  - changed:", "  - missing:", "  - added:"))]) == 4
    # a manifest written before api_hashes says it cannot name them
    manifest = json.loads((snap / "manifest.json").read_text())
    del manifest["api_hashes"]
    (snap / "manifest.json").write_text(json.dumps(manifest))
    old = cli("snapshot", "--verify", str(snap), "--quiet", cwd=tmp_path)
    assert old.returncode == 1 and "the manifest has no api_hashes (written before they were kept): it cannot say which files changed" in old.stdout
