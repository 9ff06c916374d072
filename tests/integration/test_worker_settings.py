"""`serve --workers N` hands its settings (keys included) to the workers in a private file, never in the
environment; the file is gone once the workers have started, and a replacement worker still gets them."""

from __future__ import annotations

import os
import signal
import stat
import time
from pathlib import Path

import requests

from stabletoolbench_mirror.serving.handoff import ENV, SettingsHandoff, read_settings_file
from tests.conftest import make_settings
from tests.helpers.processes import ServeProcess

FILE_KEY = "sk-FILEKEY-4d1c8a2e9b"  # in the config file
ENV_KEY = "AUTHTOKEN-ENV-7a3b9c0d"  # in the master's environment


def environ(pid: int) -> bytes:
    return Path(f"/proc/{pid}/environ").read_bytes()


def handover_file(pid: int) -> Path:
    """The settings file a worker was told about (the only trace of the hand-over in its environment)."""
    for entry in environ(pid).split(b"\0"):
        if entry.startswith(ENV.encode() + b"="):
            return Path(entry.split(b"=", 1)[1].decode())
    raise AssertionError(f"worker {pid} has no {ENV}")


def wait_until(condition, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_workers_get_keys_from_a_private_file_that_is_gone_after_start(tmp_path: Path) -> None:
    config = {"store": {"path": str(tmp_path / "store")}, "simulator": {"enabled": False, "api_key": FILE_KEY}}
    with ServeProcess(tmp_path, config, workers=2, env={"STM_AUTH_TOKEN": ENV_KEY}) as server:
        workers = server.worker_pids()
        assert len(workers) == 2
        for pid in workers:
            text = environ(pid)
            assert FILE_KEY.encode() not in text and ENV_KEY.encode() not in text
            assert b"STM_AUTH_TOKEN" not in text
        path = handover_file(workers[0])
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        wait_until(lambda: not path.exists(), "the settings file is still there after the workers started")
        # the workers really have the keys: the token from the environment guards every endpoint
        assert requests.get(server.url + "/health", timeout=5).status_code == 401
        assert requests.get(server.url + "/health", headers=server.headers, timeout=5).status_code == 200

        # a worker that dies is replaced, and the replacement gets the settings too
        os.kill(workers[0], signal.SIGKILL)
        wait_until(lambda: len(set(server.worker_pids()) - set(workers)) == 1 and len(server.worker_pids()) == 2, "no replacement worker")
        (replacement,) = set(server.worker_pids()) - set(workers)
        assert FILE_KEY.encode() not in environ(replacement) and ENV_KEY.encode() not in environ(replacement)
        wait_until(lambda: (path.parent / f"read-{replacement}").exists(), "the replacement never read the settings")
        wait_until(lambda: not path.exists(), "the settings file was left behind after the replacement started")
        for _ in range(20):  # whichever worker takes the connection, it answers with the same settings
            assert requests.get(server.url + "/health", headers=server.headers, timeout=5).status_code == 200
        folder = path.parent
    assert not folder.exists()  # the master removed its hand-over folder when it stopped


def test_the_file_is_private_and_read_back_whole(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, auth_token="tok-12345678", simulator={"api_key": FILE_KEY, "enabled": True})
    with SettingsHandoff(settings, workers=1) as handoff:
        assert stat.S_IMODE(handoff.path.stat().st_mode) == 0o600
        assert stat.S_IMODE(handoff.folder.stat().st_mode) == 0o700
        assert os.environ[ENV] == str(handoff.path)
        got = read_settings_file(handoff.path)
        assert got.simulator.api_key.get_secret_value() == FILE_KEY and got.auth_token.get_secret_value() == "tok-12345678"
        assert got.model_dump() == settings.model_dump() and got.base_dir == settings.base_dir
        assert (handoff.folder / f"read-{os.getpid()}").exists()
    assert ENV not in os.environ and not handoff.folder.exists()
