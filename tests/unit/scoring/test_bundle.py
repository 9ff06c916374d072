"""A score bundle's seal: the content hash over its files, and every file changed since named."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from stabletoolbench_mirror.scoring import bundle


def _bundle(root: Path) -> Path:
    (root / "answers" / "G1_instruction").mkdir(parents=True)
    (root / "answers" / "G1_instruction" / "1073_CoT@1.json").write_text('{"answer": 1}', encoding="utf-8")
    (root / "run.json").write_text(json.dumps({"label": "run", "groups": ["G1_instruction"]}), encoding="utf-8")
    (root / "logs").mkdir()
    (root / "logs" / "qa_pipeline.log").write_text("took 3 s on this machine", encoding="utf-8")
    return root


def test_a_sealed_bundle_verifies_and_its_hash_ignores_the_logs(tmp_path: Path) -> None:
    root = _bundle(tmp_path / "b")
    sealed = bundle.seal(root)
    assert bundle.verify(root) == []
    assert set(sealed["files"]) == {"answers/G1_instruction/1073_CoT@1.json", "run.json"}
    (root / "logs" / "qa_pipeline.log").write_text("took 5 s elsewhere", encoding="utf-8")
    assert bundle.verify(root) == []
    assert bundle.seal(root)["content_hash"] == sealed["content_hash"]


def test_the_hash_is_the_same_for_the_same_bytes_anywhere(tmp_path: Path) -> None:
    first, second = _bundle(tmp_path / "a"), _bundle(tmp_path / "b")
    assert bundle.seal(first)["content_hash"] == bundle.seal(second)["content_hash"]
    (second / "run.json").write_text(json.dumps({"label": "run", "groups": ["G1_tool"]}), encoding="utf-8")
    assert bundle.seal(first)["content_hash"] != bundle.seal(second)["content_hash"]


def test_every_change_since_the_seal_is_named(tmp_path: Path) -> None:
    root = _bundle(tmp_path / "b")
    bundle.seal(root)
    (root / "answers" / "G1_instruction" / "1073_CoT@1.json").write_text('{"answer": 2}', encoding="utf-8")
    (root / "score.json").write_text("{}", encoding="utf-8")
    found = {(d.path, d.change) for d in bundle.verify(root)}
    assert found == {("answers/G1_instruction/1073_CoT@1.json", "changed"), ("score.json", "added")}
    (root / "run.json").unlink()
    assert ("run.json", "removed") in {(d.path, d.change) for d in bundle.verify(root)}


def test_a_seal_whose_hash_does_not_match_its_list_is_named(tmp_path: Path) -> None:
    root = _bundle(tmp_path / "b")
    manifest = bundle.seal(root)
    manifest["content_hash"] = "sha256:" + "0" * 64
    (root / bundle.BUNDLE_FILE).write_text(json.dumps(manifest), encoding="utf-8")
    assert [d.path for d in bundle.verify(root)] == [bundle.BUNDLE_FILE]


def test_a_folder_without_a_seal_or_of_a_newer_format_is_refused_naming_the_fix(tmp_path: Path) -> None:
    root = _bundle(tmp_path / "b")
    with pytest.raises(bundle.BundleError, match="not a score bundle"):
        bundle.read_bundle(root)
    manifest = bundle.seal(root)
    manifest["format_version"] = bundle.FORMAT_VERSION + 1
    (root / bundle.BUNDLE_FILE).write_text(json.dumps(manifest), encoding="utf-8")
    with pytest.raises(bundle.BundleError, match="upgrade stabletoolbench-mirror"):
        bundle.read_bundle(root)


def test_a_symbolic_link_in_a_bundle_is_refused(tmp_path: Path) -> None:
    root = _bundle(tmp_path / "b")
    outside = tmp_path / "secret.txt"
    outside.write_text("not the bundle's", encoding="utf-8")
    os.symlink(outside, root / "answers" / "G1_instruction" / "2_CoT@1.json")
    with pytest.raises(bundle.BundleError, match="symbolic link"):
        bundle.seal(root)


def test_a_bundle_reads_its_run_and_its_files(tmp_path: Path) -> None:
    root = _bundle(tmp_path / "b")
    bundle.seal(root)
    read = bundle.read_bundle(root)
    assert read.label == "run" and read.groups == ["G1_instruction"] and read.score == {}
    assert [p.name for p in read.answer_files("G1_instruction")] == ["1073_CoT@1.json"]
    assert bundle.pass_rate_files("run", "G1_instruction") == ("pass_rate/run/G1_instruction_run.json",
                                                               "pass_rate/run/G1_instruction_run.csv")


def test_records_with_a_gap_in_a_model_requests_occurrences_are_not_sealed(tmp_path: Path) -> None:
    root = _bundle(tmp_path / "b")
    digest, other = "a" * 64, "b" * 64
    model = root / "records" / "@model" / "gpt-judge" / "chat_completions.json"
    model.parent.mkdir(parents=True)
    answer = {"error": "", "response": "{}"}
    model.write_text(json.dumps({f"{digest}#1": answer, f"{digest}#3": answer, f"{other}#1": answer}), encoding="utf-8")
    tool = root / "records" / "Data" / "demo_for_Data" / "api.json"  # tool answers are keyed by their call: never counted
    tool.parent.mkdir(parents=True)
    tool.write_text(json.dumps({"{'q': 1}": answer}), encoding="utf-8")
    with pytest.raises(bundle.BundleError, match=r"records/@model/gpt-judge/chat_completions.json: request sha256:aaaaaaaaaaaaaaaa\.\.\. "
                                                 r"is recorded as #1, #3, without #2\n"):
        bundle.seal(root)
    assert not (root / "bundle.json").exists()
    model.write_text(json.dumps({f"{digest}#1": answer, f"{digest}#2": answer, f"{other}#1": answer}), encoding="utf-8")
    assert bundle.seal(root)["content_hash"].startswith("sha256:")
