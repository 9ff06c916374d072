"""Real-vLLM tier: a tiny random Qwen2 model served by vLLM's OpenAI server, driven over HTTP.

Run with ``STM_VLLM_PYTHON=/path/to/vllm-venv/bin/python python -m pytest -m vllm tests/vllm``.
Skips when STM_VLLM_PYTHON is unset or cannot import vllm (set STM_VLLM_REQUIRED=1 to fail instead).
A random model's text is noise, so these tests check the protocol, schema-constrained JSON and
determinism, not content.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from stabletoolbench_mirror.responders.simulator.prompts import structured_output_fields
from stabletoolbench_mirror.responders.simulator.vllm_launch import (
    VllmServer,
    find_free_port,
    process_group_members,
)

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

HERE = Path(__file__).resolve().parent
MAX_LENGTH = 64
SERVED_NAME = "MirrorAPI"


@pytest.fixture(scope="module")
def server(vllm_python: str, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    python = vllm_python
    model_dir = tiny_model
    work = tmp_path_factory.mktemp("vllm-tier")
    srv = VllmServer(
        str(model_dir),
        port=find_free_port(),
        served_model_name=SERVED_NAME,
        python=python,
        extra_args=["--dtype", "float32", "--enforce-eager", "--structured-outputs-config",
                    json.dumps({"backend": "guidance", "disable_any_whitespace": True})],
        startup_timeout=600,
        log_path=str(work / "vllm-server.log"),
    )
    srv.start()
    pid = srv.pid
    assert pid is not None
    try:
        yield srv
    finally:
        srv.stop()
    assert process_group_members(pid) == [], "vLLM processes survived stop()"
    print(f"vLLM server log: {srv.log_path}", file=sys.stderr)


def _chat(server: VllmServer, cot: bool, content: str, seed: int = 1234) -> str:
    body = {
        "model": SERVED_NAME,
        "messages": [
            {"role": "system", "content": "You are an API simulator. Answer in JSON."},
            {"role": "user", "content": content},
        ],
        "temperature": 0,
        "seed": seed,
        "max_tokens": 512,
        **structured_output_fields(cot, MAX_LENGTH),
    }
    resp = requests.post(f"{server.api_base}/chat/completions", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    assert choice["finish_reason"] == "stop", choice
    text = choice["message"]["content"]
    assert isinstance(text, str)
    return text


def test_models_endpoint_lists_served_name(server: VllmServer) -> None:
    resp = requests.get(f"{server.api_base}/models", timeout=30)
    assert resp.status_code == 200
    assert [m["id"] for m in resp.json()["data"]] == [SERVED_NAME]


def test_structured_output_is_strict_json(server: VllmServer) -> None:
    for query in ("GET /weather?city=Paris", 'POST /users {"name": "a"}'):
        text = _chat(server, False, query)
        obj = json.loads(text)  # strict: no raw control characters allowed
        assert set(obj) == {"error", "response"}
        assert all(isinstance(v, str) and len(v) <= MAX_LENGTH for v in obj.values())


def test_same_request_gives_identical_output(server: VllmServer) -> None:
    first = _chat(server, False, "GET /stocks/ACME")
    second = _chat(server, False, "GET /stocks/ACME")
    assert first == second


def test_chain_of_thought_schema_keeps_field_order(server: VllmServer) -> None:
    text = _chat(server, True, "GET /time")
    assert list(json.loads(text)) == ["mechanism_of_the_api", "error", "response"]
