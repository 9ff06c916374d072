"""Files that appear whole or not at all: the one temp-file-then-rename write of the package.

:func:`atomic_write` writes beside the target (same folder, so the rename stays on one file
system), under a name no other writer picks, then renames it over the target; on any error the
temporary file is removed and the target is as it was.  A reader (a server, a second export) never
sees part of a file.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any


@contextlib.contextmanager
def atomic_write(
    path: str | os.PathLike[str], *, binary: bool = False, file_mode: int = 0o666, fsync: bool = False, **text: Any
) -> Iterator[IO[Any]]:
    """An open file whose content becomes ``path`` when the block ends without an error.

    ``file_mode``: the new file's permission bits before the umask (``0o600`` for a file of
    secrets); ``fsync``: flushed to the disk before the rename (the file must survive a crash);
    ``text``: :func:`open`'s text options (``encoding`` defaults to UTF-8).
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), file_mode)
    try:
        options = {} if binary else {"encoding": "utf-8", **text}
        with os.fdopen(fd, "wb" if binary else "w", **options) as handle:
            yield handle
            if fsync:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_text(path: str | os.PathLike[str], text: str, **options: Any) -> None:
    """``text`` in ``path``, atomically (see :func:`atomic_write` for ``options``)."""
    with atomic_write(path, **options) as handle:
        handle.write(text)


def write_bytes(path: str | os.PathLike[str], data: bytes, **options: Any) -> None:
    """``data`` in ``path``, atomically (see :func:`atomic_write` for ``options``)."""
    with atomic_write(path, binary=True, **options) as handle:
        handle.write(data)
