"""Logging set-up: configured keys never reach a log line, and client text is quoted only in part.

Text a client controls (names, keys, paths) is quoted through :func:`clip`: at most
:data:`MAX_QUOTED_CHARS` characters of it.  As a backstop, a log message longer than
:data:`MAX_MESSAGE_CHARS` is cut (after secrets are redacted, so no key is cut in half and left
partly readable), and uvicorn's access log quotes at most :data:`MAX_QUOTED_CHARS` of a path.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Iterable
from typing import Any

from stabletoolbench_mirror.core.secrets import Redactor

_FORMATTER = logging.Formatter()

#: The most characters of a client-supplied text (a name, a key, a path) a log line quotes.
MAX_QUOTED_CHARS = 200
#: The most characters of one log message (tracebacks not counted): a backstop for :func:`clip`.
MAX_MESSAGE_CHARS = 8000


def clip(text: object, limit: int = MAX_QUOTED_CHARS) -> str:
    """``text`` cut to ``limit`` characters, saying how many were left out."""
    text = text if isinstance(text, str) else str(text)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}...[{len(text) - limit} more chars]"


#: characters a terminal acts on rather than shows (C0 but tab and newline, DEL, C1) and those that reorder what
#: it shows (Unicode's bidirectional controls: a name could hide or reverse the text after it)
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
#: the same without the carriage return (a progress bar on stderr redraws itself with it)
_CONTROL_BUT_CR = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escaped(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def printable(text: str, *, keep_cr: bool = False) -> str:
    """``text`` safe to show on a terminal: each control character a name read from a store, a tree or a
    request may hold (an ESC sequence that clears the screen or retitles the window, a bidirectional override)
    written as its JSON escape (``\\u001b``), tab and newline (and with ``keep_cr`` the carriage return) kept.

    JSON stays exact: ``json.dumps`` escapes C0 itself, and what it leaves raw (DEL, C1, the bidirectional
    controls) becomes the escape JSON reads back as the same character.
    """
    pattern = _CONTROL_BUT_CR if keep_cr else _CONTROL
    return pattern.sub(_escaped, text) if pattern.search(text) else text


class PrintableStream:
    """A text stream that writes what it is given through :func:`printable` (a command's stdout and stderr:
    see ``commands.cli.main``); everything else (``isatty``, ``fileno``, ``buffer``, ``flush``) is the stream's."""

    def __init__(self, stream: Any, *, keep_cr: bool = False) -> None:
        self._stream = stream
        self._keep_cr = keep_cr

    def write(self, text: str) -> int:
        self._stream.write(printable(text, keep_cr=self._keep_cr))
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class RedactSecrets(logging.Filter):
    """Replaces every known secret value in a record's message with ``***`` (see :mod:`.secrets`); cuts overlong messages."""

    def __init__(self) -> None:
        super().__init__()
        self._redactor = Redactor()
        self._lock = threading.Lock()

    def add(self, secrets: Iterable[str]) -> None:
        with self._lock:
            self._redactor.add(secrets)

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed call; the handler reports it as logging does
            return True
        # redact before cutting, so no key is cut in half and left partly readable; a name's control characters
        # are shown escaped (a client's ESC sequence never reaches the terminal the server logs to)
        redacted = printable(clip(self._redactor.text(message) if self._redactor else message, MAX_MESSAGE_CHARS))
        if redacted != message:
            record.msg, record.args = redacted, None
        if self._redactor and record.exc_info and not record.exc_text:
            # an exception's text may quote a key too (the formatter uses exc_text when set)
            record.exc_text = self._redactor.text(_FORMATTER.formatException(record.exc_info))
        return True


class ClipAccessPath(logging.Filter):
    """Cuts the request path in uvicorn's access log lines to :data:`MAX_QUOTED_CHARS`."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        # uvicorn.access: (client address, method, path with query, HTTP version, status)
        if isinstance(args, tuple) and len(args) == 5 and isinstance(args[2], str) and len(args[2]) > MAX_QUOTED_CHARS:
            record.args = (args[0], args[1], clip(args[2]), *args[3:])
        return True


REDACTOR = RedactSecrets()
_ACCESS_CLIP = ClipAccessPath()


_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _Console(logging.StreamHandler):
    """This package's stderr handler (added once, however often logging is set up)."""


class _LogFile(logging.FileHandler):
    """This package's handler of ``log_file`` (one per file)."""


def setup_logging(level: str = "info", secrets: Iterable[str] = (), log_file: str | None = None) -> None:
    """Log to stderr (and append to ``log_file`` when given), with every known secret redacted."""
    REDACTOR.add(secrets)
    root = logging.getLogger()
    if not any(isinstance(h, _Console) for h in root.handlers):
        handler = _Console()
        handler.setFormatter(logging.Formatter(_FORMAT))
        handler.addFilter(REDACTOR)
        root.addHandler(handler)
    if log_file and not any(isinstance(h, _LogFile) and h.baseFilename == os.path.abspath(log_file) for h in root.handlers):
        # raises OSError when the file cannot be opened: the caller reports it at start
        file_handler = _LogFile(log_file, encoding="utf-8", delay=False)
        file_handler.setFormatter(logging.Formatter(_FORMAT))
        file_handler.addFilter(REDACTOR)
        root.addHandler(file_handler)
    root.setLevel(level.upper())
    access = logging.getLogger("uvicorn.access")
    if _ACCESS_CLIP not in access.filters:
        access.addFilter(_ACCESS_CLIP)


def to_log_file(message: str) -> None:
    """Append ``message`` to the configured log file only (e.g. the start-up summary already printed)."""
    record = logging.LogRecord("stabletoolbench_mirror", logging.INFO, __file__, 0, message, None, None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, _LogFile):
            handler.handle(record)
