"""The server a score runs through: this package's app in a uvicorn thread on 127.0.0.1, or one named by URL.

``score`` starts the server itself (the same app ``serve`` runs, one worker) on a socket it binds first, so the
port is free by construction and known before upstream's scripts start; its log goes to the work folder's
``logs/server.log``, not to the terminal the progress is shown on.  The app and its layer stay in reach,
so the run checks what the served store could not copy (:attr:`Mirror.copy_failures`).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import uvicorn

from stabletoolbench_mirror.config import Settings

START_TIMEOUT_S = 60.0


class MirrorError(RuntimeError):
    """The server could not start (the message says why)."""


class Mirror:
    """A running server: ``url`` (``http://127.0.0.1:PORT``), started by :meth:`start`, or one someone else runs
    (``score --server URL``: ``Mirror(url)``)."""

    def __init__(self, url: str, server: uvicorn.Server | None = None, thread: threading.Thread | None = None, app: Any = None,
                 restore_logging: Callable[[], None] | None = None) -> None:
        self.url = url.rstrip("/")
        self._server = server
        self._thread = thread
        self.app = app
        self._restore_logging = restore_logging

    @classmethod
    def start(cls, settings: Settings, log_file: Path) -> Mirror:
        """The app for ``settings`` served on 127.0.0.1 (a port the OS picks), its log appended to ``log_file``."""
        from stabletoolbench_mirror.serving.server import create_app

        restore = _log_to(log_file, settings.log_level, settings.secrets())
        try:
            return cls._serve(create_app(settings), settings, log_file, restore)
        except BaseException:
            restore()
            raise

    @classmethod
    def _serve(cls, app: Any, settings: Settings, log_file: Path, restore: Callable[[], None]) -> Mirror:
        from stabletoolbench_mirror.serving.server import uvicorn_options

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        # one access line per request is a run's whole traffic: only at log_level debug
        options = {**uvicorn_options(settings), "access_log": settings.log_level == "debug"}
        config = uvicorn.Config(app, log_level=settings.log_level, log_config=None, lifespan="on", timeout_graceful_shutdown=5, **options)
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="stm-score-server", daemon=True)
        thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                server.should_exit = True
                thread.join(timeout=10)
                sock.close()
                raise MirrorError(f"the server did not start (see {log_file})")
            time.sleep(0.02)
        return cls(f"http://127.0.0.1:{sock.getsockname()[1]}", server, thread, app, restore)

    def health(self) -> dict[str, Any]:
        """The server's ``/health`` (``{}`` when it cannot be read): e.g. the simulator's prompt source and SHA-256."""
        import requests

        try:
            answer = requests.get(self.url + "/health", timeout=10)
            data = answer.json() if answer.status_code == 200 else {}
        except (requests.RequestException, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    @property
    def copy_failures(self) -> int:
        """Answers served that ``record.served_store`` could not copy (0 for a server named by URL: not known here)."""
        served = getattr(getattr(getattr(self.app, "state", None), "layer", None), "served", None)
        return 0 if served is None else int(served.failed)

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=60)
            self._server = self._thread = None
        if self._restore_logging is not None:
            self._restore_logging()
            self._restore_logging = None


def _log_to(log_file: Path, level: str, secrets: list[str]) -> Callable[[], None]:
    """The server's log (and uvicorn's) into ``log_file`` only, secrets redacted as ``serve``'s log is; returns
    what puts the loggers back as they were."""
    from stabletoolbench_mirror.core.logs import REDACTOR

    REDACTOR.add(secrets)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(log_file, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(REDACTOR)
    kept = []
    for name in ("stabletoolbench_mirror", "uvicorn", "uvicorn.error"):
        logger = logging.getLogger(name)
        kept.append((logger, logger.propagate, logger.level))
        logger.addHandler(handler)
        logger.propagate = False
        logger.setLevel(level.upper())

    def restore() -> None:
        for logger, propagate, was in kept:
            logger.removeHandler(handler)
            logger.propagate = propagate
            logger.setLevel(was)
        handler.close()

    return restore
