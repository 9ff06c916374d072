"""Snapshot archives bounded before they are read: a member's size, the total and the member count.

Every archive here is a real ``.tar.gz`` built with :mod:`tarfile`; the large members are zeros
streamed into it, so the archive stays small while its headers say gigabytes.
"""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from stabletoolbench_mirror.config import ConfigError
from stabletoolbench_mirror.core.records import Record
from stabletoolbench_mirror.factory import build_frozen
from stabletoolbench_mirror.reporting.sources import collect
from stabletoolbench_mirror.reporting.tally import ReportError
from stabletoolbench_mirror.stores import DiskcacheStore
from stabletoolbench_mirror.upstream import archives
from stabletoolbench_mirror.upstream.archives import ArchiveLimits
from tests.helpers import paths
from tests.helpers.archives import add_member as _add
from tests.helpers.live import serve_folder, serve_http

GIB = 1 << 30
MANIFEST = json.dumps({"format": "stabletoolbench-mirror-snapshot", "format_version": 1, "content_hash": "sha256:" + "0" * 64}).encode()

#: run one CLI command as the child of a small wrapper and print its exit status, peak RSS (KiB) and wall seconds;
#: the child may map at most 4 GiB, so a regression fails with an error instead of taking the machine's memory
_MEASURED = """
import json, resource, subprocess, sys, time
def bounded():
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
started = time.monotonic()
done = subprocess.run(sys.argv[1:], capture_output=True, text=True, preexec_fn=bounded)
elapsed = time.monotonic() - started
used = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"rc": done.returncode, "stdout": done.stdout, "stderr": done.stderr, "elapsed_s": elapsed,
                  "cpu_s": used.ru_utime + used.ru_stime, "maxrss_kib": used.ru_maxrss}))
"""


def _archive(path: Path, members: list[tuple[str, int]]) -> Path:
    """A snapshot-like archive: a manifest, then ``(name, size)`` members of zeros."""
    with tarfile.open(path, "w:gz", compresslevel=1) as tar:
        _add(tar, "manifest.json", MANIFEST)
        for name, size in members:
            _add(tar, name, zeros=size)
    return path


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STM_")}
    env["PYTHONPATH"] = str(paths.REPO)
    return env


def _measured(*args: str, cwd: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", _MEASURED, sys.executable, "-m", "stabletoolbench_mirror", *args],
                          cwd=cwd, env=_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "stabletoolbench_mirror", *args], cwd=cwd, env=_env(), capture_output=True,
                          text=True, timeout=300)


def _left_in(download_dir: Path) -> list[str]:
    return sorted(str(p.relative_to(download_dir)) for p in download_dir.rglob("*")) if download_dir.exists() else []


def test_cache_import_refuses_a_1_gib_member_from_its_header_in_little_memory(tmp_path: Path) -> None:
    archive = _archive(tmp_path / "bomb.tar.gz", [("Data/big_for_Data/lookup.json", GIB)])
    assert archive.stat().st_size < 8 * 1024 * 1024  # small on disk, 1 GiB unpacked
    downloads = tmp_path / "downloads"
    config = tmp_path / "c.yml"
    config.write_text(json.dumps({"download_dir": str(downloads)}))
    result = _measured("cache", "import", str(archive), "--config", str(config), "--store-path", str(tmp_path / "store"), "-q",
                       cwd=tmp_path)
    assert result["rc"] == 2, result
    assert "Data/big_for_Data/lookup.json unpacks to 1,024.0 MB, over frozen_max_file_mb (512 MB)" in result["stderr"]
    assert "raise frozen_max_file_mb" in result["stderr"]
    assert result["maxrss_kib"] <= 300 * 1024, result
    assert result["cpu_s"] <= 5, result  # CPU, not wall time: a busy machine slows the command, it does not make it work more
    assert _left_in(downloads) == []
    print(f"\ncache import of the 1 GiB-member archive: refused, peak RSS {result['maxrss_kib'] / 1024:.0f} MB, "
          f"{result['cpu_s']:.2f} s of CPU, {result['elapsed_s']:.2f} s")


def test_an_archive_of_100000_members_is_refused_naming_the_count_key(tmp_path: Path) -> None:
    archive = tmp_path / "junk.tar.gz"
    with tarfile.open(archive, "w:gz", compresslevel=1) as tar:
        _add(tar, "manifest.json", MANIFEST)
        for i in range(100_000):
            _add(tar, f"Junk/j_for_Junk/{i}.txt", b"x")
    downloads = tmp_path / "downloads"
    config = tmp_path / "c.yml"
    config.write_text(json.dumps({"download_dir": str(downloads)}))
    result = _measured("cache", "import", str(archive), "--config", str(config), "--store-path", str(tmp_path / "store"), "-q",
                       cwd=tmp_path)
    assert result["rc"] == 2, result
    assert "more than 100,000 members, over archive_max_members (100,000)" in result["stderr"]
    assert "raise archive_max_members" in result["stderr"]
    # headers read through gzip's own buffer: about 2.5 s of CPU (tarfile's r|gz copied its buffer for every header: 19 s)
    assert result["cpu_s"] <= 10, result
    assert _left_in(downloads) == []
    print(f"\ncache import of the 100,000-member archive: refused, peak RSS {result['maxrss_kib'] / 1024:.0f} MB, "
          f"{result['elapsed_s']:.2f} s")


def test_a_2_gib_non_cache_member_is_refused_and_nothing_is_left(settings_factory, tmp_path: Path) -> None:
    archive = _archive(tmp_path / "big.tar.gz", [("notes/blob.bin", 2 * GIB)])
    downloads = tmp_path / "downloads"
    with pytest.raises(ConfigError, match=r"notes/blob.bin unpacks to 2,048.0 MB, over frozen_max_file_mb \(512 MB\)"):
        build_frozen(settings_factory(mode="replay", frozen_caches=[str(archive)], download_dir=str(downloads)))
    assert _left_in(downloads) == []


def test_the_total_unpacked_size_is_bounded(settings_factory, tmp_path: Path) -> None:
    archive = _archive(tmp_path / "many.tar.gz", [(f"notes/{i}.bin", 400 * 1024) for i in range(3)])
    downloads = tmp_path / "downloads"
    with pytest.raises(ConfigError, match=r"the members unpack to more than 1 MB, over archive_max_total_mb: not unpacked; "
                                          r"raise archive_max_total_mb"):
        build_frozen(settings_factory(mode="replay", frozen_caches=[str(archive)], download_dir=str(downloads), archive_max_total_mb=1))
    assert _left_in(downloads) == []
    config = tmp_path / "c.yml"
    config.write_text(json.dumps({"download_dir": str(downloads), "archive_max_total_mb": 1}))
    imported = _cli("cache", "import", str(archive), "--config", str(config), "--store-path", str(tmp_path / "store"), "-q", cwd=tmp_path)
    assert imported.returncode == 2 and "over archive_max_total_mb" in imported.stderr, imported.stderr
    assert _left_in(downloads) == []


def _snapshot(tmp_path: Path) -> Path:
    """A real snapshot archive (3 answers) written by ``snapshot OUT.tar.gz``."""
    store_path = tmp_path / "store"
    with DiskcacheStore(store_path) as store:
        for n in range(3):
            store.add(Record.from_answer("Data/t_for_Data/lookup", json.dumps({"n": n}), {"error": "", "response": f"r{n}"}, "real", "r"), None)
    out = tmp_path / "www" / "snap.tar.gz"
    made = _cli("snapshot", str(out), "--store-path", str(store_path), "-q", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    return out


@pytest.fixture
def files_server(tmp_path: Path) -> Iterator[str]:
    """A real HTTP server on 127.0.0.1 serving ``tmp_path/www``."""
    (tmp_path / "www").mkdir(exist_ok=True)
    with serve_folder(tmp_path / "www") as url:
        yield url


def test_the_limits_apply_to_urls_and_snapshot_verify_and_a_refused_download_is_removed(
    files_server: str, settings_factory, tmp_path: Path
) -> None:
    _snapshot(tmp_path)
    downloads = tmp_path / "downloads"
    url = f"{files_server}/snap.tar.gz"
    with pytest.raises(ConfigError, match="over archive_max_members \\(3\\)"):
        build_frozen(settings_factory(mode="replay", frozen_caches=[url], download_dir=str(downloads), archive_max_members=3))
    assert _left_in(downloads) == []  # the download too
    build_frozen(settings_factory(mode="replay", frozen_caches=[url], download_dir=str(downloads)))  # within the defaults: served
    assert _left_in(downloads) != []
    config = tmp_path / "c.yml"
    config.write_text(json.dumps({"download_dir": str(tmp_path / "other"), "archive_max_members": 3}))
    refused = _cli("snapshot", "--verify", str(tmp_path / "www" / "snap.tar.gz"), "--config", str(config), "-q", cwd=tmp_path)
    assert refused.returncode == 1 and "raise archive_max_members" in refused.stderr, refused.stderr
    assert _left_in(tmp_path / "other") == []
    diffed = _cli("cache", "diff", str(tmp_path / "www" / "snap.tar.gz"), str(tmp_path / "store"), "--config", str(config), "-q",
                  cwd=tmp_path)
    assert diffed.returncode == 2 and "raise archive_max_members" in diffed.stderr, diffed.stderr
    with pytest.raises(ReportError, match="raise archive_max_members"):
        collect(str(tmp_path / "www" / "snap.tar.gz"), settings_factory(download_dir=str(tmp_path / "other"), archive_max_members=3))
    assert _left_in(tmp_path / "other") == []
    config.write_text(json.dumps({"download_dir": str(tmp_path / "other")}))
    verified = _cli("snapshot", "--verify", str(tmp_path / "www" / "snap.tar.gz"), "--config", str(config), "-q", cwd=tmp_path)
    assert verified.returncode == 0 and "OK: the snapshot matches its manifest" in verified.stdout, verified.stderr


def test_the_default_limits_are_the_settings_defaults(settings_factory) -> None:
    assert ArchiveLimits() == ArchiveLimits.of(settings_factory())


# -- downloads ------------------------------------------------------------------------------------


class _Slow(http.server.BaseHTTPRequestHandler):
    """``/big``: says 64 MB; ``/trickle``: 1 byte every 0.2 s; ``/steady``: 64 KB every 0.05 s, no end; ``/ftp``: a redirect to ftp."""

    def do_GET(self) -> None:  # noqa: N802 - the handler's name
        if self.path == "/ftp":
            self.send_response(302)
            self.send_header("Location", "ftp://127.0.0.1/snap.tar.gz")
            self.end_headers()
            return
        self.send_response(200)
        if self.path == "/big":
            self.send_header("Content-Length", str(64 << 20))
        self.end_headers()
        try:
            for _ in range(100 if self.path == "/trickle" else 400):  # about 20 s at most
                if self.path == "/trickle":
                    self.wfile.write(b"x")
                    self.wfile.flush()
                    threading.Event().wait(0.2)
                elif self.path == "/steady":
                    self.wfile.write(bytes(64 * 1024))
                    self.wfile.flush()
                    threading.Event().wait(0.05)
                else:
                    self.wfile.write(bytes(1 << 20))
        except OSError:
            pass

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def slow_server() -> Iterator[str]:
    with serve_http(_Slow) as url:
        yield url


@pytest.mark.parametrize("path, settings, refusal", [
    ("/big", {"download_max_mb": 16}, r"64.0 MB, over download_max_mb \(16 MB\); raise download_max_mb"),
    ("/trickle", {}, r"slower than 1 KB/s over 1 s: the download has stalled"),  # the low-speed limit, made 1 s below
    ("/steady", {"download_deadline_s": 1}, r"not done within download_deadline_s \(1 s\)"),
    ("/steady", {"download_max_mb": 1}, r"over download_max_mb \(1 MB\)"),  # no Content-Length: counted as it arrives
    ("/ftp", {}, r"redirects to ftp://127.0.0.1/snap.tar.gz: only http\(s\):// is followed"),
])
def test_downloads_are_bounded_and_nothing_partial_is_kept(slow_server: str, settings_factory, tmp_path: Path, path: str,
                                                          settings: dict, refusal: str, monkeypatch) -> None:
    monkeypatch.setattr(archives, "DOWNLOAD_MIN_BYTES_PER_S", 1024)  # 1 KB/s over 1 s: the others stay far above it
    monkeypatch.setattr(archives, "DOWNLOAD_LOW_SPEED_S", 1.0)
    downloads = tmp_path / "downloads"
    with pytest.raises(ConfigError, match=refusal):
        build_frozen(settings_factory(mode="replay", frozen_caches=[f"{slow_server}{path}"], download_dir=str(downloads), **settings))
    assert _left_in(downloads) == []
