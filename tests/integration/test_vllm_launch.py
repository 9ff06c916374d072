"""Launcher behaviour without vLLM: fake "python" executables that run real local HTTP servers."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from stabletoolbench_mirror.responders.simulator.vllm_launch import (
    VllmLaunchError,
    VllmServer,
    find_free_port,
    process_group_members,
)

FAKE_SERVER = r"""
import json, os, signal, subprocess, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODE, STATE = sys.argv[1], sys.argv[2]
args = sys.argv[3:]
opt = lambda flag: args[args.index(flag) + 1]
name = opt("--served-model-name")
# A second process in the same group, like vLLM's engine core.
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
keys = ["HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "VLLM_NO_USAGE_STATS", "DO_NOT_TRACK",
        "VLLM_CPU_KVCACHE_SPACE", "STM_EXTRA"]
with open(STATE, "w") as fh:
    json.dump({"argv": args, "env": {k: os.environ.get(k) for k in keys},
               "pid": os.getpid(), "child": child.pid, "pgid": os.getpgid(0)}, fh)
if MODE == "ignore_term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


class Handler(BaseHTTPRequestHandler):
    def reply(self, code, payload):
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/v1/models":
            self.reply(200, {"object": "list", "data": [{"id": name, "object": "model"}]})
        else:
            self.reply(404, {"error": "not found"})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path != "/v1/chat/completions":
            self.reply(404, {"error": "not found"})
        elif MODE == "broken":
            self.reply(500, {"error": "EngineCore died"})
        elif body.get("model") != name:
            self.reply(404, {"error": "unknown model " + str(body.get("model"))})
        else:
            self.reply(200, {"object": "chat.completion", "choices": [{"index": 0,
                "message": {"role": "assistant", "content": "p"}, "finish_reason": "length"}]})

    def log_message(self, fmt, *a):
        sys.stderr.write("fake vllm: " + (fmt % a) + "\n")


print("fake vllm: listening on", opt("--port"), flush=True)
ThreadingHTTPServer((opt("--host"), int(opt("--port"))), Handler).serve_forever()
"""


def _write_exe(path: Path, text: str) -> str:
    path.write_text(text)
    path.chmod(0o755)
    return str(path)


def fake_python(tmp_path: Path, mode: str) -> tuple[str, Path]:
    """An executable that vLLM's command line can run in place of python; it serves HTTP."""
    server = tmp_path / "fake_server.py"
    server.write_text(FAKE_SERVER)
    state = tmp_path / "state.json"
    # Our launcher passes `-m vllm.entrypoints.openai.api_server ...`: drop `-m MODULE`.
    exe = _write_exe(
        tmp_path / f"fake-python-{mode}",
        f'#!/bin/sh\nshift 2\nexec "{sys.executable}" "{server}" {mode} "{state}" "$@"\n',
    )
    return exe, state


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"


def _make(tmp_path: Path, python: str, **kwargs: Any) -> VllmServer:
    kwargs.setdefault("startup_timeout", 30)
    kwargs.setdefault("poll_interval", 0.1)
    return VllmServer(
        str(tmp_path / "model"),
        port=find_free_port(),
        python=python,
        log_path=str(tmp_path / "server.log"),
        **kwargs,
    )


def test_child_that_exits_raises_with_log_tail(tmp_path: Path) -> None:
    exe = _write_exe(
        tmp_path / "dying-python",
        "#!/bin/sh\nfor i in $(seq 1 100); do echo noise line $i; done\n"
        'echo "RuntimeError: fake engine failure" >&2\nexit 3\n',
    )
    server = _make(tmp_path, exe)
    start = time.monotonic()
    with pytest.raises(VllmLaunchError) as info:
        server.start()
    message = str(info.value)
    assert time.monotonic() - start < 10
    assert "exited with code 3" in message
    assert "RuntimeError: fake engine failure" in message
    assert (
        "noise line 100" in message and "noise line 50" not in message
    )  # only the tail
    assert server.pid is None


def test_models_ok_but_chat_500_is_not_ready(tmp_path: Path) -> None:
    exe, state = fake_python(tmp_path, "broken")
    server = _make(tmp_path, exe, startup_timeout=3)
    start = time.monotonic()
    with pytest.raises(VllmLaunchError) as info:
        server.start()
    elapsed = time.monotonic() - start
    message = str(info.value)
    assert 3 <= elapsed < 20
    assert "not ready after 3 s" in message and "HTTP 500" in message
    assert "fake vllm: listening" in message
    record = json.loads(state.read_text())
    # The failed start cleaned up the whole group.
    assert not _alive(record["pid"]) and not _alive(record["child"])


def test_ready_server_and_stop_kills_process_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # an explicit caller setting is kept
    monkeypatch.setenv("STM_EXTRA", "yes")
    exe, state = fake_python(tmp_path, "ok")
    structured = json.dumps({"backend": "guidance", "disable_any_whitespace": True})
    server = _make(
        tmp_path,
        exe,
        served_model_name="Mirror-Test",
        extra_args=["--dtype", "float32", "--enforce-eager", "--structured-outputs-config", structured, "--seed", "0"],
    )
    with server:
        assert server.pid is not None and _alive(server.pid)
        assert server.api_base == f"http://127.0.0.1:{server.port}/v1"
        record = json.loads(state.read_text())
        assert record["pgid"] == record["pid"] == server.pid  # its own session/group
        assert _alive(record["child"]) and server.pid is not None
        assert sorted(process_group_members(server.pid)) == sorted(
            [record["pid"], record["child"]]
        )
        argv = record["argv"]
        assert argv[argv.index("--served-model-name") + 1] == "Mirror-Test"
        assert argv[argv.index("--port") + 1] == str(server.port)
        assert argv[argv.index("--max-model-len") + 1] == "4096"
        assert argv[argv.index("--dtype") + 1] == "float32"
        assert "--enforce-eager" in argv and argv[-2:] == ["--seed", "0"]
        config = json.loads(argv[argv.index("--structured-outputs-config") + 1])
        assert config == {"backend": "guidance", "disable_any_whitespace": True}
        assert record["env"] == {
            "HF_HUB_OFFLINE": "0",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "STM_EXTRA": "yes",
        }
    assert server.pid is None
    assert not _alive(record["pid"]) and not _alive(record["child"])
    assert process_group_members(record["pgid"]) == []
    server.stop()  # idempotent


def test_stop_escalates_to_sigkill(tmp_path: Path) -> None:
    exe, state = fake_python(tmp_path, "ignore_term")
    server = _make(tmp_path, exe, stop_timeout=1.0).start()
    record = json.loads(state.read_text())
    start = time.monotonic()
    server.stop()
    assert 1.0 <= time.monotonic() - start < 10
    assert not _alive(record["pid"]) and not _alive(record["child"])


def test_start_twice_is_an_error(tmp_path: Path) -> None:
    exe, _ = fake_python(tmp_path, "ok")
    with _make(tmp_path, exe) as server, pytest.raises(VllmLaunchError):
        server.start()


def test_python_selection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STM_VLLM_PYTHON", raising=False)
    assert VllmServer("m", port=1).python == sys.executable
    monkeypatch.setenv("STM_VLLM_PYTHON", "/opt/x/bin/python")
    assert VllmServer("m", port=1).python == "/opt/x/bin/python"
    assert VllmServer("m", port=1, python="/usr/bin/py").python == "/usr/bin/py"
    command = VllmServer("m", port=1).command()
    assert command[:3] == [
        "/opt/x/bin/python",
        "-m",
        "vllm.entrypoints.openai.api_server",
    ]
    assert "--dtype" not in command and "--enforce-eager" not in command
    assert command[command.index("--host") + 1] == "127.0.0.1"
    assert VllmServer("m", port=8).api_base == "http://127.0.0.1:8/v1"


def test_default_log_file_is_created(tmp_path: Path) -> None:
    exe = _write_exe(tmp_path / "quick", "#!/bin/sh\necho bye\nexit 0\n")
    server = VllmServer("m", port=find_free_port(), python=exe, startup_timeout=5)
    with pytest.raises(VllmLaunchError, match="bye"):
        server.start()
    assert server.log_path is not None and os.path.isfile(server.log_path)
    os.unlink(server.log_path)

