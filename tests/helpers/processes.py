"""The mirror and the OpenAI stub as real processes on 127.0.0.1 (``serve --workers N``, kill -9, limits)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import requests

from tests.helpers.live import free_port

REPO = Path(__file__).resolve().parents[2]


def popen_as_from_a_terminal(args: list[str], **kwargs: Any) -> subprocess.Popen:
    """``subprocess.Popen`` with SIGINT at its default disposition, as a command started from a terminal has it.

    A job started in the background by a non-interactive shell (a CI runner) hands SIGINT down
    *ignored*, and Python then never raises ``KeyboardInterrupt``: a Ctrl-C test needs the default.
    """
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return subprocess.Popen(args, **kwargs)
    finally:
        signal.signal(signal.SIGINT, inherited)


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STM_")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _wait_http(url: str, proc: subprocess.Popen[bytes], timeout_s: float, what: str, log: Path, headers: dict[str, str] | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited ({proc.returncode}): {log.read_text(errors='replace')[-3000:]}")
        try:
            if requests.get(url, headers=headers, timeout=1).ok:
                return
        except requests.RequestException:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not answer {url}: {log.read_text(errors='replace')[-3000:]}")


def _stop_group(proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=timeout_s)
        except ProcessLookupError:
            pass
    try:  # leftovers of the group (workers of a killed master)
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class StubProcess:
    """``python -m tests.helpers.openai_stub`` in its own process."""

    def __init__(self, workdir: Path, *, latency_ms: float = 0.0, echo_prompt: bool = True, port: int | None = None) -> None:
        self.port = port or free_port()
        self.api_base = f"http://127.0.0.1:{self.port}/v1"
        self.log = workdir / f"stub-{self.port}.log"
        self.args = [sys.executable, "-m", "tests.helpers.openai_stub", "--port", str(self.port), "--latency-ms", str(latency_ms)]
        if echo_prompt:
            self.args.append("--echo-prompt")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> StubProcess:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.args, cwd=REPO, env=_clean_env(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        _wait_http(self.api_base + "/models", self.proc, 30, "openai stub", self.log)
        return self

    def stop(self) -> None:
        if self.proc is not None:
            _stop_group(self.proc)
            self.proc = None

    def __enter__(self) -> StubProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ServeProcess:
    """``stabletoolbench-mirror serve --config FILE --workers N`` in its own process group."""

    def __init__(
        self, workdir: Path, config: dict[str, Any], *, workers: int = 1, port: int | None = None, env: dict[str, str] | None = None
    ) -> None:
        """``env``: extra environment variables (e.g. ``STM_*`` keys) on top of a clean environment."""
        self.port = port or free_port()
        self.env = env or {}
        token = self.env.get("STM_AUTH_TOKEN")
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        """What a request to this server needs (the bearer token of ``STM_AUTH_TOKEN``)."""
        self.url = f"http://127.0.0.1:{self.port}"
        self.workers = workers
        self.config_file = workdir / f"server-{self.port}.yml"
        self.config_file.write_text(json.dumps({"port": self.port, "log_level": "warning", **config}))  # JSON is YAML
        self.log = workdir / f"server-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 60.0) -> ServeProcess:
        args = [sys.executable, "-m", "stabletoolbench_mirror", "serve", "--config", str(self.config_file), "--workers", str(self.workers)]
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                args, cwd=REPO, env={**_clean_env(), **self.env}, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        _wait_http(self.url + "/health", self.proc, timeout_s, "mirror server", self.log, self.headers)
        if self.workers > 1:
            deadline = time.monotonic() + timeout_s
            while len(self.worker_pids()) < self.workers:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"only {len(self.worker_pids())} of {self.workers} workers started")
                time.sleep(0.05)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def worker_pids(self) -> list[int]:
        """The uvicorn worker processes (children of the master started by multiprocessing spawn)."""
        pids = []
        for task in Path(f"/proc/{self.pid}/task").iterdir():
            try:
                children = (task / "children").read_text().split()
            except OSError:
                continue
            for child in children:
                try:
                    cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
                except OSError:
                    continue
                if b"spawn_main" in cmdline:
                    pids.append(int(child))
        return sorted(pids)

    def stop(self) -> None:
        if self.proc is not None:
            _stop_group(self.proc)
            self.proc = None

    def __enter__(self) -> ServeProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
