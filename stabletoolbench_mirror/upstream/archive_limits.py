"""What an archive may unpack to and a download may be (:class:`ArchiveLimits`), checked as an archive streams by.

Two checks, both before a byte is written: the tar headers (a member's size, the members' total and count, the kinds
of member and their paths; a tar member's data is exactly its header's size, so these are the bytes that would be
written), and the ratio of the unpacked bytes to the archive's bytes read so far, counted on the stream itself
(:class:`_Meter`), whatever the headers say: an archive bomb (more than ``max_ratio`` times its size, once past
:data:`RATIO_FLOOR_BYTES`) is refused as soon as it crosses it.  Each refusal names what to raise (:class:`LimitNames`:
the settings' keys, or a command's flags).
"""

from __future__ import annotations

import gzip
import io
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stabletoolbench_mirror.config import Settings

_MB = 1024 * 1024
RATIO_FLOOR_BYTES = 16 * _MB  # an archive that unpacks to less than this is never refused for its ratio to its size


class ArchiveError(RuntimeError):
    """An archive cannot be fetched, unpacked or trusted (the message says which and why)."""


class ArchiveChanged(ArchiveError):
    """An archive unpacked whole whose files are not as its own record of them says: changed or damaged since it was made."""


@dataclass(frozen=True)
class LimitNames:
    """What a refusal tells the user to raise, per limit: the settings' keys (these defaults), or a command's flags."""

    member: str = "frozen_max_file_mb"
    total: str = "archive_max_total_mb"
    members: str = "archive_max_members"
    ratio: str = "archive_max_ratio"
    download: str = "download_max_mb"
    deadline: str = "download_deadline_s"


@dataclass(frozen=True)
class ArchiveLimits:
    """What an archive may unpack to (checked on its tar headers before anything is unpacked; its ratio to the
    archive's size, as it streams) and what a download may be.

    The defaults are the settings' (``frozen_max_file_mb``, ``archive_max_total_mb``, ``archive_max_members``,
    ``archive_max_ratio``, ``download_max_mb``, ``download_deadline_s``); ``names`` says what a refusal names.
    """

    max_member_bytes: int = 512 * _MB
    max_total_bytes: int = 16384 * _MB
    max_members: int = 100_000
    download_max_bytes: int = 16384 * _MB
    download_deadline_s: float = 3600.0
    max_ratio: float = 100.0
    names: LimitNames = LimitNames()

    @classmethod
    def of(cls, settings: Settings) -> ArchiveLimits:
        return cls(int(settings.frozen_max_file_mb * _MB), int(settings.archive_max_total_mb * _MB), settings.archive_max_members,
                   int(settings.download_max_mb * _MB), settings.download_deadline_s, settings.archive_max_ratio)


class _Budget:
    """The members of one archive counted against :class:`ArchiveLimits`, one tar header at a time."""

    def __init__(self, archive: Path, limits: ArchiveLimits) -> None:
        self.archive, self.limits = archive, limits
        self.members = 0
        self.total = 0

    def admit(self, member: tarfile.TarInfo) -> None:
        """Raise :class:`ArchiveError` naming the key when ``member`` takes the archive over a limit."""
        limits, names = self.limits, self.limits.names
        self.members += 1
        if self.members > limits.max_members:
            raise ArchiveError(f"{self.archive}: more than {limits.max_members:,} members, over {names.members} "
                               f"({limits.max_members:,}): not unpacked; raise {names.members} to unpack it")
        if not member.isfile():
            return
        if member.size > limits.max_member_bytes:
            raise ArchiveError(f"{self.archive}: {member.name} unpacks to {member.size / _MB:,.1f} MB, over {names.member} "
                               f"({limits.max_member_bytes / _MB:g} MB): not unpacked; raise {names.member} to unpack it")
        self.total += member.size
        if self.total > limits.max_total_bytes:
            raise ArchiveError(f"{self.archive}: the members unpack to more than {limits.max_total_bytes / _MB:g} MB, over "
                               f"{names.total}: not unpacked; raise {names.total} to unpack it")


class _Meter(io.RawIOBase):
    """An archive's unpacked bytes, counted as tarfile reads them, against the bytes of the archive read so far.

    Past :data:`RATIO_FLOOR_BYTES`, more than ``max_ratio`` unpacked bytes per archive byte is an archive bomb: refused
    while it streams, whatever its headers say, before the bytes are written."""

    def __init__(self, compressed: IO[bytes], archive: Path, limits: ArchiveLimits) -> None:
        super().__init__()
        self.compressed, self.archive, self.limits = compressed, archive, limits
        self.unpacked = gzip.GzipFile(fileobj=compressed, mode="rb")  # gzip's buffer (tarfile's r|gz copies its own: slow)
        self.count = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = self.unpacked.readinto(buffer)
        self.count += n
        read = max(1, self.compressed.tell())
        if self.count > RATIO_FLOOR_BYTES and self.count > self.limits.max_ratio * read:
            name = self.limits.names.ratio
            raise ArchiveError(f"{self.archive}: unpacks to more than {self.limits.max_ratio:g} times its size "
                               f"({self.count / _MB:,.1f} MB from its first {read / _MB:,.2f} MB), over {name} "
                               f"({self.limits.max_ratio:g}): an archive bomb? not unpacked; raise {name} to unpack it")
        return n


def stream(archive: Path, limits: ArchiveLimits, compressed: IO[bytes]) -> tarfile.TarFile:
    """The archive read member by member (tarfile's ``r|``) through a :class:`_Meter`."""
    return tarfile.open(fileobj=_Meter(compressed, archive, limits), mode="r|")


def check_headers(archive: Path, limits: ArchiveLimits) -> None:
    """Every member's header checked (type, path, size, count) as the archive streams by; nothing is unpacked.

    The stream is unpacked by :mod:`gzip`, not by tarfile's ``r|gz``: that one keeps what it unpacked in one buffer and
    copies its rest for every 512-byte header read, which took 19 s (13 of them in the kernel) to refuse an archive of
    100,000 small members; through :class:`gzip.GzipFile` it takes about 2 s."""
    budget = _Budget(archive, limits)
    with archive.open("rb") as compressed, stream(archive, limits, compressed) as tar:
        for member in tar:  # a member's data is skipped (counted by the meter), never kept
            budget.admit(member)
            member_kind(member)


def member_kind(member: tarfile.TarInfo) -> None:
    """Only folders and regular files, none with an absolute path or ``..``."""
    if not (member.isfile() or member.isdir()):
        raise ArchiveError(f"{member.name}: the archive holds a link or special file; only folders and files are unpacked")
    if member.name.startswith(("/", "\\")) or ".." in Path(member.name).parts:
        raise ArchiveError(f"{member.name}: a path outside the archive's folder; not unpacked")
