"""Logging set-up with secret redaction: configured keys never reach a log line."""

from __future__ import annotations

import logging
import threading
from typing import Iterable

_REDACTED = "***"


class RedactSecrets(logging.Filter):
    """Replaces every known secret value in a record's message with ``***``."""

    def __init__(self) -> None:
        super().__init__()
        self._secrets: set[str] = set()
        self._lock = threading.Lock()

    def add(self, secrets: Iterable[str]) -> None:
        with self._lock:
            self._secrets.update(s for s in secrets if s and len(s) >= 4)

    def filter(self, record: logging.LogRecord) -> bool:
        if not self._secrets:
            return True
        message = record.getMessage()
        redacted = message
        for secret in self._secrets:
            if secret in redacted:
                redacted = redacted.replace(secret, _REDACTED)
        if redacted != message:
            record.msg, record.args = redacted, None
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
