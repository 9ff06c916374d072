"""Ctrl-C for long commands that coordinate other processes: a flag their loop reads, not an exception.

Python turns SIGINT into ``KeyboardInterrupt`` between any two bytecodes.  Raised inside a lock
shared with worker processes (a ``multiprocessing`` event's condition), it can leave that lock
held, and then the command and its workers wait on it forever; raised between the halves of a
message read from a pipe, it leaves the next read waiting for bytes that never come.  Inside a
:class:`CtrlC` block the first Ctrl-C only sets :attr:`CtrlC.pressed` (and says so on stderr);
the command stops at a point of its own choosing.  A second Ctrl-C quits at once, with exit
status 130 (worker processes die with their parent).  An inherited "ignore" (a job started in the
background) and a block run off the main thread keep Python's own handling.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any


class CtrlC:
    """``with CtrlC("stopping: ...") as ctrl_c:`` ... ``if ctrl_c.pressed: stop``."""

    def __init__(self, message: str) -> None:
        self.pressed = False
        self._message = f"\n{message}\n".encode()
        self._previous: Any = None

    def __enter__(self) -> CtrlC:
        if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, _signum: int, _frame: Any) -> None:
        # only os.write here: the main thread may be inside a buffered write to stderr (a progress bar)
        if self.pressed:
            os.write(2, b"\ninterrupted again: quitting now\n")
            os._exit(130)
        self.pressed = True
        os.write(2, self._message)

    def __exit__(self, *_exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None
