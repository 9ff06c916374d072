"""A snapshot's ``failure_entries`` covered by its manifest: emptied, the snapshot is refused naming the field.

A manifest written before ``failure_entries_hash`` was kept (by 0.2.0) still verifies and imports; one that says it was
written by a version that keeps the field, without it, is refused as a changed list is.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from stabletoolbench_mirror.config import ConfigError
from stabletoolbench_mirror.core.records import Record
from stabletoolbench_mirror.factory import build_frozen
from stabletoolbench_mirror.stores import DiskcacheStore
from tests.helpers import paths

API = "Data/t_for_Data/lookup"


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STM_")}
    env["PYTHONPATH"] = str(paths.REPO)
    return subprocess.run([sys.executable, "-m", "stabletoolbench_mirror", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def _snapshot_folder(tmp_path: Path) -> Path:
    """A snapshot folder of 2 answers and 2 failure records."""
    store_path = tmp_path / "store"
    with DiskcacheStore(store_path) as store:
        for n in range(2):
            store.add(Record.from_answer(API, json.dumps({"n": n}), {"error": "", "response": f"r{n}"}, "real", "r"), None)
        for n in (2, 3):
            store.add(Record.failure(API, json.dumps({"n": n}), {"error": "API not working", "response": ""}, "simulated", "s",
                                     reason="invalid"), None)
    out = tmp_path / "snap"
    made = _cli("snapshot", str(out), "--store-path", str(store_path), "-q", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    return out


def _edit_manifest(folder: Path, edit) -> None:  # type: ignore[no-untyped-def]
    path = folder / "manifest.json"
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest, indent=2))


def _pack(folder: Path, out: Path) -> Path:
    with tarfile.open(out, "w:gz") as tar:
        for child in sorted(folder.iterdir()):
            tar.add(child, arcname=child.name)
    return out


def _config(tmp_path: Path, name: str) -> str:
    config = tmp_path / f"{name}.yml"
    config.write_text(json.dumps({"download_dir": str(tmp_path / f"downloads-{name}")}))
    return str(config)


def _imported(tmp_path: Path, source: Path, name: str) -> subprocess.CompletedProcess:
    return _cli("cache", "import", str(source), "--config", _config(tmp_path, name), "--store-path", str(tmp_path / f"into-{name}"),
                "-q", cwd=tmp_path)


def _failures_in(tmp_path: Path, name: str) -> int:
    with DiskcacheStore(tmp_path / f"into-{name}") as store:
        return sum(1 for record in store if record.is_failure)


@pytest.mark.parametrize("as_archive", [False, True])
def test_emptied_failure_entries_are_refused_naming_the_field(settings_factory, tmp_path: Path, as_archive: bool) -> None:
    folder = _snapshot_folder(tmp_path)
    manifest = json.loads((folder / "manifest.json").read_text())
    assert len(manifest["failure_entries"]) == 2 and manifest["failure_entries_hash"].startswith("sha256:")
    source = _pack(folder, tmp_path / "snap.tar.gz") if as_archive else folder
    verified = _cli("snapshot", "--verify", str(source), "--config", _config(tmp_path, "verify"), "-q", cwd=tmp_path)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    done = _imported(tmp_path, source, "good")
    assert done.returncode == 0, done.stderr
    assert _failures_in(tmp_path, "good") == 2

    _edit_manifest(folder, lambda m: m.update(failure_entries=[], failures=0))  # the content hash unchanged
    source = _pack(folder, tmp_path / "tampered.tar.gz") if as_archive else folder
    verified = _cli("snapshot", "--verify", str(source), "--config", _config(tmp_path, "verify2"), "-q", cwd=tmp_path)
    assert verified.returncode == 1
    assert "failure_entries differ from what the manifest's failure_entries_hash covers" in verified.stdout + verified.stderr
    done = _imported(tmp_path, source, "tampered")
    assert done.returncode == 2 and "failure_entries differ" in done.stderr, done.stderr
    assert not (tmp_path / "into-tampered" / "cache.db").exists() or _failures_in(tmp_path, "tampered") == 0
    downloads = tmp_path / "downloads-frozen"
    with pytest.raises(ConfigError, match="failure_entries differ from what the manifest's failure_entries_hash covers"):
        build_frozen(settings_factory(mode="replay", frozen_caches=[str(source)], download_dir=str(downloads)))
    if as_archive:
        assert list((tmp_path / "downloads-tampered").iterdir()) == [] and list(downloads.iterdir()) == []


@pytest.mark.parametrize("as_archive", [False, True])
def test_a_snapshot_written_before_the_hash_still_verifies_and_imports(tmp_path: Path, as_archive: bool) -> None:
    folder = _snapshot_folder(tmp_path)
    # what 0.2.0 wrote: failure_entries, no failure_entries_hash
    _edit_manifest(folder, lambda m: (m.pop("failure_entries_hash"), m.update(created_by="stabletoolbench-mirror 0.2.0")))
    source = _pack(folder, tmp_path / "old.tar.gz") if as_archive else folder
    verified = _cli("snapshot", "--verify", str(source), "--config", _config(tmp_path, "verify"), "-q", cwd=tmp_path)
    assert verified.returncode == 0 and "OK: the snapshot matches its manifest" in verified.stdout, verified.stdout + verified.stderr
    done = _imported(tmp_path, source, "old")
    assert done.returncode == 0, done.stderr
    assert _failures_in(tmp_path, "old") == 2


@pytest.mark.parametrize("edit", [
    lambda m: m.pop("failure_entries_hash"),  # the field removed, the list kept
    lambda m: (m.pop("failure_entries_hash"), m.update(failure_entries=[], failures=0)),  # and the list emptied
    lambda m: (m.pop("failure_entries_hash"), m.pop("created_by")),  # and who wrote it
], ids=["hash-removed", "hash-removed-list-emptied", "hash-and-created-by-removed"])
@pytest.mark.parametrize("as_archive", [False, True])
def test_a_manifest_of_this_version_without_the_hash_is_refused_naming_the_field(
    settings_factory, tmp_path: Path, as_archive: bool, edit
) -> None:
    folder = _snapshot_folder(tmp_path)
    _edit_manifest(folder, edit)
    source = _pack(folder, tmp_path / "stripped.tar.gz") if as_archive else folder
    verified = _cli("snapshot", "--verify", str(source), "--config", _config(tmp_path, "verify"), "-q", cwd=tmp_path)
    assert verified.returncode == 1, verified.stdout + verified.stderr
    assert "has no failure_entries_hash" in verified.stdout + verified.stderr
    done = _imported(tmp_path, source, "stripped")
    assert done.returncode == 2 and "has no failure_entries_hash" in done.stderr, done.stderr
    assert not (tmp_path / "into-stripped" / "cache.db").exists() or _failures_in(tmp_path, "stripped") == 0
    with pytest.raises(ConfigError, match="has no failure_entries_hash"):
        build_frozen(settings_factory(mode="replay", frozen_caches=[str(source)], download_dir=str(tmp_path / "downloads-frozen")))
