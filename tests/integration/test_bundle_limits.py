"""``score --replay`` and ``report`` bounded on disk: an endless URL and an archive bomb stopped at their caps, nothing
left behind (no ``.part``, no half-unpacked folder, no temporary ``stm-score-*`` work folder), SIGTERM included; a
tampered ``.tar.gz`` bundle exits 1 as a tampered folder does.

Real processes (the command line, run as a user runs it), a real HTTP server on 127.0.0.1 streaming without end, real
archives made with :mod:`tarfile` (the large member is zeros streamed into it: small on disk, 200 MB unpacked).
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import signal
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stabletoolbench_mirror.scoring import bundle
from stabletoolbench_mirror.scoring.bundle import open_bundle
from stabletoolbench_mirror.upstream.archive_limits import ArchiveLimits
from stabletoolbench_mirror.upstream.archives import pack
from tests.helpers.archives import add_member as _add
from tests.helpers.live import serve_http
from tests.helpers.paths import REPO
from tests.integration.test_score_bundle import make_bundle

MB = 1 << 20
ZEROS = 200 * MB
ENDLESS_FOR_S = 120.0  # the endless answers stop after this, whatever the client does


def _zeros_sha256(size: int) -> str:
    digest, chunk = hashlib.sha256(), bytes(MB)
    for _ in range(size // MB):
        digest.update(chunk)
    return digest.hexdigest()


def sealed_bomb(path: Path) -> Path:
    """A sealed score bundle as ``.tar.gz`` whose one answer file is 200 MB of zeros: about 200 KB on disk."""
    run = json.dumps({"label": "run", "groups": ["G1_instruction"]}).encode()
    answer = "answers/G1_instruction/1_CoT@1.json"
    digests = {"run.json": hashlib.sha256(run).hexdigest(), answer: _zeros_sha256(ZEROS)}
    seal = {"format": bundle.FORMAT, "format_version": bundle.FORMAT_VERSION, "content_hash": bundle.content_hash(digests),
            "files": digests}
    with tarfile.open(path, "w:gz", compresslevel=9) as tar:
        _add(tar, "bundle.json", json.dumps(seal).encode())
        _add(tar, "run.json", run)
        _add(tar, answer, zeros=ZEROS)
    return path


class _Endless(http.server.BaseHTTPRequestHandler):
    """``/fast.tar.gz``: zeros as fast as they go, no Content-Length, no end; ``/slow.tar.gz``: 64 KB every 20 ms.

    Either stops after :data:`ENDLESS_FOR_S` (a test's bound), or when the client goes away."""

    sent: list[int] = []

    def do_GET(self) -> None:  # noqa: N802 - the handler's name
        self.send_response(200)
        self.end_headers()
        chunk, slow, sent = bytes(64 * 1024), self.path.startswith("/slow"), 0
        deadline = time.monotonic() + ENDLESS_FOR_S
        try:
            while time.monotonic() < deadline:
                self.wfile.write(chunk)
                sent += len(chunk)
                if slow:
                    self.wfile.flush()
                    threading.Event().wait(0.02)
        except OSError:
            pass
        finally:
            self.sent.append(sent)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def endless() -> Iterator[str]:
    _Endless.sent = []
    with serve_http(_Endless) as url:
        yield url


def _env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STM_")}
    env["PYTHONPATH"] = str(REPO)
    env["TMPDIR"] = str(tmp)  # where score --replay makes its temporary work folder
    return env


def cli(*args: str, cwd: Path, tmp: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stabletoolbench_mirror", *args], cwd=cwd, env=_env(tmp), capture_output=True,
                          text=True, timeout=300)


def checkout(root: Path) -> Path:
    """The files ``score`` looks for in a StableToolBench checkout (their scripts never run here: the bundle is refused first)."""
    from stabletoolbench_mirror.scoring.checkout import SCRIPTS, TOOLS_FOLDERS

    for relative in SCRIPTS.values():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text("raise SystemExit('not run in these tests')\n")
    (root / TOOLS_FOLDERS[0]).mkdir(parents=True)
    return root


def left_in(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() else []


def _downloading(*folders: Path) -> bool:
    """Whether a ``.part`` file with bytes in it is under one of ``folders`` (each may come and go meanwhile)."""
    for folder in folders:
        try:
            if any(p.stat().st_size > 0 for p in folder.rglob(".part*")):
                return True
        except OSError:
            pass
    return False


@pytest.fixture
def where(tmp_path: Path) -> dict[str, Path]:
    """A checkout, a temporary folder (TMPDIR), a download folder (report's config) and that config."""
    paths = {"checkout": checkout(tmp_path / "StableToolBench"), "tmp": tmp_path / "tmp", "downloads": tmp_path / "downloads",
             "config": tmp_path / "c.yml"}
    paths["tmp"].mkdir()
    paths["config"].write_text(json.dumps({"download_dir": str(paths["downloads"]), "store": {"path": str(tmp_path / "store")}}))
    return paths


def replay(spec: str, where: dict[str, Path], *flags: str) -> subprocess.CompletedProcess[str]:
    return cli("score", "--replay", spec, "--stabletoolbench", str(where["checkout"]), "-q", *flags, cwd=where["tmp"].parent,
               tmp=where["tmp"])


def report(spec: str, where: dict[str, Path], *flags: str) -> subprocess.CompletedProcess[str]:
    return cli("report", spec, "--json", "--config", str(where["config"]), "-q", *flags, cwd=where["tmp"].parent, tmp=where["tmp"])


def test_an_endless_url_is_stopped_at_max_download_mb_and_nothing_is_left(endless: str, where: dict[str, Path]) -> None:
    url = f"{endless}/fast.tar.gz#sha256={'0' * 64}"
    replayed = replay(url, where, "--max-download-mb", "8")
    assert replayed.returncode == 2, replayed.stderr
    assert "over --max-download-mb (8 MB); raise --max-download-mb to download it" in replayed.stderr
    assert left_in(where["tmp"]) == []  # no stm-score-* work folder, no .part in it
    reported = report(f"{endless}/fast.tar.gz", where, "--max-download-mb", "8")
    assert reported.returncode == 2 and reported.stdout == "", reported.stderr
    assert "over --max-download-mb (8 MB)" in reported.stderr
    assert left_in(where["downloads"]) == [] and left_in(where["tmp"]) == []
    deadline = time.monotonic() + 30  # the server's threads see the client gone at their next write
    while len(_Endless.sent) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(_Endless.sent) == 2 and all(sent < 64 * MB for sent in _Endless.sent), _Endless.sent  # stopped, not read to the end


def test_the_default_caps_are_said_in_help(where: dict[str, Path]) -> None:
    for command in ("score", "report"):
        shown = cli(command, "--help", cwd=where["tmp"].parent, tmp=where["tmp"])
        assert shown.returncode == 0
        text = " ".join(shown.stdout.split())
        assert "--max-unpacked-mb" in text and "(default: 4096, 4 GiB)" in text, text
        assert "--max-download-mb" in text and "(default: 2048, 2 GiB)" in text, text
        assert "--max-ratio" in text


def test_a_200_kb_to_200_mb_bundle_is_refused_by_its_ratio_and_by_max_unpacked_mb_and_nothing_is_left(
        where: dict[str, Path], tmp_path: Path) -> None:
    bomb = sealed_bomb(tmp_path / "bomb.tar.gz")
    assert bomb.stat().st_size < MB
    replayed = replay(str(bomb), where)  # the defaults: 4 GiB unpacked, but 100 times the archive's size at most
    assert replayed.returncode == 2, replayed.stderr
    assert "unpacks to more than 100 times its size" in replayed.stderr and "raise --max-ratio to unpack it" in replayed.stderr
    assert left_in(where["tmp"]) == []
    reported = report(str(bomb), where, "--max-ratio", "100000", "--max-unpacked-mb", "50")
    assert reported.returncode == 2, reported.stderr
    assert ("answers/G1_instruction/1_CoT@1.json unpacks to 200.0 MB, over --max-unpacked-mb (50 MB): not unpacked; "
            "raise --max-unpacked-mb to unpack it") in reported.stderr
    assert left_in(where["downloads"]) == [] and left_in(where["tmp"]) == []
    # the same bundle, the caps raised: opened, its seal holds (what refused it was the caps)
    opened = open_bundle(str(bomb), tmp_path / "opened", limits=ArchiveLimits(max_member_bytes=300 * MB, max_ratio=10_000))
    assert opened.label == "run" and opened.path("answers/G1_instruction/1_CoT@1.json").stat().st_size == ZEROS


@pytest.mark.parametrize("command", ["report", "score"])
def test_sigterm_during_a_download_leaves_no_part_file(endless: str, where: dict[str, Path], command: str) -> None:
    url = f"{endless}/slow.tar.gz"
    args = (["report", url, "--json", "--config", str(where["config"])] if command == "report" else
            ["score", "--replay", f"{url}#sha256={'0' * 64}", "--stabletoolbench", str(where["checkout"])])
    proc = subprocess.Popen([sys.executable, "-m", "stabletoolbench_mirror", *args, "-q"], cwd=where["tmp"].parent,
                            env=_env(where["tmp"]), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not _downloading(where["downloads"], where["tmp"]):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no download started in 60 s"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "terminated (SIGTERM)" in err and "Traceback" not in err
    assert left_in(where["downloads"]) == [] and left_in(where["tmp"]) == []  # no .part, no stm-score-* folder


def test_a_tampered_bundle_exits_1_as_a_folder_or_an_archive_and_no_work_folder_is_left(where: dict[str, Path], tmp_path: Path) -> None:
    root = make_bundle(tmp_path / "bundle")
    (root / "answers" / "G1_instruction" / "1_CoT@1.json").write_text('{"answer_generation": {"changed": 1}}')
    pack(root, tmp_path / "tampered.tar.gz")
    for spec, said in ((str(root), "differ from the bundle's seal"), (str(tmp_path / "tampered.tar.gz"), "do not match the seal")):
        replayed = replay(spec, where)
        assert replayed.returncode == 1, replayed.stderr
        assert said in replayed.stderr and "answers/G1_instruction/1_CoT@1.json: changed since the bundle was sealed" in replayed.stderr
        assert left_in(where["tmp"]) == []  # the temporary stm-score-* folder is removed
    reported = report(str(tmp_path / "tampered.tar.gz"), where)
    assert reported.returncode == 1, reported.stderr
    assert "CHANGED" in reported.stderr or json.loads(reported.stdout)["problems"], reported.stderr


def test_frozen_caches_refuse_a_bomb_naming_archive_max_ratio(settings_factory, tmp_path: Path, monkeypatch) -> None:
    from stabletoolbench_mirror.config import ConfigError
    from stabletoolbench_mirror.factory import build_frozen
    from stabletoolbench_mirror.upstream import archive_limits

    monkeypatch.setattr(archive_limits, "RATIO_FLOOR_BYTES", MB)  # 1 MiB: a 4 MB member of zeros is over it
    archive = tmp_path / "bomb.tar.gz"
    with tarfile.open(archive, "w:gz", compresslevel=9) as tar:
        _add(tar, "manifest.json", json.dumps({"content_hash": "sha256:" + "0" * 64}).encode())
        _add(tar, "Data/big_for_Data/lookup.json", zeros=4 * MB)
    downloads = tmp_path / "downloads"
    with pytest.raises(ConfigError, match=r"unpacks to more than 100 times its size .* over archive_max_ratio \(100\): .*"
                                          r"raise archive_max_ratio to unpack it"):
        build_frozen(settings_factory(mode="replay", frozen_caches=[str(archive)], download_dir=str(downloads)))
    assert left_in(downloads) == []
    with pytest.raises(ConfigError, match=r"bomb.tar.gz: manifest.json: "):  # the ratio raised: unpacked, then its made-up manifest refused
        build_frozen(settings_factory(mode="replay", frozen_caches=[str(archive)], download_dir=str(downloads), archive_max_ratio=1e6))
    assert left_in(downloads) == []
