"""`stabletoolbench-mirror cache import/export/stats`, run as the real console script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from stabletoolbench_mirror.stores import DiskcacheStore
from stabletoolbench_mirror.upstream_layout import iter_cache_files, read_cache_file


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
