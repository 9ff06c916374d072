"""Handing the settings (keys included) from ``serve --workers N`` to its worker processes.

Not through the environment: every child process inherits it, and it can be read back from
``/proc/PID/environ`` for as long as a worker lives.  Instead the master writes the settings
to ``settings.json`` (mode 0600) in a folder made for this run (mode 0700) and tells the
workers only the file's path, in ``STM_SERVE_SETTINGS_FILE``.  Each worker reads the file and
acknowledges by creating ``read-<pid>`` beside it.  The master removes the file as soon as
every worker it has started has read it; when uvicorn replaces a worker that died, the file
is written again only until the replacement has read it.  The folder is removed when the
master stops.  The master also leaves its ``STM_*`` settings variables (which may hold keys)
out of the workers' environment: the workers need nothing but the file.

Workers are the master's children started by multiprocessing's spawn method (uvicorn's
supervisor), found through ``/proc``.  Without ``/proc`` the file stays until the master stops.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

from stabletoolbench_mirror.config import NOT_SETTINGS_ENV, NOT_SETTINGS_ENV_PREFIXES, Settings, deserialize_settings, serialize_settings
from stabletoolbench_mirror.core.files import write_bytes

ENV = "STM_SERVE_SETTINGS_FILE"
FILE_NAME = "settings.json"
#: how long a worker waits for the settings file to be written (again) for it
READ_TIMEOUT_S = 60.0
_POLL_S = 0.02


class SettingsHandoff:
    """The master's side: ``with SettingsHandoff(settings, workers=N): uvicorn.run(..., workers=N)``."""

    def __init__(self, settings: Settings, *, workers: int) -> None:
        self.workers = workers
        self._text = serialize_settings(settings).encode("utf-8")
        self.folder = Path(tempfile.mkdtemp(prefix="stm-serve-"))  # mode 0700, owned by this user
        self.path = self.folder / FILE_NAME
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="stm-settings-handoff", daemon=True)
        self._hidden: dict[str, str] = {}
        self._write()

    def __enter__(self) -> SettingsHandoff:
        os.environ[ENV] = str(self.path)
        for name in [n for n in os.environ if n.startswith("STM_") and n not in NOT_SETTINGS_ENV and n != ENV
                     and not n.startswith(NOT_SETTINGS_ENV_PREFIXES)]:
            self._hidden[name] = os.environ.pop(name)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        os.environ.pop(ENV, None)
        os.environ.update(self._hidden)
        shutil.rmtree(self.folder, ignore_errors=True)

    def _write(self) -> None:
        write_bytes(self.path, self._text, file_mode=0o600)  # it holds the settings' secrets

    def waiting_workers(self) -> list[int] | None:
        """Worker processes that have not read the settings yet; ``None`` when children cannot be listed."""
        children = _spawned_children()
        if children is None:
            return None
        return [pid for pid in children if not (self.folder / f"read-{pid}").exists()]

    def _watch(self) -> None:
        while not self._stop.wait(_POLL_S):
            waiting = self.waiting_workers()
            if waiting is None:
                return  # no /proc: the file stays until the master stops
            acknowledged = sum(1 for p in self.folder.iterdir() if p.name.startswith("read-"))
            present = self.path.exists()
            if waiting and not present:
                self._write()
            elif not waiting and present and acknowledged >= self.workers:
                self.path.unlink(missing_ok=True)


def read_settings_file(path: str | os.PathLike[str], *, timeout_s: float = READ_TIMEOUT_S) -> Settings:
    """The worker's side: the settings the master handed over (waiting for the file if need be), acknowledged."""
    target = Path(path)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            text = target.read_text(encoding="utf-8")
            break
        except FileNotFoundError:
            if time.monotonic() > deadline or not target.parent.is_dir():
                raise RuntimeError(f"the serve master's settings file {target} is gone (did the master stop?)") from None
            time.sleep(_POLL_S)
    settings = deserialize_settings(text)
    ack = target.parent / f"read-{os.getpid()}"
    os.close(os.open(ack, os.O_WRONLY | os.O_CREAT, 0o600))
    return settings


def _spawned_children() -> list[int] | None:
    """This process's children started by multiprocessing's spawn method (uvicorn's workers)."""
    try:
        tasks = list(Path(f"/proc/{os.getpid()}/task").iterdir())
    except OSError:
        return None
    pids: list[int] = []
    readable = False
    for task in tasks:
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        readable = True
        for child in children:
            try:
                if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
                    pids.append(int(child))
            except OSError:
                continue
    return pids if readable else None
