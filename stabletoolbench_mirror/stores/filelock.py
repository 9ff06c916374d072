"""Per-key locks shared by the processes of one host: byte-range locks on one file.

Each key maps (by a 62-bit hash) to one byte offset of a lock file; a lock is a Linux
open-file-description lock (``F_OFD_SETLK``) on that byte.  Such locks belong to the
open file, not to the process, so two stores opened in one process exclude each other
like two processes do, and the kernel drops them when the holder exits, even on
``kill -9``: no lock outlives its holder, and nothing is ever written to the file.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import logging
import os
import struct
import threading

from stabletoolbench_mirror.core.files import atomic_write

# struct flock on Linux (x86-64, arm64): short l_type, short l_whence, off_t l_start, off_t l_len, pid_t l_pid
_FLOCK = "hhqqi4x"
_OFFSET_BITS = 62


class ByteRangeLocks:
    """Non-blocking exclusive locks on single bytes of ``path`` (created if missing, never written)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        if not hasattr(fcntl, "F_OFD_SETLK"):  # pragma: no cover - Linux has open-file-description locks since 3.15
            raise OSError(errno.ENOSYS, "open file description locks are not available")
        self.path = os.fspath(path)
        self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self._guard = threading.Lock()
        self._held: set[int] = set()

    def _fcntl(self, kind: int, offset: int) -> bool:
        if self._fd is None:
            raise OSError(errno.EBADF, "lock file closed")
        request = struct.pack(_FLOCK, kind, os.SEEK_SET, offset, 1, 0)
        try:
            fcntl.fcntl(self._fd, fcntl.F_OFD_SETLK, request)
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                return False
            raise
        return True

    def try_acquire(self, name: str) -> int | None:
        """Lock the byte of ``name``; its offset, or ``None`` when another open file holds it."""
        digest = hashlib.blake2b(name.encode("utf-8", "surrogatepass"), digest_size=8).digest()
        offset = int.from_bytes(digest, "big") >> (64 - _OFFSET_BITS)
        with self._guard:
            # threads of one store share its open file (and so its locks): keep them apart here
            if offset in self._held:
                return None
            if not self._fcntl(fcntl.F_WRLCK, offset):
                return None
            self._held.add(offset)
        return offset

    def release(self, offset: int) -> None:
        with self._guard:
            if offset in self._held:
                self._held.discard(offset)
                self._fcntl(fcntl.F_UNLCK, offset)

    def close(self) -> None:
        with self._guard:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
                self._held.clear()


#: the lock name of the one private model-call run a store may have (:class:`PrivateRunLock`)
PRIVATE_RUN_LOCK = "\x00private model-call run"


class PrivateRunLock:
    """The store's one private model-call run: a byte of its lock file, locked for as long as the store is open
    (the kernel drops it when this process ends, even on ``kill -9``), and a line in ``note`` saying who holds it."""

    def __init__(self, locks: ByteRangeLocks, note: str) -> None:
        self._locks = locks
        self._note = note
        self._held: int | None = None

    def hold(self, who: str, log: logging.Logger) -> str | None:
        """``None`` when this process holds it now (``who`` written in the note), else who already does."""
        if self._held is not None:
            return None
        self._held = self._locks.try_acquire(PRIVATE_RUN_LOCK)
        if self._held is None:  # who holds it: the line its holder wrote in the note
            try:
                with open(self._note, encoding="utf-8") as handle:
                    return handle.read(400).strip() or "another process"
            except OSError:
                return "another process"
        try:
            with atomic_write(self._note) as handle:
                handle.write(f"{who}\n")
        except OSError as exc:  # the line is for a message only: the lock is what counts
            log.info("diskcache store at %s: %s not written (%s)", os.path.dirname(self._note), os.path.basename(self._note), exc)
        return None

    def release(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            self._locks.release(held)
