"""The bulk paths on a generated tree (``benchmarks/make_tree.py``): import, export, snapshot, verify, check.

Small sizes only; ``benchmarks/scale.py`` measures the same commands at 10k, 165k and 1M entries.
"""

from __future__ import annotations

import filecmp
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stabletoolbench_mirror.core.keys import canonical_from_upstream_key
from stabletoolbench_mirror.stores import DiskcacheStore
from stabletoolbench_mirror.upstream.layout import iter_cache_files, read_cache_file
from tests.helpers import paths
from tests.helpers.processes import ServeProcess, popen_as_from_a_terminal

REPO = paths.REPO


def run(*args: str, cwd: Path, ok: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STM_")}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run(list(args), cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode in ok, (proc.returncode, proc.stdout[-3000:], proc.stderr[-3000:])
    return proc


def make_tree(out: Path, *extra: str) -> Path:
    run(sys.executable, str(REPO / "benchmarks" / "make_tree.py"), str(out), "--entries", "600", "--files", "25",
        "--samples", "200", "--check-samples", "300", "-q", *extra, cwd=out.parent)
    return out


def cli(*args: str, cwd: Path, ok: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess:
    return run(sys.executable, "-m", "stabletoolbench_mirror", *args, cwd=cwd, ok=ok)


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tree(tmp_path_factory.mktemp("tree") / "t")


def entries(root: Path) -> dict[tuple[str, str], object]:
    return {(ns, key): answer for ns, path in iter_cache_files(root) for key, answer in read_cache_file(path).items()}


def test_make_tree_is_deterministic_and_realistic(tree: Path, tmp_path: Path) -> None:
    again = make_tree(tmp_path / "again")
    compare = filecmp.dircmp(tree / "tool_response_cache", again / "tool_response_cache")
    assert not compare.diff_files and not compare.left_only and not compare.right_only
    for name in ("first_pass", "hits", "misses", "calls"):
        assert (tree / "payloads" / f"{name}.jsonl").read_bytes() == (again / "payloads" / f"{name}.jsonl").read_bytes()
    data = entries(tree / "tool_response_cache")
    assert len(data) == 600
    per_file: dict[str, int] = {}
    for ns, _ in data:
        per_file[ns] = per_file.get(ns, 0) + 1
    counts = sorted(per_file.values(), reverse=True)
    assert len(counts) == 25 and counts[0] > 10 * counts[len(counts) // 2]  # skewed: a few large, most small
    sizes = sorted(len(a["response"]) for a in data.values())  # type: ignore[index]
    assert sizes[0] < 200 and 300 < sizes[len(sizes) // 2] < 3000 and sizes[-1] <= 50_000
    tools = list((tree / "tools").rglob("*.json"))
    assert tools and all("api_list" in json.loads(p.read_text()) for p in tools)
    other = make_tree(tmp_path / "other", "--seed", "2")
    assert entries(other / "tool_response_cache") != data


def test_import_export_snapshot_verify_round_trip(tree: Path, tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    imported = cli("cache", "import", str(tree / "tool_response_cache"), "--store-path", store, "-q", cwd=tmp_path)
    assert "added:            600" in imported.stdout and "entries/s" in imported.stdout
    stats = json.loads(cli("cache", "stats", "--json", "--store-path", store, cwd=tmp_path).stdout)
    assert stats["entries"] == 600 and stats["counted_by"] == "counters" and stats["apis"] == 25
    exported = cli("cache", "export", str(tmp_path / "out"), "--store-path", store, "-q", cwd=tmp_path)
    assert "entries written:  600" in exported.stdout and "entries/s" in exported.stdout
    assert entries(tmp_path / "out") == entries(tree / "tool_response_cache")
    snap = cli("snapshot", str(tmp_path / "snap"), "--store-path", store, "-q", cwd=tmp_path)
    assert "entries/s" in snap.stdout
    verified = cli("snapshot", "--verify", str(tmp_path / "snap"), "-q", cwd=tmp_path)
    assert "OK" in verified.stdout and "entries/s" in verified.stdout


def test_reader_processes_import_exactly_what_one_process_imports(tree: Path, tmp_path: Path) -> None:
    # the generated tree, plus a file that cannot be served and upstream's saved failure answer
    root = tmp_path / "tree"
    shutil.copytree(tree / "tool_response_cache", root)
    bad = root / "Data" / "broken_for_Data"
    bad.mkdir(parents=True)
    (bad / "cut.json").write_text('{"{\'q\': 1}": {"error": "", "resp')
    (bad / "failed.json").write_text(json.dumps({"{'q': 2}": {"error": "Failed to generate fake response", "response": ""}}))
    outputs, stores = [], []
    for jobs in ("0", "2"):
        store = tmp_path / f"store-{jobs}"
        proc = cli("cache", "import", str(root), "--store-path", str(store), "--jobs", jobs, "-q", cwd=tmp_path, ok=(1,))
        outputs.append([line for line in proc.stdout.splitlines() if not line.startswith("time:")])
        with DiskcacheStore(store) as opened:
            stores.append(sorted((r.api, r.key, r.body, r.source, r.origin, r.outcome, r.reason) for r in opened))
            assert len(opened) == 601
    assert outputs[0] == outputs[1] and "added:            601" in outputs[1] and "unreadable files: 1" in outputs[1]
    assert any("cut.json" in line for line in outputs[1])
    assert stores[0] == stores[1] and len(stores[1]) == 601
    assert sum(outcome == "failure" for *_, outcome, _reason in stores[1]) == 1
    # every record is found by its canonical key too (the pointers came from the readers)
    with DiskcacheStore(tmp_path / "store-2") as opened:
        for api, key, body, *_ in stores[1]:
            canonical = canonical_from_upstream_key(key)
            assert canonical is not None and opened.get_canonical(api, canonical).body == body  # type: ignore[union-attr]


def test_check_with_concurrency_reports_like_one_at_a_time(tree: Path, tmp_path: Path) -> None:
    calls = [json.loads(line) for line in (tree / "payloads" / "calls.jsonl").read_text().splitlines()]
    calls[17]["observed"] = {"error": "", "response": "not what was recorded"}
    calls[250]["observed"] = {"error": "", "response": "nor this"}
    path = tmp_path / "calls.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in calls))
    config = {"mode": "replay", "store": {"kind": "diskcache", "path": str(tmp_path / "store")},
              "frozen_caches": [str(tree / "tool_response_cache")]}
    reports = []
    with ServeProcess(tmp_path, config) as server:
        for concurrency in ("1", "8"):
            out = tmp_path / f"report-{concurrency}.json"
            proc = cli("check", "--calls", str(path), "--url", server.url, "--concurrency", concurrency, "-q",
                       "--json", str(out), cwd=tmp_path, ok=(1,))
            assert "300 calls: 298 identical" in proc.stdout and "calls/s" in proc.stdout
            report = json.loads(out.read_text())
            report.pop("seconds")
            reports.append(report)
    assert reports[0] == reports[1]
    assert [m["location"].rsplit(":", 1)[1] for m in reports[1]["mismatches"]] == ["18", "251"]


@pytest.fixture(scope="module")
def big_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tree large enough that an import with readers runs for seconds."""
    return make_tree(tmp_path_factory.mktemp("big") / "t", "--entries", "40000", "--files", "400", "--check-samples", "10")


def _readers(pid: int) -> list[int]:
    """The reader processes (``multiprocessing`` spawn children) of process ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid and b"spawn_main" in cmdline:
            found.append(int(entry.name))
    return found


@pytest.mark.parametrize("stop", ["ctrl_c", "kill_reader"])
def test_an_import_stopped_midway_keeps_what_it_wrote_and_the_rerun_completes(stop: str, big_tree: Path, tmp_path: Path) -> None:
    """Ctrl-C (to the whole process group) stops an import with readers at once; a reader killed (the
    kernel's out-of-memory killer) stops it with an error naming the fix.  The rerun adds exactly the rest."""
    store = tmp_path / "store"
    env = {k: v for k, v in os.environ.items() if not k.startswith("STM_")}
    env["PYTHONPATH"] = str(REPO)
    proc = popen_as_from_a_terminal([sys.executable, "-m", "stabletoolbench_mirror", "cache", "import", str(big_tree / "tool_response_cache"),
                                     "--store-path", str(store), "--jobs", "2"], cwd=tmp_path, env=env, start_new_session=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60

    def running() -> bool:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
        return True

    while not (store / "cache.db").exists() and running():
        pass
    with DiskcacheStore(store) as watched:
        while watched.counts().entries < 1000 and running():  # type: ignore[union-attr]
            pass
    if stop == "ctrl_c":
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C reaches the whole group: the writer and its readers
        _out, err = proc.communicate(timeout=30)
        assert proc.returncode == 130, err[-2000:]
        assert "stopping: the records read so far are written" in err and "Traceback" not in err
        assert "interrupted: the entries written so far are kept" in err
    else:
        readers = _readers(proc.pid)
        assert len(readers) == 2
        os.kill(readers[0], signal.SIGKILL)
        _out, err = proc.communicate(timeout=30)
        assert proc.returncode == 1, err[-2000:]
        assert "error: a reader process died (out of memory?); what was written so far is kept" in err and "--jobs 0" in err
    with DiskcacheStore(store) as opened:
        kept = len(opened)
    assert 1000 <= kept < 40000
    rerun = cli("cache", "import", str(big_tree / "tool_response_cache"), "--store-path", str(store), "-q", cwd=tmp_path)
    assert f"already present:  {kept}" in rerun.stdout and f"added:            {40000 - kept}" in rerun.stdout
