"""Launch a real vLLM OpenAI-compatible server in a subprocess (``serve --launch-vllm``).

The structured-output request fields live with the prompts (:mod:`.prompts`).

vLLM is never imported here: the server runs under another interpreter (``python=`` or the
``STM_VLLM_PYTHON`` environment variable), so this module works in environments without vLLM.
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

import requests

__all__ = [
    "VllmLaunchError",
    "VllmServer",
    "find_free_port",
    "process_group_members",
]

PYTHON_ENV_VAR = "STM_VLLM_PYTHON"
#: the server listens on loopback only: the mirror in this process is its one client
HOST = "127.0.0.1"
API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
LOG_TAIL_LINES = 40
# Offline, no telemetry; the KV cache size is required on CPU (see shared notes on vLLM-on-CPU).
DEFAULT_ENV: Mapping[str, str] = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
}



class VllmLaunchError(RuntimeError):
    """The vLLM server exited or did not become ready in time."""


def find_free_port() -> int:
    """Return a TCP port that is free on loopback right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def _log_tail(path: str) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 64 * 1024))
            data = handle.read()
    except OSError as exc:
        return f"<log unreadable: {exc}>"
    return "\n".join(data.decode("utf-8", "replace").splitlines()[-LOG_TAIL_LINES:])


def process_group_members(pgid: int) -> list[int]:
    """Pids of the live (non-zombie) processes in group ``pgid`` (Linux /proc; else a signal probe)."""
    if not os.path.isdir("/proc/self"):
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return []
        return [pgid]
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                stat = handle.read().decode("utf-8", "replace")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()  # state ppid pgrp ...
        if len(fields) >= 3 and fields[0] not in ("Z", "X") and int(fields[2]) == pgid:
            members.append(int(entry))
    return members


class VllmServer:
    """A ``vllm.entrypoints.openai.api_server`` child process; ready once a real chat completion works."""

    def __init__(
        self,
        model_path: str,
        *,
        port: int,
        served_model_name: str = "MirrorAPI",
        python: str | None = None,
        max_model_len: int = 4096,
        extra_args: Sequence[str] = (),
        startup_timeout: float = 900.0,
        log_path: str | None = None,
        stop_timeout: float = 15.0,
        poll_interval: float = 1.0,
    ) -> None:
        self.model_path = model_path
        self.port = port
        self.served_model_name = served_model_name
        self.python = python or os.environ.get(PYTHON_ENV_VAR) or sys.executable
        self.max_model_len = max_model_len
        self.extra_args = tuple(extra_args)
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.poll_interval = poll_interval
        self._log_path = log_path
        self._proc: subprocess.Popen[bytes] | None = None

    # -- properties -------------------------------------------------------------------------------
    @property
    def api_base(self) -> str:
        return f"http://{HOST}:{self.port}/v1"

    @property
    def log_path(self) -> str | None:
        return self._log_path

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    # -- command and environment -------------------------------------------------------------------
    def command(self) -> list[str]:
        cmd = [
            self.python, "-m", API_SERVER_MODULE,
            "--model", self.model_path,
            "--served-model-name", self.served_model_name,
            "--host", HOST,
            "--port", str(self.port),
            "--max-model-len", str(self.max_model_len),
        ]  # fmt: skip
        return cmd + list(self.extra_args)

    def child_env(self) -> dict[str, str]:
        merged = dict(os.environ)
        for key, value in DEFAULT_ENV.items():
            merged.setdefault(key, value)
        return merged

    # -- lifecycle ----------------------------------------------------------------------------------
    def start(self) -> VllmServer:
        """Spawn the server and block until it serves a chat completion; raise VllmLaunchError otherwise."""
        if self._proc is not None:
            raise VllmLaunchError("VllmServer.start() called twice")
        if self._log_path is None:
            fd, self._log_path = tempfile.mkstemp(prefix="vllm-server-", suffix=".log")
            os.close(fd)
        with open(self._log_path, "ab") as log:
            self._proc = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.child_env(),
                start_new_session=True,
            )
        atexit.register(self.stop)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _probe(self, timeout: float) -> str | None:
        """Send one 1-token chat completion; None when it succeeded, else why not."""
        body: dict[str, Any] = {
            "model": self.served_model_name,
            "messages": [{"role": "user", "content": "ping"}],
            "max_tokens": 1,
            "temperature": 0,
        }
        try:
            resp = requests.post(
                f"{self.api_base}/chat/completions", json=body, timeout=timeout
            )
        except requests.RequestException as exc:
            return f"{type(exc).__name__}: {exc}"
        if resp.status_code != 200:
            return f"HTTP {resp.status_code}: {resp.text[:200]}"
        try:
            choices = resp.json().get("choices")
        except ValueError:
            return "response is not JSON"
        return None if choices else "response has no choices"

    def _wait_ready(self) -> None:
        assert self._proc is not None
        start = time.monotonic()
        deadline = start + self.startup_timeout
        last = "no probe sent yet"
        while True:
            code = self._proc.poll()
            if code is not None:
                raise self._error(
                    f"vLLM server exited with code {code} before it was ready"
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._error(
                    f"vLLM server not ready after {self.startup_timeout:.0f} s (last probe: {last})"
                )
            last = self._probe(timeout=max(1.0, min(60.0, remaining))) or ""
            if not last:
                return
            time.sleep(min(self.poll_interval, max(0.0, deadline - time.monotonic())))

    def _error(self, message: str) -> VllmLaunchError:
        tail = _log_tail(self._log_path) if self._log_path else ""
        return VllmLaunchError(
            f"{message}\ncommand: {' '.join(self.command())}\n"
            f"--- last {LOG_TAIL_LINES} lines of {self._log_path} ---\n{tail}"
        )

    def stop(self) -> None:
        """SIGTERM the process group, SIGKILL after ``stop_timeout`` s. Safe to call repeatedly."""
        proc = self._proc
        if proc is None:
            return
        atexit.unregister(self.stop)
        pgid = proc.pid  # start_new_session=True: the child leads its own group
        deadline = time.monotonic() + self.stop_timeout
        self._signal_group(pgid, signal.SIGTERM)
        try:
            proc.wait(timeout=self.stop_timeout)
        except subprocess.TimeoutExpired:
            pass
        # Give the rest of the group (engine workers) the remaining grace, then kill what is left.
        while process_group_members(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        self._signal_group(pgid, signal.SIGKILL)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self._proc = None

    @staticmethod
    def _signal_group(pgid: int, sig: signal.Signals) -> None:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def __enter__(self) -> VllmServer:  # noqa: PYI034 (3.10 has no typing.Self)
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
