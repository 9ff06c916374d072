"""The suite never needs the README's port (8080) free: it runs with 127.0.0.1:8080 taken (``tests/conftest.py``'s
``_readme_port_taken``, or the README's own server), so a test that assumes it free fails in every run."""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
from pathlib import Path

import requests

from tests.conftest import README_PORT
from tests.helpers.paths import REPO


def test_the_readme_port_is_taken_while_the_suite_runs() -> None:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", README_PORT))
        except OSError as exc:
            assert exc.errno == errno.EADDRINUSE, exc
        else:
            raise AssertionError(f"127.0.0.1:{README_PORT} was free: the suite's guard is not holding it")
    answered = requests.get(f"http://127.0.0.1:{README_PORT}/health", timeout=10)
    assert answered.status_code in (200, 503)  # the guard's 503, or the README's own server


def test_serve_with_the_default_port_is_refused_naming_it(tmp_path: Path) -> None:
    """What a test that starts ``serve`` without a port of its own meets: the port check comes first."""
    config = tmp_path / "c.yml"
    config.write_text(f"store:\n  path: {tmp_path / 'store'}\nlog_level: warning\n")
    done = subprocess.run([sys.executable, "-m", "stabletoolbench_mirror", "serve", "--config", str(config)], cwd=REPO,
                          env={k: v for k, v in os.environ.items() if not k.startswith("STM_")}, capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode != 0 and f"port {README_PORT} is already in use" in done.stderr, done.stderr[-2000:]
