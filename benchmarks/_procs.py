"""Processes for benchmarks: free loopback ports, a clean environment, servers started and stopped."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env() -> dict[str, str]:
    """This environment without ``STM_*`` variables, so a benchmark's config file is all that counts."""
    return {k: v for k, v in os.environ.items() if not k.startswith("STM_")}


def wait_http(url: str, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    """Wait until ``url`` answers 200; fail when ``proc`` exits or the time is up."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited with {proc.returncode}")
        try:
            if requests.get(url, timeout=1).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{url} did not come up")


@contextmanager
def process(args: Sequence[str], ready_url: str, *, env: dict[str, str] | None = None,
            cwd: Path | None = None) -> Iterator[subprocess.Popen]:
    """Run ``args`` (in its own process group, from ``cwd``, default the repo root) while it answers ``ready_url``.

    (``python -m`` puts the working folder first on ``sys.path``: a server of another checkout must
    run from that checkout, or it imports this one's package.)

    On exit the whole group gets SIGTERM (uvicorn workers included), then SIGKILL after 30 s;
    what the process wrote to stderr is shown when it did not end normally.
    """
    log = tempfile.TemporaryFile(mode="w+")  # a file, not a pipe: a chatty server never blocks on it
    proc = subprocess.Popen(list(args), cwd=cwd or REPO, env=clean_env() if env is None else env,
                            stdout=subprocess.DEVNULL, stderr=log, text=True, start_new_session=True)
    try:
        wait_http(ready_url, proc)
        yield proc
    finally:
        _signal_group(proc, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            _signal_group(proc, signal.SIGKILL)
            proc.wait(timeout=10)
        if proc.returncode not in (0, -signal.SIGTERM):
            log.seek(0)
            print(log.read()[-2000:], file=sys.stderr)
        log.close()


def _signal_group(proc: subprocess.Popen, sig: signal.Signals) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def serve_args(config: Path, *extra: str) -> list[str]:
    """``stabletoolbench-mirror serve --config CONFIG ...`` with this interpreter."""
    return [sys.executable, "-m", "stabletoolbench_mirror", "serve", "--config", str(config), *extra]


def serve_checkout(checkout: Path, config: Path, port: int) -> contextlib.AbstractContextManager[subprocess.Popen]:
    """``serve`` of another checkout (its own package through ``PYTHONPATH``, run from its folder) on 127.0.0.1:``port``."""
    env = clean_env()
    env["PYTHONPATH"] = str(checkout)
    args = serve_args(config, "--host", "127.0.0.1", "--port", str(port))
    return process(args, f"http://127.0.0.1:{port}/health", env=env, cwd=checkout)  # its own package, not this one's


def stub_args(port: int, latency_ms: float) -> list[str]:
    """The OpenAI-compatible stub (tests/helpers/openai_stub.py) answering after ``latency_ms``."""
    return [sys.executable, "-m", "tests.helpers.openai_stub", "--port", str(port), "--latency-ms", str(latency_ms)]
