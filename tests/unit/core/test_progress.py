"""The one progress bar: tqdm's redrawn bar on a terminal (a real pty), whole lines in a real file."""

from __future__ import annotations

import os
import pty
import selectors
import time
from pathlib import Path

from stabletoolbench_mirror.core.progress import progress_bar


def test_off_a_terminal_progress_is_whole_lines_with_counts_and_rate(tmp_path: Path) -> None:
    log = tmp_path / "log.txt"
    with open(log, "w", encoding="utf-8") as fh:
        for _ in progress_bar(range(5000), desc="import", unit="file", file=fh):
            pass
        with progress_bar(total=3, desc="warm", unit="call", file=fh, leave=False) as bar:
            bar.update(3)
    text = log.read_text()
    assert "\r" not in text and "\x1b" not in text and text.endswith("\n")
    lines = text.splitlines()
    # at most one line every few seconds: the first and the last of each, not one per item
    assert 4 <= len(lines) <= 12, lines
    assert lines[0].startswith("import: 0/5000 [")
    assert any(line.startswith("import: 5000/5000 [") and "file/s]" in line for line in lines)
    assert lines[-1].startswith("warm: 3/3 [") and "call/s" in lines[-1]


def test_on_a_terminal_it_is_tqdm_s_bar() -> None:
    main, other = pty.openpty()
    try:
        with os.fdopen(other, "w", encoding="utf-8", closefd=False) as tty:
            assert tty.isatty()
            for _ in progress_bar(range(10), desc="import", unit="file", file=tty, mininterval=0):
                pass
            tty.flush()
        # a pty hands its output on in pieces: read until the last update is there (or a generous deadline)
        shown = ""
        deadline = time.monotonic() + 10
        with selectors.DefaultSelector() as ready:  # epoll: select() refuses a descriptor above 1023 (a long suite has them)
            ready.register(main, selectors.EVENT_READ)
            while not ("100%" in shown and "10/10" in shown) and time.monotonic() < deadline:
                if ready.select(0.1):
                    shown += os.read(main, 65536).decode(errors="replace")
    finally:
        os.close(main)
        os.close(other)
    assert "\r" in shown and "100%" in shown and "10/10" in shown


def test_disabled_writes_nothing(tmp_path: Path) -> None:
    log = tmp_path / "log.txt"
    with open(log, "w", encoding="utf-8") as fh:
        for _ in progress_bar(range(10), desc="x", file=fh, disable=True):
            pass
    assert log.read_text() == ""
