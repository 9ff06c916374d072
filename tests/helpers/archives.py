"""Tar members of zeros for the archive-limit tests and benchmarks: streamed in chunks, never held in memory."""

from __future__ import annotations

import io
import tarfile

MB = 1 << 20


class Zeros(io.RawIOBase):
    """``size`` zero bytes, read in chunks (never held at once)."""

    def __init__(self, size: int) -> None:
        self.left = size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def]
        n = min(len(buffer), self.left)
        buffer[:n] = bytes(n)
        self.left -= n
        return n


def add_member(tar: tarfile.TarFile, name: str, data: bytes | None = None, *, zeros: int = 0) -> None:
    """A member ``name`` holding ``data``, or ``zeros`` zero bytes streamed."""
    info = tarfile.TarInfo(name)
    info.size = len(data) if data is not None else zeros
    tar.addfile(info, io.BytesIO(data) if data is not None else io.BufferedReader(Zeros(zeros), MB))
