"""A score bundle opened as ``score --replay`` opens it: a folder, a ``.tar.gz``, or a URL with ``#sha256=``
(downloaded from a real HTTP server on 127.0.0.1), its seal checked, every file changed since named."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from stabletoolbench_mirror.scoring.bundle import BundleError, open_bundle, seal
from stabletoolbench_mirror.upstream.archives import pack
from tests.helpers.live import serve_folder


def make_bundle(root: Path) -> Path:
    """A small sealed bundle: run.json, one answer file, one label file, a records snapshot's manifest, a log."""
    (root / "answers" / "G1_instruction").mkdir(parents=True)
    (root / "answers" / "G1_instruction" / "1_CoT@1.json").write_text('{"answer_generation": {}}')
    (root / "pass_rate" / "run").mkdir(parents=True)
    (root / "pass_rate" / "run" / "G1_instruction_run.json").write_text('{"1": {"is_solved": {"0": "AnswerStatus.Solved"}}}')
    (root / "records").mkdir()
    (root / "records" / "manifest.json").write_text('{"content_hash": "sha256:0"}')
    (root / "logs").mkdir()
    (root / "logs" / "infer.log").write_text("not hashed")
    (root / "run.json").write_text(json.dumps({"label": "run", "groups": ["G1_instruction"]}))
    seal(root)
    return root


@pytest.fixture
def published(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """The bundle's archive served over HTTP: ``(url, sha256)``."""
    pack(make_bundle(tmp_path / "bundle"), tmp_path / "site" / "run.tar.gz")
    sha = hashlib.sha256((tmp_path / "site" / "run.tar.gz").read_bytes()).hexdigest()
    with serve_folder(tmp_path / "site") as url:
        yield f"{url}/run.tar.gz", sha


def test_a_bundle_opens_from_a_url_with_its_sha256_and_a_wrong_one_is_refused(published: tuple[str, str], tmp_path: Path) -> None:
    url, sha = published
    bundle = open_bundle(f"{url}#sha256={sha}", tmp_path / "downloads")
    assert bundle.label == "run" and bundle.groups == ["G1_instruction"]
    assert [p.name for p in bundle.answer_files("G1_instruction")] == ["1_CoT@1.json"]
    with pytest.raises(BundleError, match="does not match the expected"):
        open_bundle(f"{url}#sha256={'0' * 64}", tmp_path / "elsewhere")


def test_a_changed_or_added_file_is_named_and_the_logs_are_not_hashed(tmp_path: Path) -> None:
    root = make_bundle(tmp_path / "bundle")
    (root / "logs" / "infer.log").write_text("another machine's paths")
    assert open_bundle(str(root), tmp_path / "d").content_hash.startswith("sha256:")
    (root / "answers" / "G1_instruction" / "1_CoT@1.json").write_text('{"answer_generation": {"changed": 1}}')
    (root / "answers" / "G1_instruction" / "2_CoT@1.json").write_text("{}")
    with pytest.raises(BundleError) as caught:
        open_bundle(str(root), tmp_path / "d")
    assert "answers/G1_instruction/1_CoT@1.json: changed since the bundle was sealed" in str(caught.value)
    assert "answers/G1_instruction/2_CoT@1.json: added since the bundle was sealed" in str(caught.value)
    # an archive of a changed bundle is refused before anything of it is used
    pack(root, tmp_path / "changed.tar.gz")
    with pytest.raises(BundleError, match="do not match the seal"):
        open_bundle(str(tmp_path / "changed.tar.gz"), tmp_path / "d2")
