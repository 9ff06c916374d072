"""A score bundle is untrusted input: correctly sealed hostile bundles refused before anything uses them.

A seal is a hash anyone recomputes, so each bundle here is tampered with, then sealed again
(``scoring.bundle.seal``), and given as a folder, as a ``.tar.gz``, and at a URL on a real HTTP server on
127.0.0.1 with the right ``#sha256=``.  ``score --replay``, ``--rescore``, a record run with ``--reference``
and ``report`` each exit 2 naming the field, and a victim folder beside the work folder is unchanged after
every one; a bundle whose ``score.json`` is not its label files' (or that scores no group) fails a replay
and a re-score with exit 1, naming the number.  All of it fails before any upstream script runs.  The
``score`` cases need the reference checkout (``../shared/reference``) and skip without it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from stabletoolbench_mirror.commands.cli import main as cli
from stabletoolbench_mirror.scoring import bundle
from stabletoolbench_mirror.scoring.assemble import score_of
from stabletoolbench_mirror.scoring.session import RunSpec
from stabletoolbench_mirror.upstream.archives import pack
from tests.helpers.live import serve_folder
from tests.helpers.upstream_pipeline import TOOLS_DIR, UPSTREAM, upstream_available

needs_upstream = pytest.mark.skipif(not upstream_available(), reason="StableToolBench reference copy not found at ../shared/reference")

GROUP, LABEL, METHOD = "G1_instruction", "run", "CoT@1"
RUN = {"label": LABEL, "groups": [GROUP], "method": METHOD, "backbone": "chatgpt_function", "agent_model": "gpt-3.5-turbo-16k",
       "judge_model": "gpt-4o-mini", "evaluator": "tooleval_gpt-3.5-turbo_default", "evaluate_times": 2, "limit": None,
       "pipeline": "qa_pipeline_multithread", "threads": 1, "seed": 42, "max_observation_length": 1024, "reference": None,
       "query_ids": None, "stabletoolbench": {"commit": None, "dirty": None}, "environment": {}, "commands": []}


def _write(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data), encoding="utf-8")


def make_bundle(root: Path, change: Callable[[dict[str, Any]], None] = lambda run: None) -> Path:
    """A small bundle whose ``score.json`` is what its label file gives, ``run.json`` changed by ``change``, sealed."""
    labels = {"1": {"query": "q1", "is_solved": {"0": "AnswerStatus.Solved", "1": "AnswerStatus.Unsure"}},
              "2": {"query": "q2", "is_solved": {"0": "AnswerStatus.Unsolved", "1": "AnswerStatus.Solved"}}}
    _write(root / bundle.QUERIES_DIR / f"{GROUP}.json", [{"query_id": 1, "query": "q1"}, {"query_id": 2, "query": "q2"}])
    _write(root / bundle.TEST_IDS_DIR / f"{GROUP}.json", {"1": 1, "2": 1})
    for qid in ("1", "2"):
        _write(root / bundle.answers_dir(GROUP) / f"{qid}_{METHOD}.json", {"answer_generation": {"query": f"q{qid}"}})
    _write(root / bundle.converted_file(LABEL, GROUP), {"1": {}, "2": {}})
    _write(root / bundle.pass_rate_files(LABEL, GROUP)[0], labels)
    _write(root / bundle.RECORDS_DIR / "manifest.json", {"content_hash": "sha256:" + "0" * 64})
    _write(root / bundle.SCORE_FILE, score_of(root, RunSpec.from_json(RUN)))
    run = json.loads(json.dumps(RUN))
    change(run)
    _write(root / bundle.RUN_FILE, run)
    bundle.seal(root)
    return root


@pytest.fixture
def site(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A static HTTP server on 127.0.0.1: ``(base URL, the folder it serves)``."""
    folder = tmp_path / "site"
    folder.mkdir()
    with serve_folder(folder) as url:
        yield url, folder


def sources(root: Path, site: tuple[str, Path]) -> list[str]:
    """The bundle at ``root`` as a folder, a ``.tar.gz``, and a URL with its ``#sha256=``."""
    url, folder = site
    archive = folder / f"{root.name}.tar.gz"
    pack(root, archive)
    return [str(root), str(archive), f"{url}/{archive.name}#sha256={hashlib.sha256(archive.read_bytes()).hexdigest()}"]


def tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    capsys.readouterr()
    code = cli(list(args))
    out, err = capsys.readouterr()
    return code, out + err


def score(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    return run_cli(capsys, "score", "--stabletoolbench", str(UPSTREAM), "--tools", str(TOOLS_DIR), "--stand-ins", "--quiet", *args)


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A folder beside the work folders, with a file in it (and an evaluator's ``config.yaml``, for the bundle to point at)."""
    folder = tmp_path / "victim"
    folder.mkdir()
    (folder / "keep.txt").write_text("must stay")
    (folder / "config.yaml").write_text("completions_kwargs: {model: gpt-4}\n")
    return folder


def _hostile(field: str, way: str, victim: Path) -> tuple[Callable[[dict[str, Any]], None], str]:
    """How run.json is changed to name ``victim`` in ``field`` (``absolute`` or ``../``), and the field the error names."""
    value = str(victim) if way == "absolute" else "../../../victim"
    if field == "groups":
        return (lambda run: run.update(groups=[value])), "groups.0"
    if field == "reference":
        return (lambda run: run.update(reference={"label": value, "content_hash": "sha256:" + "1" * 64})), "reference.label"
    return (lambda run: run.update({field: value})), field


@needs_upstream
@pytest.mark.parametrize("way", ["absolute", "dotdot"])
@pytest.mark.parametrize("field", ["groups", "label", "reference", "evaluator"])
def test_a_sealed_bundle_naming_a_path_is_refused_by_every_command_and_nothing_outside_changes(
        field: str, way: str, tmp_path: Path, victim: Path, site: tuple[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    change, named = _hostile(field, way, victim)
    hostile = make_bundle(tmp_path / "hostile", change)
    before = tree(victim)
    config = tmp_path / "c.yml"
    config.write_text(f"download_dir: {tmp_path / 'downloads'}\n")
    for i, source in enumerate(sources(hostile, site)):
        runs = {
            "replay": ("--replay", source, "--work", str(tmp_path / f"w{i}" / "replay")),
            "rescore": ("--rescore", source, "--work", str(tmp_path / f"w{i}" / "rescore")),
            "record": ("--config", str(config), "--groups", GROUP, "--method", METHOD, "--agent-model", "gpt-3.5-turbo-16k",
                       "--reference", source, "--out", str(tmp_path / f"w{i}" / "out"), "--work", str(tmp_path / f"w{i}" / "record")),
        }
        for what, args in runs.items():
            code, said = score(capsys, *args)
            assert code == 2, (what, source, said)
            assert f"run.json: {named}:" in said and "Traceback" not in said, (what, source, said)
            assert tree(victim) == before, (what, source)
        code, said = run_cli(capsys, "report", source, "--json", "-q", "--config", str(config))
        assert code == 2 and f"run.json: {named}:" in said and "Traceback" not in said, (source, said)
        assert tree(victim) == before, source
        assert not (tmp_path / f"w{i}" / "out").exists()


@needs_upstream
def test_an_evaluator_not_among_the_checkouts_is_refused_before_anything_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    odd = make_bundle(tmp_path / "odd", lambda run: run.update(evaluator="registered_cls"))  # a folder there, with no config.yaml
    for flag in ("--replay", "--rescore"):
        code, said = score(capsys, flag, str(odd), "--work", str(tmp_path / flag.strip("-")))
        assert code == 2 and "no evaluator 'registered_cls'" in said and "tooleval_gpt-3.5-turbo_default" in said, said
        assert not (tmp_path / flag.strip("-") / "logs").exists()  # nothing ran


@needs_upstream
def test_a_fabricated_score_fails_replay_and_rescore_naming_the_number(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fabricated = make_bundle(tmp_path / "fabricated")
    claimed = json.loads((fabricated / bundle.SCORE_FILE).read_text())
    recomputed = claimed["pass_rate"][GROUP]["solve_rate"]
    claimed["pass_rate"][GROUP]["solve_rate"] = claimed["pass_rate_average"] = 99.9
    _write(fabricated / bundle.SCORE_FILE, claimed)
    bundle.seal(fabricated)
    empty = make_bundle(tmp_path / "empty", lambda run: run.update(groups=[]))
    for flag in ("--replay", "--rescore"):
        code, said = score(capsys, flag, str(fabricated), "--work", str(tmp_path / f"f{flag}"))
        assert code == 1, said
        assert f"score.json: pass_rate.{GROUP}.solve_rate: the bundle says 99.9, its label files give {recomputed:.6g}" in said
        assert "score.json: pass_rate_average: the bundle says 99.9" in said and "every file identical" not in said
        code, said = score(capsys, flag, str(empty), "--work", str(tmp_path / f"e{flag}"))
        assert code == 1 and "run.json: groups is empty: the bundle scores nothing" in said, said
    # report: the fabricated number is a problem (exit 1), and neither bundle is verified
    for root in (fabricated, empty):
        code, said = run_cli(capsys, "report", str(root), "--json-out", str(tmp_path / "r.json"), "-q")
        assert code == 1 and "verification:  as published, not replayed" in said, said
    assert "groups is empty" in said


@needs_upstream
@pytest.mark.parametrize("case", ["objects as groups", "deep run.json", "seed 10^30", "seed true", "deep answer file"])
def test_malformed_fields_exit_2_with_a_message_and_no_traceback(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "malformed"
    expected = {"objects as groups": "run.json: groups.0: Input should be a valid string",
                "deep run.json": "run.json: nested deeper than 500 levels",
                "seed 10^30": "run.json: seed: Input should be less than or equal to 4294967295",
                "seed true": "run.json: seed: Input should be a valid integer",
                "deep answer file": f"1_{METHOD}.json: nested deeper than 500 levels"}[case]
    change = {"objects as groups": lambda run: run.update(groups=[{"name": GROUP}]), "seed 10^30": lambda run: run.update(seed=10**30),
              "seed true": lambda run: run.update(seed=True)}.get(case, lambda run: None)
    make_bundle(root, change)
    if case == "deep run.json":
        (root / bundle.RUN_FILE).write_text('{"label": "run", "groups": ' + "[" * 200_000 + "]" * 200_000 + "}")
    if case == "deep answer file":
        (root / bundle.answers_dir(GROUP) / f"1_{METHOD}.json").write_text("[" * 200_000 + "]" * 200_000)
    bundle.seal(root)
    flags = ("--rescore",) if case == "deep answer file" else ("--replay", "--rescore")
    for flag in flags:
        code, said = score(capsys, flag, str(root), "--work", str(tmp_path / flag.strip("-")))
        assert code == 2 and expected in said and "Traceback" not in said, said
    if case != "deep answer file":
        code, said = run_cli(capsys, "report", str(root), "--json", "-q")
        assert code == 2 and expected in said and "Traceback" not in said, said


@needs_upstream
def test_a_seed_out_of_range_on_the_command_line_is_refused_before_anything_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.yml"
    config.write_text("{}\n")
    code, said = score(capsys, "--config", str(config), "--groups", GROUP, "--method", METHOD, "--agent-model", "gpt-3.5-turbo-16k",
                       "--seed", str(10**30), "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work"))
    assert code == 2 and "score's arguments: seed: Input should be less than or equal to 4294967295" in said, said
    assert "could not check the imports" not in said and not (tmp_path / "work").exists()
