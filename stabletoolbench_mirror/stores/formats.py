"""Which on-disk format a store was written in, and whether this version may use it.

Every store (diskcache folder, Redis prefix) holds a small marker naming the **format** its
records and bookkeeping are written in and the package version that last wrote it.  The rules are
written once here and applied by each backend when it opens:

* no marker and no records: a new store, marked with :data:`FORMAT`;
* no marker but records: format 1 (stabletoolbench-mirror 0.2.0 and earlier wrote no marker),
  read as it is and marked with :data:`FORMAT`;
* a marker of a format in :data:`READABLE`: used (and re-marked when it is older);
* a newer format: refused at start, naming the store's format and version and this one's, with
  the fix (upgrade the package, or open another store).

The format number moves with every release that changes what is written (CHANGELOG says so); a
store of each released format is kept under ``tests/data/stores/`` and opened by today's code.

Formats:

1. 0.2.0 and earlier: no marker; a diskcache folder has ``cache.db-generation``, 8 bytes that
   every writer of that version rewrites after each commit and its readers trust for freshness.
2. 0.3.0: the marker.  Freshness comes from SQLite itself (``PRAGMA data_version``), so no
   cooperation of writers is needed; a writer still rewrites ``cache.db-generation`` when it
   finds one, so a 0.2.0 server beside it sees its writes (it is never created any more).
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from typing import Literal

from stabletoolbench_mirror import __version__
from stabletoolbench_mirror.stores.base import StoreError

#: the format this version writes
FORMAT = 2
#: the formats this version reads (and writes beside, safely)
READABLE = frozenset({1, 2})


@dataclass(frozen=True)
class Marker:
    format: int
    written_by: str
    """The package version that last wrote the marker."""

    def to_text(self) -> str:
        return json.dumps({"format": self.format, "written_by": self.written_by}, sort_keys=True)


#: what :func:`decide` tells a backend to do: use the store as it is, or (re)write :func:`current`
Decision = Literal["use", "mark"]


class FormatError(StoreError):
    """The store was written in a format this version cannot read (or cannot safely write beside)."""


def current() -> Marker:
    return Marker(FORMAT, __version__)


def parse(text: str | bytes | None) -> Marker | None:
    """The marker a store holds (``None`` when it holds none); :class:`FormatError` when it is not one."""
    if text is None:
        return None
    try:
        data = json.loads(text)
        marker = Marker(int(data["format"]), str(data.get("written_by", "?")))
    except (ValueError, TypeError, KeyError) as exc:
        raise FormatError(f"the store's format marker is unreadable ({str(text)[:80]!r}: {exc}); "
                          "it was not written by stabletoolbench-mirror") from None
    if marker.format < 1:
        raise FormatError(f"the store's format marker names format {marker.format}, which no version wrote")
    return marker


def decide(found: Marker | None, where: str) -> Decision:
    """What a backend does with the store at ``where`` that holds ``found`` (see the module's rules)."""
    mine = current()
    if found is None:
        return "mark"  # a new store, or format 1 (0.2.0 wrote no marker): read as it is, marked now
    if found.format not in READABLE:
        newest = max(READABLE)
        raise FormatError(
            f"the store at {where} is in format {found.format} (written by stabletoolbench-mirror {found.written_by}); "
            f"this is stabletoolbench-mirror {mine.written_by}, which reads formats {min(READABLE)}-{newest}: "
            f"upgrade it (pip install -U stabletoolbench-mirror, to {found.written_by} or newer) or use another store"
        )
    if found.format < mine.format:
        return "mark"
    return "use"


#: written by format 1 (0.2.0) and trusted by its readers; rewritten after each commit while it exists
LEGACY_GENERATION = "cache.db-generation"


def touch_legacy_generation(folder: str) -> None:
    """New bytes in ``cache.db-generation`` when a format-1 version made one: its readers trust it.

    Never created, never followed through a link, only a regular file; a problem with it is
    ignored (it concerns only a 0.2.0 process beside this one).
    """
    try:
        fd = os.open(os.path.join(folder, LEGACY_GENERATION), os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            os.pwrite(fd, os.urandom(8), 0)
    except OSError:
        pass
    finally:
        os.close(fd)
