"""The whole path with a real vLLM: `serve --launch-vllm`, /virtual misses simulated, recorded, replayed.

A random model's text is noise; what is checked is the protocol, the structured-output path
(strict `{error, response}` JSON), the records, the stats and determinism across server runs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from stabletoolbench_mirror.responders.simulator.vllm_launch import find_free_port, process_group_members
from stabletoolbench_mirror.stores import DiskcacheStore

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1200)]

CALLS = [
    {"category": "Weather", "tool_name": "Demo Weather", "api_name": "Current Weather", "tool_input": '{"city": "Rome"}'},
    {"category": "Tools", "tool_name": "Demo Unit Converter", "api_name": "Convert Length",
     "tool_input": '{"value": 3, "from_unit": "m", "to_unit": "ft"}'},
    {"category": "Data", "tool_name": "Some Unknown Tool", "api_name": "Lookup", "tool_input": '{"q": "x"}'},
]
REPO = Path(__file__).resolve().parents[2]


def _config(tmp: Path, store: Path) -> Path:
    cfg = tmp / f"config-{store.name}.yml"
    cfg.write_text(
        f"mode: record\nlog_level: info\nstore: {{path: {store}}}\ntools_folder: {REPO / 'cache' / 'tools'}\n"
        "simulator:\n  enabled: true\n  style: mirrorapi-sft\n  model: MirrorAPI\n  temperature: 0\n  seed: 7\n"
        "  max_tokens: 256\n  structured_output: true\n  structured_max_chars: 64\n  read_timeout_s: 120\n"
        # the random-weight model writes gibberish into "error" too: this pins the pipeline, not the
        # validity rules for simulated answers (tests/integration/test_failure_records.py covers those)
        "  validity: 'off'\n"
    )
    return cfg


def _serve(cfg: Path, model: Path, vllm_python: str, port: int, log: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STM_")}
    cmd = [
        sys.executable, "-m", "stabletoolbench_mirror", "serve", "--config", str(cfg), "--port", str(port),
        "--launch-vllm", str(model), "--vllm-python", vllm_python, "--vllm-port", str(find_free_port()),
        "--vllm-arg=--dtype=float32", "--vllm-arg=--enforce-eager",
        "--vllm-arg=--structured-outputs-config",
        '--vllm-arg={"backend": "guidance", "disable_any_whitespace": true}',
        "--vllm-log", str(log),
    ]
    proc = subprocess.Popen(cmd, env=env, stdout=open(log.with_suffix(".serve.log"), "w"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError("serve exited:\n" + log.with_suffix(".serve.log").read_text()[-4000:])
        try:
            if requests.get(f"http://127.0.0.1:{port}/health", timeout=2).ok:
                return proc
        except requests.ConnectionError:
            pass
        time.sleep(1)
    proc.kill()
    raise AssertionError("serve --launch-vllm did not become ready")


def _vllm_pids(serve_pid: int) -> list[int]:
    out = subprocess.run(["ps", "-eo", "pid,ppid,args"], capture_output=True, text=True).stdout
    return [int(line.split()[0]) for line in out.splitlines()[1:]
            if int(line.split()[1]) == serve_pid and "vllm.entrypoints" in line]


def _run_once(tmp: Path, name: str, model: Path, vllm_python: str) -> tuple[list[str], Path]:
    store = tmp / name
    port = find_free_port()
    proc = _serve(_config(tmp, store), model, vllm_python, port, tmp / f"{name}.log")
    bodies = []
    try:
        children = _vllm_pids(proc.pid)
        assert children, "no vLLM child process found"
        for call in CALLS:
            r = requests.post(f"http://127.0.0.1:{port}/virtual", json={**call, "strip": "", "toolbench_key": ""}, timeout=300)
            assert r.status_code == 200
            assert r.headers["x-stm-outcome"] == "recorded", r.text
            answer = json.loads(r.text)
            assert list(answer) == ["error", "response"]
            assert all(isinstance(v, str) for v in answer.values())
            bodies.append(r.text)
            # a second identical call is a cache hit with the same bytes
            again = requests.post(f"http://127.0.0.1:{port}/virtual", json={**call, "strip": "", "toolbench_key": ""}, timeout=60)
            assert again.headers["x-stm-outcome"] == "hit" and again.text == r.text
        stats = requests.get(f"http://127.0.0.1:{port}/stats", timeout=10).json()
        assert stats["misses"] == len(CALLS) and stats["recorded"] == len(CALLS) and stats["hits"] == len(CALLS)
        assert stats["by_source"] == {"simulated": 2 * len(CALLS)}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=120)
    time.sleep(1)
    for pid in children:
        assert process_group_members(pid) == [], "vLLM outlived serve"
    return bodies, store


def test_serve_launch_vllm_records_and_replays_deterministically(vllm_python: str, tiny_model: Path, tmp_path: Path) -> None:
    first, store = _run_once(tmp_path, "store-a", tiny_model, vllm_python)
    with DiskcacheStore(store) as s:
        records = list(s)
    assert len(records) == len(CALLS)
    assert {r.source for r in records} == {"simulated"} and {r.origin for r in records} == {"MirrorAPI"}
    assert sorted(r.body for r in records) == sorted(first)

    second, _ = _run_once(tmp_path, "store-b", tiny_model, vllm_python)
    assert second == first, "same seed, same model: a second server run must give the same answers"
