"""One-file snapshots: a snapshot as ``OUT.tar.gz``, and fetching one (a file or an ``http(s)://`` URL).

``snapshot OUT.tar.gz`` packs the snapshot's tree and ``manifest.json`` into one archive
(:func:`pack`).  ``frozen_caches`` entries and ``cache import`` accept such an archive, or a URL to
one, optionally ending in ``#sha256=<hex>`` (the archive file's SHA-256).  :func:`local_tree` then

1. downloads a URL once into ``download_dir`` with ``requests`` (redirects only to ``http(s)://``; a
   progress bar; the file's SHA-256 checked against the URL's as it arrives; a partial download is never
   used; bytes stored as sent, read as they arrive so that the overall deadline, the low-speed limit and
   the size bound are checked chunk by chunk);
2. reads the archive's tar headers, without unpacking anything, and refuses it (naming the key to
   raise) when a member is larger than ``frozen_max_file_mb``, the members together larger than
   ``archive_max_total_mb`` or more than ``archive_max_members`` (:class:`ArchiveLimits`); a tar member's
   data is exactly its header's size, so these are the bytes that would be written;
3. unpacks the archive into ``download_dir`` safely: only folders and regular files, none outside
   the target (no absolute paths, no ``..``, no links or devices); both reads count the unpacked bytes
   as they stream by against the bytes of the archive read so far, and refuse an archive bomb (more than
   ``archive_max_ratio`` times as many, once past :data:`RATIO_FLOOR_BYTES`) before it is written;
4. recomputes the tree's content hash and compares it with the manifest's; a mismatch is an
   :class:`ArchiveError` naming both hashes, and the unpacked copy is removed.

Whatever was unpacked (or, for a URL, downloaded) for a refused archive is removed from ``download_dir``; so is a
partial download or unpack that ends otherwise (an error, Ctrl-C, or SIGTERM, which the command line turns into an
exception so that these ``finally`` blocks run).  Each refusal names what to raise: the settings' key, or a command's
flag (``score`` and ``report`` give their own, :class:`LimitNames`).

A second start uses the local copies: the download is kept, and the unpacked folder carries a
marker naming the archive it came from (size, modification time, SHA-256), so it is neither
unpacked nor hashed again while the archive is unchanged.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tarfile
import tempfile
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import requests
import urllib3

from stabletoolbench_mirror.core.progress import progress_bar
from stabletoolbench_mirror.upstream.archive_limits import (
    ArchiveChanged,
    ArchiveError,
    ArchiveLimits,
    LimitNames,
    check_headers,
    member_kind,
    stream,
)
from stabletoolbench_mirror.upstream.content_hash import ContentHash
from stabletoolbench_mirror.upstream.failures import MANIFEST_NAME, failure_entries_problem
from stabletoolbench_mirror.upstream.layout import iter_cache_files, read_cache_file

if TYPE_CHECKING:
    from stabletoolbench_mirror.config import Settings

__all__ = ["ArchiveChanged", "ArchiveError", "ArchiveLimits", "LimitNames"]  # their home is archive_limits; read here by every caller

ARCHIVE_SUFFIXES = (".tar.gz", ".tgz")
#: the file in an unpacked folder naming the archive it was unpacked from (and that it was checked)
MARKER = ".stm-unpacked.json"
_CHUNK = 1 << 20
_MB = 1024 * 1024
DOWNLOAD_MIN_BYTES_PER_S = 10 * 1024  # a download slower than this over DOWNLOAD_LOW_SPEED_S has stalled: it is given up
DOWNLOAD_LOW_SPEED_S = 60.0  # the window that speed is measured over, and the longest wait for one read


def is_url(spec: str) -> bool:
    return spec.startswith(("http://", "https://"))


def is_archive(spec: str) -> bool:
    """Whether a ``frozen_caches`` entry or ``cache import`` argument names an archive (a path or a URL)."""
    location = split_spec(spec)[0]
    return is_url(location) or location.endswith(ARCHIVE_SUFFIXES)


def split_spec(spec: str) -> tuple[str, str | None]:
    """``(location, sha256 or None)`` of ``<location>[#sha256=<hex>]``."""
    location, _, fragment = spec.partition("#")
    if not fragment:
        return location, None
    name, _, value = fragment.partition("=")
    value = value.strip().lower()
    if name != "sha256" or len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
        raise ArchiveError(f"{spec}: the part after '#' must be sha256=<64 hex digits> (the archive file's SHA-256)")
    return location, value


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _mismatch(what: str, expected: str, actual: str) -> ArchiveError:
    return ArchiveError(f"{what}: SHA-256 {actual} does not match the expected {expected}: the file is not the one published; not used")


# -- fetching ---------------------------------------------------------------------------------------


class _HttpOnlyRedirects(requests.Session):
    """A session that follows redirects only to ``http(s)://``."""

    def get_redirect_target(self, resp: requests.Response) -> str | None:
        target = super().get_redirect_target(resp)
        if target is not None and not is_url(new := urllib.parse.urljoin(resp.url, target)):
            raise ArchiveError(f"{resp.url} redirects to {new}: only http(s):// is followed; not downloaded")
        return target


class _Pace:
    """A download's overall deadline, low-speed limit and size limit, checked as each chunk arrives."""

    def __init__(self, url: str, limits: ArchiveLimits) -> None:
        self.url, self.limits = url, limits
        self.started = self.window_start = time.monotonic()
        self.size = self.window_bytes = 0

    def read_timeout(self) -> float:
        """The longest one read may wait: the low-speed window, never past the deadline."""
        return max(0.1, min(DOWNLOAD_LOW_SPEED_S, self.started + self.limits.download_deadline_s - time.monotonic()))

    def check_length(self, length: int | None) -> None:
        if length is not None and length > self.limits.download_max_bytes:
            raise self._over(length)

    def arrived(self, n: int) -> None:
        limits, now = self.limits, time.monotonic()
        self.size += n
        self.window_bytes += n
        if self.size > limits.download_max_bytes:
            raise self._over(self.size)
        if now - self.started > limits.download_deadline_s:
            raise ArchiveError(f"cannot download {self.url}: not done within {limits.names.deadline} ({limits.download_deadline_s:g} s); "
                               f"raise {limits.names.deadline} for a slow link")
        if now - self.window_start >= DOWNLOAD_LOW_SPEED_S:
            if self.window_bytes < DOWNLOAD_MIN_BYTES_PER_S * (now - self.window_start):
                raise ArchiveError(f"cannot download {self.url}: slower than {DOWNLOAD_MIN_BYTES_PER_S / 1024:g} KB/s "
                                   f"over {DOWNLOAD_LOW_SPEED_S:g} s: the download has stalled")
            self.window_start, self.window_bytes = now, 0

    def _over(self, size: int) -> ArchiveError:
        name = self.limits.names.download
        return ArchiveError(f"cannot download {self.url}: {size / _MB:,.1f} MB, over {name} "
                            f"({self.limits.download_max_bytes / _MB:g} MB); raise {name} to download it")


def download(url: str, download_dir: Path, sha256: str | None, *, progress: bool = True, limits: ArchiveLimits | None = None) -> Path:
    """The archive at ``url`` in ``download_dir`` (downloaded now unless a copy is there), within ``limits``."""
    pace = _Pace(url, limits or ArchiveLimits())
    name = os.path.basename(urllib.parse.urlparse(url).path) or "snapshot.tar.gz"
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in name)[-100:]
    target = download_dir / f"{hashlib.sha256(url.encode()).hexdigest()[:16]}-{safe}"
    if target.is_file():
        if sha256 is not None and (actual := file_sha256(target)) != sha256:
            raise _mismatch(f"{target} (downloaded from {url})", sha256, actual)
        return target
    download_dir.mkdir(parents=True, exist_ok=True)
    fd, part = tempfile.mkstemp(prefix=".part-", dir=download_dir)
    try:
        actual = _fetch(url, fd, pace, progress)
        if sha256 is not None and actual != sha256:
            raise _mismatch(url, sha256, actual)
        os.replace(part, target)
    except (OSError, urllib3.exceptions.HTTPError) as exc:  # requests' errors are OSErrors; urllib3's are read1's
        raise ArchiveError(f"cannot download {url}: {_why(exc)}") from exc
    finally:
        if os.path.exists(part):
            os.unlink(part)
    return target


def _why(exc: BaseException) -> str:
    """The socket's words under requests' and urllib3's (``[Errno 111] Connection refused``), else the error's."""
    reason = getattr(exc.args[0], "reason", None) if exc.args else None  # a MaxRetryError in a ConnectionError
    return str((reason.__cause__ or reason) if isinstance(reason, BaseException) else exc)


def _fetch(url: str, fd: int, pace: _Pace, progress: bool) -> str:
    """The answer to ``GET url`` written to ``fd`` as it arrives, within ``pace``; its SHA-256."""
    digest = hashlib.sha256()
    with os.fdopen(fd, "wb") as out, _HttpOnlyRedirects() as session, session.get(
            url, stream=True, timeout=pace.read_timeout(), headers={"Accept-Encoding": "identity"}) as response:
        if not 200 <= response.status_code < 300:
            raise ArchiveError(f"cannot download {url}: HTTP Error {response.status_code}: {response.reason}")
        total = response.headers.get("Content-Length")
        length = int(total) if total and total.isdigit() else None
        pace.check_length(length)
        with progress_bar(total=length, unit="B", unit_scale=True, desc="download", disable=not progress) as bar:
            while chunk := response.raw.read1(_CHUNK, decode_content=False):  # what arrived, as sent
                pace.arrived(len(chunk))
                out.write(chunk)
                digest.update(chunk)
                bar.update(len(chunk))
    return digest.hexdigest()


def _member_filter(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
    """Only folders and regular files, each inside ``dest`` (tarfile's ``data`` filter, and no links)."""
    member_kind(member)
    try:
        return tarfile.data_filter(member, dest)
    except tarfile.FilterError as exc:
        raise ArchiveError(f"{member.name}: {exc}; not unpacked") from exc


@dataclass(frozen=True)
class ArchiveKind:
    """What an archive holds and how its unpacked copy is checked (a snapshot; ``score``'s bundles too)."""

    root_files: tuple[str, ...]
    """The files one of which is at the root of an unpacked copy (the archive's top, or its one top folder), tried in order."""
    what: str
    """Its name in messages: ``a snapshot``."""
    made_by: str
    """The command that makes one, for messages."""
    check: Callable[[Path, bool], str]
    """``check(root, progress)``: the unpacked copy's content hash, checked against its own record of it
    (:class:`ArchiveError` naming the mismatch)."""


def _check_snapshot(root: Path, progress: bool) -> str:
    try:
        manifest = json.loads((root / MANIFEST_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ArchiveError(f"{MANIFEST_NAME} cannot be read: {exc}") from exc
    expected = manifest.get("content_hash") if isinstance(manifest, dict) else None
    if not isinstance(expected, str):
        raise ArchiveError(f"{MANIFEST_NAME} has no content_hash: not a snapshot manifest")
    if (problem := failure_entries_problem(manifest)) is not None:
        raise ArchiveError(f"{MANIFEST_NAME}: {problem}")
    actual = tree_hash(root, progress=progress)
    if actual != expected:
        raise ArchiveChanged(f"the files' content hash {actual} does not match the manifest's content_hash {expected}: "
                           "the archive was changed or damaged; not used")
    return actual


SNAPSHOT = ArchiveKind((MANIFEST_NAME,), "a snapshot", "stabletoolbench-mirror snapshot OUT.tar.gz", _check_snapshot)
"""A snapshot (``snapshot OUT.tar.gz``): its tree's content hash checked against ``manifest.json``'s."""


def _tree_root(folder: Path, kind: ArchiveKind = SNAPSHOT) -> Path:
    """The folder holding one of the kind's root files: the archive's top, or its one top folder."""
    subfolders = [p for p in folder.iterdir() if p.is_dir()]
    for name in kind.root_files:
        if (folder / name).is_file():
            return folder
        if len(subfolders) == 1 and (subfolders[0] / name).is_file():
            return subfolders[0]
    raise ArchiveError(f"the archive has no {' or '.join(kind.root_files)}: it is not {kind.what} (make one with: {kind.made_by})")


def tree_hash(root: Path, *, progress: bool = True) -> str:
    """The content hash of an upstream tree's files (as ``snapshot --verify`` computes it)."""
    digest = ContentHash()
    for api, path in progress_bar(sorted(iter_cache_files(root, allow_symlinks=False)), desc="check", unit="file", disable=not progress):
        try:
            entries = read_cache_file(path)
        except (OSError, ValueError) as exc:
            raise ArchiveError(f"unreadable file in the archive: {exc}") from exc
        digest.add_api(api, entries.items())
    return digest.hexdigest()


def _marker(archive: Path, sha256: str, content_hash: str) -> dict[str, Any]:
    stat = archive.stat()
    return {"archive": str(archive), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": sha256, "content_hash": content_hash}


def _unpacked_copy(archive: Path, dest: Path, kind: ArchiveKind) -> Path | None:
    """The folder unpacked from this very archive before (same size and time), if any."""
    try:
        marker = json.loads((dest / MARKER).read_text(encoding="utf-8"))
        stat = archive.stat()
    except (OSError, ValueError):
        return None
    if marker.get("size") == stat.st_size and marker.get("mtime_ns") == stat.st_mtime_ns and marker.get("archive") == str(archive):
        return _tree_root(dest, kind)
    return None


def unpack(archive: Path, download_dir: Path, sha256: str | None = None, *, progress: bool = True,
           limits: ArchiveLimits | None = None, kind: ArchiveKind = SNAPSHOT) -> Path:
    """The checked tree of ``archive`` (unpacked into ``download_dir`` now, unless done before)."""
    limits = limits or ArchiveLimits()
    archive = archive.resolve()
    stem = archive.name
    for suffix in ARCHIVE_SUFFIXES:
        stem = stem.removesuffix(suffix)
    dest = download_dir / f"{stem[:80]}-{hashlib.sha256(str(archive).encode()).hexdigest()[:12]}"
    if not archive.is_file():
        raise ArchiveError(f"{archive}: no such archive")
    actual_sha = file_sha256(archive)
    if sha256 is not None and actual_sha != sha256:
        raise _mismatch(str(archive), sha256, actual_sha)
    reused = _unpacked_copy(archive, dest, kind)
    if reused is not None:
        return reused
    download_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".unpack-", dir=download_dir))
    try:
        try:
            check_headers(archive, limits)
            with archive.open("rb") as compressed, stream(archive, limits, compressed) as tar:
                tar.extractall(work, filter=_member_filter)
        except (OSError, tarfile.TarError, EOFError) as exc:
            raise ArchiveError(f"{archive}: not a readable .tar.gz archive: {exc}") from exc
        try:
            root = _tree_root(work, kind)
            actual = kind.check(root, progress)
        except ArchiveError as exc:
            raise type(exc)(f"{archive}: {exc}") from exc  # the kind kept: a changed archive stays one
        (work / MARKER).write_text(json.dumps(_marker(archive, actual_sha, actual)), encoding="utf-8")
        shutil.rmtree(dest, ignore_errors=True)
        try:
            os.replace(work, dest)
        except OSError:
            if _unpacked_copy(archive, dest, kind) is None:  # another process unpacked it meanwhile: use theirs
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return _tree_root(dest, kind)


def local_tree(spec: str, download_dir: str | os.PathLike[str], *, resolve: Callable[[str], str] = os.path.abspath,
               progress: bool = True, limits: ArchiveLimits | None = None, kind: ArchiveKind = SNAPSHOT) -> str:
    """The folder to read for a ``frozen_caches`` entry or ``cache import`` argument (``kind``: a snapshot;
    ``score --replay`` reads its bundles the same way).

    A folder is itself (``resolve``d); an archive or a URL is fetched, unpacked and checked
    (see the module docstring).  Raises :class:`ArchiveError`; a downloaded archive that is
    refused is removed.
    """
    if not is_archive(spec):
        return resolve(spec)
    location, sha256 = split_spec(spec)
    where = Path(download_dir)
    if is_url(location):
        archive = download(location, where, sha256, progress=progress, limits=limits)
        try:  # its SHA-256 checked as it arrived (or, for a kept copy, just now)
            return str(unpack(archive, where, None, progress=progress, limits=limits, kind=kind))
        except ArchiveError:
            archive.unlink(missing_ok=True)
            raise
    return str(unpack(Path(resolve(location)), where, sha256, progress=progress, limits=limits, kind=kind))


def pack(folder: Path, out: Path) -> None:
    """Write ``folder``'s files (a snapshot, a score bundle) as the archive ``out`` (members at its top; atomic)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, part = tempfile.mkstemp(prefix=".part-", suffix=".tar.gz", dir=out.parent)
    os.close(fd)
    os.chmod(part, 0o644)  # a file to publish (mkstemp makes it private)
    try:
        with tarfile.open(part, "w:gz") as tar:
            for child in sorted(folder.iterdir()):
                tar.add(child, arcname=child.name)
        os.replace(part, out)
    finally:
        if os.path.exists(part):
            os.unlink(part)


def manifest_problem(folder: str | os.PathLike[str]) -> str | None:
    """Why a snapshot folder's manifest cannot be trusted (its failure entries changed since it was written), or ``None``.

    A folder without a readable manifest has none (its reader says so and takes no entry for a failure).
    """
    path = Path(folder, MANIFEST_NAME)
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    problem = failure_entries_problem(manifest)
    return f"{path}: {problem}" if problem is not None else None


def frozen_folder(settings: Settings, configured: str) -> str:
    """The folder a ``frozen_caches`` entry names: itself, or its archive's checked tree in ``download_dir``."""
    folder = local_tree(configured, settings.resolve(settings.download_dir), resolve=settings.resolve,
                        limits=ArchiveLimits.of(settings))
    if not is_archive(configured) and (problem := manifest_problem(folder)) is not None:  # an archive's was checked unpacking it
        raise ArchiveError(problem)
    return folder
