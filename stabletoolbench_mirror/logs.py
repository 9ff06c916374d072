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


def setup_logging(level: str = "info", secrets: Iterable[str] = ()) -> None:
    REDACTOR.add(secrets)
    root = logging.getLogger()
    if not any(isinstance(h, logging.StreamHandler) and getattr(h, "_stm", False) for h in root.handlers):
        handler = logging.StreamHandler()
        handler._stm = True  # type: ignore[attr-defined]
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        handler.addFilter(REDACTOR)
        root.addHandler(handler)
    root.setLevel(level.upper())
