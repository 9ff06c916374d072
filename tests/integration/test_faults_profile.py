"""``faults profile TREE``: a cache's real mix of failures, printed as a ``faults:`` block the settings accept."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from stabletoolbench_mirror.config import load_settings
from stabletoolbench_mirror.engine.faults import FaultPlan
from tests.integration.test_startup import cli


def write_tree(root: Path, answers: list[dict]) -> Path:
    folder = root / "tree" / "Data" / "tool_for_Data"
    folder.mkdir(parents=True)
    half = len(answers) // 2
    for name, part in (("a.json", answers[:half]), ("b.json", answers[half:])):
        (folder / name).write_text(json.dumps({f"{{'n': {i}}}": a for i, a in enumerate(part)}, indent=4))
    return root / "tree"


def test_profile_prints_the_mix_as_a_faults_block_the_settings_accept(tmp_path: Path) -> None:
    answers = ([{"error": "", "response": f"fine {i}"} for i in range(80)]
               + [{"error": "API not working error...", "response": ""}] * 10
               + [{"error": "Rate limit per minute error...", "response": "slow down"}] * 5
               + [{"error": "", "response": ""}] * 4 + [{"error": "", "response": {}}]
               + [{"error": "Blocked error...", "response": ""}] * 2)
    tree = write_tree(tmp_path, answers)
    result = cli("faults", "profile", str(tree), "--seed", "11", "-q", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    block = yaml.safe_load(result.stdout)
    total = len(answers)
    assert block == {"faults": {"seed": 11, "rate": round(20 / total, 4),
                                "kinds": {"api_not_working": 0.5, "rate_limit_per_minute": 0.25, "empty": 0.25}}}
    assert f"# {total} answers in 2 files: 20 error or empty answers" in result.stdout
    assert "2 other error answers" in result.stdout and "'Blocked error...'" in result.stdout
    config = tmp_path / "server_config.yml"
    config.write_text(result.stdout)
    plan = FaultPlan.from_config(load_settings(config, environ={}).faults)
    assert plan is not None and plan.kinds == ("api_not_working", "rate_limit_per_minute", "empty")
    assert plan.weights == (0.5, 0.25, 0.25) and plan.seed == 11


def test_profile_of_stabletoolbenchs_published_cache(reference_dir: Path, tmp_path: Path) -> None:
    result = cli("faults", "profile", str(reference_dir / "cache"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    block = yaml.safe_load(result.stdout)["faults"]
    assert block["rate"] == 0.0 or 0 < block["rate"] <= 1
    assert "faults profile" in result.stderr  # the progress bar
    config = tmp_path / "server_config.yml"
    config.write_text(result.stdout)
    load_settings(config, environ={})


def test_profile_of_a_folder_that_is_no_tree_is_refused_with_a_hint(tmp_path: Path) -> None:
    tree = write_tree(tmp_path, [{"error": "", "response": "x"}] * 2)
    result = cli("faults", "profile", str(tree.parent), "-q", cwd=tmp_path)
    assert result.returncode == 2
    assert f"the folder below, {tree}, looks like a tool_response_cache tree: use that path" in result.stderr
    bad = tree / "Data" / "tool_for_Data" / "a.json"
    bad.write_text("{not json")
    result = cli("faults", "profile", str(tree), "-q", cwd=tmp_path)
    assert result.returncode == 0 and f"skipped (cannot be read): {bad}" in result.stderr
    assert "# 1 files could not be read and were skipped" in result.stdout
