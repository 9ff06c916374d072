"""A real ``redis-server`` on 127.0.0.1 for tests and benchmarks: its own port and data folder.

The server keeps its data in an append-only file in ``data_dir`` (``appendonly yes``; a
SIGTERM stop flushes it), so :meth:`RedisServer.stop` followed by :meth:`RedisServer.start` is a restart of the
same instance with the same data on the same port.

When the ``redis-server`` binary is missing, :func:`require_redis_server` skips the
test on a developer machine and fails it in CI (``$CI`` set), where ``.ci/run``
installs the Debian package.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.live import free_port


def require_redis_server() -> str:
    """The ``redis-server`` path; skip (locally) or fail (CI) when it is not installed."""
    path = shutil.which("redis-server")
    if path is None:
        message = "redis-server is not installed (Debian: apt-get install redis-server)"
        if os.environ.get("CI"):
            pytest.fail(message + "; .ci/run must install it", pytrace=False)
        pytest.skip(message)
    return path


class RedisServer:
    """One ``redis-server`` process; ``url`` stays valid across :meth:`stop` / :meth:`start`."""

    def __init__(self, data_dir: str | os.PathLike[str] | None = None, *, port: int | None = None, binary: str | None = None, appendfsync: str = "everysec") -> None:
        self.appendfsync = appendfsync
        self.binary = binary or shutil.which("redis-server") or "redis-server"
        self._own_dir = data_dir is None
        self.data_dir = Path(data_dir) if data_dir is not None else Path(tempfile.mkdtemp(prefix="stm-redis-"))
        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 15.0) -> RedisServer:
        if self.process is not None and self.process.poll() is None:
            return self
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = [
            self.binary,
            "--bind", "127.0.0.1",
            "--port", str(self.port),
            "--dir", str(self.data_dir),
            "--save", "",
            "--appendonly", "yes",
            "--appendfsync", self.appendfsync,
            "--protected-mode", "yes",
            "--daemonize", "no",
            "--loglevel", "warning",
            "--logfile", str(self.data_dir / "redis.log"),
        ]
        self.process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                err = self.process.stderr.read().decode(errors="replace") if self.process.stderr else ""
                raise RuntimeError(f"redis-server exited at start ({self.process.returncode}): {err} {self._log_tail()}")
            if self._ping():
                return self
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"redis-server did not answer PING on port {self.port}: {self._log_tail()}")

    def _ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def _log_tail(self) -> str:
        try:
            return (self.data_dir / "redis.log").read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def stop(self, timeout_s: float = 15.0) -> None:
        """Stop gracefully (SIGTERM: redis flushes its append-only file), then wait."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=timeout_s)
        if self.process.stderr:
            self.process.stderr.close()
        self.process = None

    def kill(self) -> None:
        """Stop abruptly (SIGKILL)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=15)
        self.stop()

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def close(self) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One ``redis-server`` for a test session (tests separate their data by key prefix)."""
    require_redis_server()
    with RedisServer() as server:
        yield server


@pytest.fixture
def redis_prefix(request: pytest.FixtureRequest) -> str:
    """A key prefix of this test's own."""
    import uuid

    return f"test-{request.node.name[:40]}-{uuid.uuid4().hex[:8]}"
