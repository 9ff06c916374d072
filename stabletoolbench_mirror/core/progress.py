"""The one progress bar of every command: tqdm's bar on a terminal, log lines everywhere else.

On a terminal the bar is redrawn in place (carriage returns), as tqdm does.  Written to a log
file, a pipe or CI's output, carriage returns pile up into one unreadable line, so there the
progress is one whole line at most every :data:`LOG_INTERVAL_S` seconds (and a last one at the
end): the description, the count of the total, the time taken and the rate, e.g.
``import: 1200/5000 [00:10, 118.52file/s]``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any, TypeVar

from tqdm import tqdm

T = TypeVar("T")

#: off a terminal: the shortest time between two progress lines, in seconds
LOG_INTERVAL_S = 5.0

#: off a terminal: what each line says (no bar)
LOG_FORMAT = "{desc}: {n_fmt}/{total_fmt} [{elapsed}, {rate_fmt}{postfix}]"


class LogLines(tqdm):
    """tqdm writing whole lines instead of redrawing one in place (see the module's text).

    Each line after the first starts with the newline that ends the one before, so tqdm's
    own ``\\n`` at :meth:`close` ends the last line and no line is ever left half-written.
    """

    def display(self, msg: str | None = None, pos: int | None = None) -> bool:  # type: ignore[override]  # tqdm.close reads the bool
        if msg == "":  # tqdm clearing the bar at its close (leave=False): a log keeps the last count
            self.fp.write(("\n" if getattr(self, "_lines", 0) else "") + self.__str__() + "\n")
            self.fp.flush()
            return False
        text = self.__str__() if msg is None else msg
        self.fp.write(("\n" if getattr(self, "_lines", 0) else "") + text)
        self.fp.flush()
        self._lines = getattr(self, "_lines", 0) + 1
        return True


def is_terminal(stream: Any) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False


def progress_bar(iterable: Iterable[T] | None = None, **options: Any) -> tqdm:
    """``tqdm(iterable, **options)`` on a terminal; :class:`LogLines` (a line every few seconds) elsewhere.

    ``options`` are tqdm's (``total``, ``desc``, ``unit``, ``disable``, ``file`` (default stderr), ...).
    """
    stream = options.get("file") or sys.stderr
    if options.get("disable") or is_terminal(stream):
        return tqdm(iterable, **options)
    options.pop("dynamic_ncols", None)
    options.setdefault("mininterval", LOG_INTERVAL_S)
    options.setdefault("bar_format", LOG_FORMAT)
    return LogLines(iterable, **options)
