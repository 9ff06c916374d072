"""`warm --engine vllm-offline` with a real vLLM in-process engine and a tiny random model.

The warm command runs under the vLLM interpreter (``$STM_VLLM_PYTHON``) with this checkout on
``PYTHONPATH``; project dependencies that venv lacks (diskcache, rapidfuzz, ...) are linked
in from this interpreter's site-packages (same Python version required).  A random model's
text is noise: checked are the records (strict ``{error, response}`` through structured
output), resumption without loading the model, and determinism across runs.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stabletoolbench_mirror.stores import DiskcacheStore

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1500)]

REPO = Path(__file__).resolve().parents[2]
DEPENDENCIES = ("diskcache", "rapidfuzz", "pydantic", "yaml", "requests", "tqdm", "fastapi", "uvicorn")


def overlay(vllm_python: str, folder: Path) -> Path:
    """A folder of links to the packages the vLLM venv lacks, taken from this interpreter."""
    version = subprocess.run([vllm_python, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True, check=True)
    if version.stdout.strip() != str(sys.version_info[:2]):
        pytest.skip(f"the vLLM venv runs Python {version.stdout.strip()}, this one {sys.version_info[:2]}")
    folder.mkdir(parents=True, exist_ok=True)
    for name in DEPENDENCIES:
        if subprocess.run([vllm_python, "-c", f"import {name}"], capture_output=True).returncode == 0:
            continue
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.submodule_search_locations, f"{name} is missing here too"
        (folder / name).symlink_to(next(iter(spec.submodule_search_locations)))
    return folder


def warm(vllm_python: str, deps: Path, cfg: Path, queries: Path, model: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STM_")}
    env.update(
        PYTHONPATH=f"{REPO}{os.pathsep}{deps}",
        VLLM_CPU_KVCACHE_SPACE="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
    )
    cmd = [
        vllm_python, "-m", "stabletoolbench_mirror", "warm", "--queries", str(queries), "--config", str(cfg),
        "--engine", "vllm-offline", "--model", str(model), "--concurrency", "8", "-q",
        "--vllm-option", "dtype=float32", "--vllm-option", "enforce_eager=true", "--vllm-option", "max_model_len=4096",
        "--vllm-option", "structured_outputs_config={backend: guidance, disable_any_whitespace: true}",
    ]  # fmt: skip
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=1200)


def config(tmp: Path, store: Path) -> Path:
    cfg = tmp / f"config-{store.name}.yml"
    cfg.write_text(
        f"store: {{path: {store}}}\ntools_folder: {REPO / 'cache' / 'tools'}\n"
        "simulator:\n  style: mirrorapi-sft\n  temperature: 0\n  seed: 7\n  max_tokens: 128\n"
        "  structured_output: true\n  structured_max_chars: 48\n"
        # the random-weight model writes gibberish into "error" too: this pins the pipeline, not the
        # validity rules for simulated answers (tests/integration/test_failure_records.py covers those)
        "  validity: 'off'\n"
    )
    return cfg


def test_offline_warm_records_resumes_and_is_deterministic(vllm_python: str, tiny_model: Path, tmp_path: Path) -> None:
    deps = overlay(vllm_python, tmp_path / "deps")
    docs = [
        {"category_name": "Weather", "tool_name": "Demo Weather", "api_name": "Current Weather",
         "required_parameters": [{"name": "city", "type": "STRING", "description": "", "default": "Paris"}], "optional_parameters": []},
        {"category_name": "Data", "tool_name": "Lookup Tool", "api_name": "Find", "required_parameters": [
            {"name": "id", "type": "STRING", "description": "", "default": "x1"},
            {"name": "limit", "type": "NUMBER", "description": "", "default": "5"}], "optional_parameters": []},
        {"category_name": "Data", "tool_name": "Lookup Tool", "api_name": "List", "required_parameters": [], "optional_parameters": []},
    ]  # fmt: skip
    queries = tmp_path / "queries.json"
    queries.write_text(json.dumps([{"query": "q", "query_id": 1, "api_list": docs}]))

    store_a = tmp_path / "store-a"
    first = warm(vllm_python, deps, config(tmp_path, store_a), queries, tiny_model, tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr[-4000:]
    assert f"queries    {3:>8} {3:>8} {0:>8} {0:>8}" in first.stdout
    with DiskcacheStore(store_a) as s:
        records = list(s)
    assert len(records) == 3 and {r.source for r in records} == {"simulated"} and {r.origin for r in records} == {str(tiny_model)}
    for record in records:
        answer = json.loads(record.body)
        assert list(answer) == ["error", "response"] and all(isinstance(v, str) for v in answer.values())
    assert "{'is_id': 'x1', 'limit': 5}" in {r.key for r in records}

    again = warm(vllm_python, deps, config(tmp_path, store_a), queries, tiny_model, tmp_path)
    assert again.returncode == 0 and f"queries    {3:>8} {0:>8} {3:>8}" in again.stdout

    store_b = tmp_path / "store-b"
    second = warm(vllm_python, deps, config(tmp_path, store_b), queries, tiny_model, tmp_path)
    assert second.returncode == 0, second.stdout + second.stderr[-4000:]
    with DiskcacheStore(store_b) as s:
        assert sorted((r.key, r.body) for r in s) == sorted((r.key, r.body) for r in records)
