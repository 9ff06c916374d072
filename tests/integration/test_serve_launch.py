"""`serve --launch-vllm` wiring, with a stand-in interpreter that serves the OpenAI stub on vLLM's port.

The real vLLM run of the same command is in tests/vllm (the `vllm` tier of .ci/run).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import requests

from stabletoolbench_mirror.stores import DiskcacheStore
from tests.conftest import REPO
from tests.helpers.live import free_port

FAKE_VLLM_PYTHON = """#!/usr/bin/env bash
# stands in for an interpreter with vLLM: serves the OpenAI stub on the --port vLLM was given
port=""
while [ $# -gt 0 ]; do
  if [ "$1" = "--port" ]; then port="$2"; fi
  shift
done
echo "$$" > "{pidfile}"
exec "{python}" -m tests.helpers.openai_stub --port "$port"
"""


def test_serve_launch_vllm_starts_uses_and_stops_the_child(tmp_path: Path) -> None:
    fake = tmp_path / "fake-python"
    pidfile = tmp_path / "child.pid"
    fake.write_text(FAKE_VLLM_PYTHON.format(python=sys.executable, pidfile=pidfile))
    fake.chmod(0o755)
    cfg = tmp_path / "cfg.yml"
    cfg.write_text(f"store: {{path: {tmp_path / 'store'}}}\nsimulator: {{model: MirrorAPI, max_retries: 0}}\n")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("STM_")}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.Popen(
        [sys.executable, "-m", "stabletoolbench_mirror", "serve", "--config", str(cfg), "--port", str(port),
         "--launch-vllm", str(tmp_path / "model"), "--vllm-python", str(fake), "--vllm-startup-timeout", "60",
         "--vllm-port", str(free_port())],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                if requests.get(f"http://127.0.0.1:{port}/health", timeout=1).ok:
                    break
            except requests.ConnectionError:
                pass
            assert time.monotonic() < deadline, "serve did not start"
            time.sleep(0.2)
        health = requests.get(f"http://127.0.0.1:{port}/health", timeout=5).json()
        assert health["responders"] == ["simulated"]
        r = requests.post(f"http://127.0.0.1:{port}/virtual", timeout=30, json={
            "category": "Tools", "tool_name": "T", "api_name": "A", "tool_input": '{"x": 1}', "strip": "", "toolbench_key": ""})
        assert r.status_code == 200 and r.headers["x-stm-outcome"] == "recorded"
        assert r.json()["response"].startswith("simulated answer")
        child = int(pidfile.read_text())
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)

    def alive() -> bool:
        try:
            os.kill(child, 0)
            return Path(f"/proc/{child}/status").read_text().find("State:\tZ") < 0
        except (ProcessLookupError, FileNotFoundError):
            return False

    deadline = time.monotonic() + 30  # it is stopped with serve; generous for a busy machine
    while alive():
        assert time.monotonic() < deadline, "the launched server outlived serve by 30 s"
        time.sleep(0.05)
    with DiskcacheStore(tmp_path / "store") as store:
        assert [r.source for r in store] == ["simulated"]


def test_serve_launch_vllm_failure_is_reported(tmp_path: Path) -> None:
    fake = tmp_path / "broken-python"
    fake.write_text("#!/usr/bin/env bash\necho 'ModuleNotFoundError: No module named vllm' >&2\nexit 1\n")
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("STM_")}
    result = subprocess.run(
        [sys.executable, "-m", "stabletoolbench_mirror", "serve", "--store-path", str(tmp_path / "s"), "--port", str(free_port()),
         "--launch-vllm", str(tmp_path / "model"), "--vllm-python", str(fake), "--vllm-startup-timeout", "30",
         "--vllm-port", str(free_port())],
        env=env, capture_output=True, text=True, timeout=90, cwd=tmp_path,
    )
    assert result.returncode != 0
    assert "vLLM did not start" in result.stderr and "No module named vllm" in result.stderr


def test_serve_launch_vllm_refuses_a_busy_port(tmp_path: Path) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if not k.startswith("STM_")}
        result = subprocess.run(
            [sys.executable, "-m", "stabletoolbench_mirror", "serve", "--store-path", str(tmp_path / "s"), "--port", str(free_port()),
             "--launch-vllm", str(tmp_path / "model"), "--vllm-python", sys.executable, "--vllm-port", str(port)],
            env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path,
        )
    assert result.returncode != 0 and f"port {port}" in result.stderr


def test_serve_on_a_port_in_use_names_the_port_and_the_fix(tmp_path: Path) -> None:
    """Another server holds the port: one line naming it and `--port`, exit 2, for one worker and for several."""
    import socket

    env = {k: v for k, v in os.environ.items() if not k.startswith("STM_")}
    env["PYTHONPATH"] = str(REPO)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        for workers in ("1", "2"):
            result = subprocess.run(
                [sys.executable, "-m", "stabletoolbench_mirror", "serve", "--store-path", str(tmp_path / "s"),
                 "--port", str(port), "--workers", workers],
                env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path,
            )
            assert result.returncode == 2, (workers, result.returncode, result.stderr[-2000:])
            assert f"error: cannot listen on 127.0.0.1:{port}: port {port} is already in use" in result.stderr, result.stderr[-2000:]
            assert "--port" in result.stderr and "Errno" not in result.stderr
            assert "Uvicorn running" not in result.stderr


def test_the_troubleshooting_table_quotes_the_port_in_use_message() -> None:
    from stabletoolbench_mirror.commands.serve import listen_problem

    with socket_listening() as port:
        message = listen_problem("127.0.0.1", port)
    assert message is not None
    assert f"error: {message}".replace(str(port), "8080") in (REPO / "docs" / "troubleshooting.md").read_text()


def socket_listening():
    import contextlib
    import socket

    @contextlib.contextmanager
    def listening():
        with socket.socket() as busy:
            busy.bind(("127.0.0.1", 0))
            busy.listen()
            yield busy.getsockname()[1]

    return listening()
