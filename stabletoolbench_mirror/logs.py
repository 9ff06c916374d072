"""Logging set-up with secret redaction: configured keys never reach a log line."""

from __future__ import annotations

import logging
import threading
from typing import Iterable

from .secrets import Redactor


_FORMATTER = logging.Formatter()


class RedactSecrets(logging.Filter):
    """Replaces every known secret value in a record's message with ``***`` (see :mod:`.secrets`)."""

    def __init__(self) -> None:
        super().__init__()
        self._redactor = Redactor()
        self._lock = threading.Lock()

    def add(self, secrets: Iterable[str]) -> None:
        with self._lock:
            self._redactor.add(secrets)

    def filter(self, record: logging.LogRecord) -> bool:
        if not self._redactor:
            return True
        message = record.getMessage()
        redacted = self._redactor.text(message)
        if redacted != message:
            record.msg, record.args = redacted, None
        if record.exc_info and not record.exc_text:
            # an exception's text may quote a key too (the formatter uses exc_text when set)
            record.exc_text = self._redactor.text(_FORMATTER.formatException(record.exc_info))
        return True


REDACTOR = RedactSecrets()


_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def setup_logging(level: str = "info", secrets: Iterable[str] = (), log_file: str | None = None) -> None:
    """Log to stderr (and append to ``log_file`` when given), with every known secret redacted."""
    REDACTOR.add(secrets)
    root = logging.getLogger()
    if not any(isinstance(h, logging.StreamHandler) and getattr(h, "_stm", False) for h in root.handlers):
        handler = logging.StreamHandler()
        handler._stm = True  # type: ignore[attr-defined]
        handler.setFormatter(logging.Formatter(_FORMAT))
        handler.addFilter(REDACTOR)
        root.addHandler(handler)
    if log_file and not any(getattr(h, "_stm_file", None) == log_file for h in root.handlers):
        # raises OSError when the file cannot be opened: the caller reports it at start
        file_handler = logging.FileHandler(log_file, encoding="utf-8", delay=False)
        file_handler._stm_file = log_file  # type: ignore[attr-defined]
        file_handler.setFormatter(logging.Formatter(_FORMAT))
        file_handler.addFilter(REDACTOR)
        root.addHandler(file_handler)
    root.setLevel(level.upper())


def to_log_file(message: str) -> None:
    """Append ``message`` to the configured log file only (e.g. the start-up summary already printed)."""
    record = logging.LogRecord("stabletoolbench_mirror", logging.INFO, __file__, 0, message, None, None)
    for handler in logging.getLogger().handlers:
        if getattr(handler, "_stm_file", None):
            handler.handle(record)
