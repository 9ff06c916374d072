"""``demo-models``: ``score`` run end to end with no key, as docs/reproduce-a-score.md's "Try it with no key" says.

The shipped command in its own process (``stabletoolbench-mirror demo-models --port P``), the configuration the doc
shows (its YAML block, the port and store put in), StableToolBench's own scripts from ``../shared/reference``
(skipped without it): two queries, their tool calls answered by the demo simulator, judged by the demo judge, then replayed
with the demo models stopped.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
import yaml

from stabletoolbench_mirror.commands.cli import main as cli
from stabletoolbench_mirror.scoring.bundle import open_bundle, verify
from stabletoolbench_mirror.scoring.demo_models import AGENT, JUDGE, SIMULATOR
from tests.helpers.live import free_port
from tests.helpers.paths import REPO
from tests.helpers.processes import _clean_env, _stop_group, _wait_http
from tests.helpers.upstream_pipeline import TOOLS_DIR, UPSTREAM, upstream_available

DOC = REPO / "docs" / "reproduce-a-score.md"


@dataclass
class Demo:
    url: str
    """Its ``/v1`` URL."""
    proc: subprocess.Popen[bytes]


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[Demo]:
    """``stabletoolbench-mirror demo-models`` on a free port, in its own process."""
    port = free_port()
    log = tmp_path / "demo-models.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "stabletoolbench_mirror", "demo-models", "--port", str(port)], cwd=REPO,
                                env=_clean_env(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_http(f"http://127.0.0.1:{port}/v1/models", proc, 60, "demo-models", log)
        yield Demo(f"http://127.0.0.1:{port}/v1", proc)
    finally:
        _stop_group(proc)


def documented() -> tuple[str, list[list[str]]]:
    """The doc's configuration (its YAML block) and its ``score`` commands' arguments, from "Try it with no key"."""
    section = DOC.read_text(encoding="utf-8").split("### Try it with no key", 1)[1].split("\n## ", 1)[0]
    config = re.search(r"```yaml\n(.*?)```", section, re.S)
    commands = re.findall(r"^stabletoolbench-mirror score (.*?)$", section.replace("\\\n", " "), re.M)
    assert config and len(commands) == 2, "the section shows its config, its score command and its replay"
    return config.group(1), [command.split() for command in commands]


def test_the_demo_models_answer_by_name_and_refuse_what_they_are_not(demo: Demo) -> None:
    url = demo.url
    listed = requests.get(url + "/models", timeout=10).json()
    assert [m["id"] for m in listed["data"]] == [AGENT, JUDGE, SIMULATOR]
    other = requests.post(url + "/chat/completions", json={"model": "gpt-4o", "messages": []}, timeout=10)
    assert other.status_code == 404 and "the demo models are" in other.json()["error"]["message"]
    assert requests.post(url + "/chat/completions", data=b"{", timeout=10).status_code == 400
    asked = {"model": SIMULATOR, "messages": [{"role": "user", "content": "simulate"}]}
    first, again = (requests.post(url + "/chat/completions", json=asked, timeout=10).json() for _ in range(2))
    assert first == again and json.loads(first["choices"][0]["message"]["content"])["error"] == ""


def test_a_port_in_use_is_exit_2_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        assert cli(["demo-models", "--port", str(port)]) == 2
    assert f"port {port} is already in use" in capsys.readouterr().err


@pytest.mark.skipif(not upstream_available(), reason="StableToolBench reference copy not found at ../shared/reference")
def test_score_runs_end_to_end_on_the_demo_models_as_documented(demo: Demo, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text, (arguments, replay) = documented()
    config = yaml.safe_load(text.replace("http://127.0.0.1:8091/v1", demo.url))
    config["store"]["path"] = str(tmp_path / "demo-store")
    config["tools_folder"] = str(TOOLS_DIR)
    config["log_level"] = "warning"
    (tmp_path / "demo.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
    paths = {"/path/to/StableToolBench": str(UPSTREAM), "demo.yml": str(tmp_path / "demo.yml"), "demo.tar.gz": str(tmp_path / "demo.tar.gz")}
    argv = [paths.get(word, word) for word in arguments]
    del argv[argv.index("--limit"):argv.index("--limit") + 2]  # the two queries of the reference copy below
    code = cli(["score", *argv, "--tools", str(TOOLS_DIR), "--query-ids", "1073,608", "--quiet"])
    captured = capsys.readouterr()
    assert code == 0, captured.err[-3000:]
    bundle = open_bundle(str(tmp_path / "demo.tar.gz"), tmp_path / "downloads")
    assert verify(bundle.root) == []
    assert (bundle.run["agent_model"], bundle.run["judge_model"]) == (AGENT, JUDGE)
    assert [p.name for p in bundle.answer_files("G1_instruction")] == ["1073_CoT@1.json", "608_CoT@1.json"]
    manifest = json.loads((bundle.records / "manifest.json").read_text())
    assert set(manifest["by_source"]) == {"model", "simulated"}, manifest["by_source"]  # every answer from the demo models
    assert bundle.score["pass_rate"]["G1_instruction"]["solve_rate"] is not None
    # the doc's replay, with the demo models stopped: the records alone answer it
    _stop_group(demo.proc)
    code = cli(["score", *[paths.get(word, word) for word in replay], "--tools", str(TOOLS_DIR), "--quiet"])
    assert code == 0, capsys.readouterr().err[-3000:]
