"""`fidelity` end to end against a real vLLM server, and its records exported as chat training data.

The tiny random model's answers are noise, so the scores are low; what is checked is that the
pipeline is real: every reference call goes to vLLM with the MirrorAPI prompt, the report has
every metric in range, ``--record`` keeps the generation's metadata (rationale, tokens, finish
reason) beside the answers, and ``cache export --format chat-jsonl`` writes lines that the model's
own tokenizer renders with its chat template.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from stabletoolbench_mirror.responders.simulator.vllm_launch import VllmServer, find_free_port
from stabletoolbench_mirror.stores import DiskcacheStore

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1200)]

REPO = Path(__file__).resolve().parents[2]
REFERENCE = REPO.parent / "shared" / "reference"
SERVED_NAME = "MirrorAPI"
CALLS_USED = 6


@pytest.fixture(scope="module")
def vllm(vllm_python: str, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    work = tmp_path_factory.mktemp("vllm-fidelity")
    server = VllmServer(
        str(tiny_model),
        port=find_free_port(),
        served_model_name=SERVED_NAME,
        python=vllm_python,
        extra_args=["--dtype", "float32", "--enforce-eager", "--structured-outputs-config",
                    json.dumps({"backend": "guidance", "disable_any_whitespace": True})],
        startup_timeout=600,
        log_path=str(work / "vllm-server.log"),
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STM_")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run(
        [sys.executable, "-m", "stabletoolbench_mirror", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=900, check=False
    )


def test_fidelity_and_chat_export_against_vllm(vllm: VllmServer, vllm_python: str, tiny_model: Path, tmp_path: Path) -> None:
    if not (REFERENCE / "calls.jsonl").is_file():
        pytest.skip(f"reference data not found at {REFERENCE}")
    calls = tmp_path / "calls.jsonl"
    calls.write_text("".join((REFERENCE / "calls.jsonl").read_text().splitlines(keepends=True)[:CALLS_USED]))
    config = tmp_path / "config.yml"
    config.write_text(
        json.dumps(
            {
                "store": {"path": str(tmp_path / "store")},
                "tools_folder": str(REFERENCE / "toolenv" / "tools"),
                "simulator": {
                    "enabled": True,
                    "style": "mirrorapi-cot",
                    "api_base": vllm.api_base,
                    "model": SERVED_NAME,
                    "temperature": 0,
                    "seed": 7,
                    "max_tokens": 256,
                    "structured_output": True,
                    "structured_max_chars": 64,
                    "read_timeout_s": 300,
                    # a random model's text may trip the validity rules; every parsed answer is recorded here
                    "validity": "off",
                },
            }
        )
    )
    report_file, page = tmp_path / "fidelity.json", tmp_path / "fidelity.html"
    run = _cli("fidelity", "--config", str(config), "--calls", str(calls), "--record", "--concurrency", "2",
               "--json", str(report_file), "--html", str(page), cwd=tmp_path)  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "bleu" in run.stdout and "rouge_l" in run.stdout
    report = json.loads(report_file.read_text())
    assert report["aggregate"]["n"] == CALLS_USED and report["problems"] == []
    for row in report["calls"]:
        assert 0.0 <= row["bleu"] <= 100.0 and 0.0 <= row["rouge_l"] <= 1.0
        assert row["exact"] in (0.0, 1.0) and row["json_valid"] in (0.0, 1.0) and row["error_agreement"] in (0.0, 1.0)
        assert row["cosine"] is None and row["judge"] is None
        assert set(row["candidate"]) == {"error", "response"}  # a parsed model answer (structured output)
    # a histogram for each metric computed; cosine and judge were not asked for
    computed = [m for m, v in report["aggregate"].items() if m != "n" and v is not None]
    assert page.read_text().count("<svg") == len(computed) and {"bleu", "rouge_l", "exact"} <= set(computed)

    # --record kept the answers with what the generation knew
    with DiskcacheStore(str(tmp_path / "store")) as store:
        records = list(store)
    assert len(records) == CALLS_USED and {r.source for r in records} == {"simulated"}
    for record in records:
        meta = record.meta or {}
        assert meta["style"] == "mirrorapi-cot" and meta["model"] == SERVED_NAME
        assert meta["seed"] == 7 and meta["temperature"] == 0 and meta["finish_reason"] in ("stop", "length")
        assert meta["prompt_tokens"] > 0 and meta["completion_tokens"] > 0 and meta["latency_s"] > 0
        assert "mechanism_of_the_api" not in record.body  # kept beside the answer, never served
    # the schema asks for the rationale first; a random model may leave it empty (then it is not one)
    with_rationale = sum(1 for r in records if (r.meta or {}).get("mechanism_of_the_api"))

    # the records as chat training data, loaded by the model's own tokenizer and chat template
    for style in ("mirrorapi-sft", "mirrorapi-cot"):
        out = tmp_path / f"train-{style}.jsonl"
        run = _cli("cache", "export", "--config", str(config), "--format", "chat-jsonl", "--style", style, str(out), cwd=tmp_path)
        assert run.returncode == 0, run.stdout + run.stderr
        lines = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
        expected = with_rationale if style == "mirrorapi-cot" else CALLS_USED
        assert len(lines) == expected
        check = (
            "import json, sys\n"
            "from transformers import AutoTokenizer\n"
            "tok = AutoTokenizer.from_pretrained(sys.argv[1])\n"
            "n = 0\n"
            "for line in open(sys.argv[2], encoding='utf-8'):\n"
            "    messages = json.loads(line)['messages']\n"
            "    assert [m['role'] for m in messages] == ['system', 'user', 'assistant']\n"
            "    text = tok.apply_chat_template(messages, tokenize=False)\n"
            "    assert messages[2]['content'] in text and messages[1]['content'] in text\n"
            "    n += 1\n"
            "print(n)\n"
        )
        loaded = subprocess.run(
            [vllm_python, "-c", check, str(tiny_model), str(out)],
            capture_output=True, text=True, timeout=300, check=False,
            env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
        )  # fmt: skip
        assert loaded.returncode == 0 and loaded.stdout.strip() == str(expected), loaded.stdout + loaded.stderr
        if style == "mirrorapi-cot":
            assert all(list(json.loads(line["messages"][2]["content"]))[0] == "mechanism_of_the_api" for line in lines)
