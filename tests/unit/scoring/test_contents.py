"""What a bundle may hold (``scoring/contents.py``) and where ``score`` may write (``bundle.inside``, ``session.Work``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stabletoolbench_mirror.scoring import bundle, contents
from stabletoolbench_mirror.scoring.session import Work


@pytest.mark.parametrize("name", ["G1_instruction", "gpt-3.5-turbo_CoT@1", "run.2", "_x", "@a"])
def test_plain_names_pass(name: str) -> None:
    assert contents.plain_name(name) == name


@pytest.mark.parametrize("name", ["", ".", "..", "../x", "/abs", "a/b", "a\\b", ".hidden", "-x", "a\0b", "x" * 129, "a b"])
def test_names_that_are_paths_or_odd_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="is not a plain name"):
        contents.plain_name(name)


@pytest.mark.parametrize("name", ["/models/x", "../x", "a/../b", "a//b", ""])
def test_a_model_name_is_never_a_path(name: str) -> None:
    with pytest.raises(ValueError, match="is not a model name"):
        contents.model_name(name)
    assert contents.model_name("ToolBench/ToolLLaMA-2-7b-v2") == "ToolBench/ToolLLaMA-2-7b-v2"


@pytest.mark.parametrize("path", ["../x", "/etc/passwd", "a//b", "a/./b", "a\\b"])
def test_a_sealed_file_name_is_a_path_inside_the_bundle(path: str) -> None:
    with pytest.raises(ValueError, match="is not a path inside the bundle"):
        contents.relative_path(path)


def test_json_is_read_bounded_in_size_and_depth(tmp_path: Path) -> None:
    path = tmp_path / "f.json"
    path.write_text(json.dumps({"a": [[[1]]]}))
    assert contents.read_json(path) == {"a": [[[1]]]}
    with pytest.raises(contents.ContentsError, match="over 0 MiB"):
        contents.read_json(path, max_bytes=8)
    path.write_text("[" * (contents.MAX_DEPTH + 1) + "]" * (contents.MAX_DEPTH + 1))  # below the interpreter's own limit
    with pytest.raises(contents.ContentsError, match="nested deeper than 500 levels"):
        contents.read_json(path)
    path.write_text("[" * 200_000 + "]" * 200_000)  # far past it: a message, not a RecursionError
    with pytest.raises(contents.ContentsError, match="nested deeper than 500 levels"):
        contents.read_json(path)
    path.write_text("{")
    with pytest.raises(contents.ContentsError, match="not JSON"):
        contents.read_json(path)
    assert contents.depth([]) == 1 and contents.depth(3) == 0 and contents.depth({"a": {"b": []}}) == 3


def test_inside_resolves_and_refuses_what_lies_outside(tmp_path: Path) -> None:
    root = tmp_path / "work"
    root.mkdir()
    assert bundle.inside(root, "answers/G1") == root.resolve() / "answers" / "G1"
    assert bundle.inside(root, root / "x" / ".." / "y") == root.resolve() / "y"
    for outside in ("..", "../victim", str(tmp_path / "victim"), "/", "a/../../victim"):
        with pytest.raises(bundle.BundleError, match="not inside the work folder"):
            bundle.inside(root, outside)
    (root / "link").symlink_to(tmp_path)  # a link out of the folder is outside too
    with pytest.raises(bundle.BundleError, match="not inside the work folder"):
        bundle.inside(root, "link/victim")


@pytest.mark.parametrize("group", ["/abs/victim", "../../victim", "../../../victim"])
def test_every_path_a_work_folder_gives_lies_inside_it(tmp_path: Path, group: str) -> None:
    """What ``score`` writes, copies, moves or removes comes from ``Work``: a group naming a path out of it is refused there."""
    work = Work(tmp_path / "work")
    root = (tmp_path / "work").resolve()
    for where in (work.queries, work.answers, work.answers_read, work.log, work.pool):
        try:
            given = where(group)
        except bundle.BundleError as exc:
            assert "not inside the work folder" in str(exc)
        else:  # "answers//abs/victim" is answers/abs/victim: inside
            assert given.is_relative_to(root) and group.startswith("/"), given
    with pytest.raises(bundle.BundleError, match="not inside the work folder"):
        work.path(group)
    assert work.answers("G1_instruction") == (tmp_path / "work").resolve() / "answers" / "G1_instruction"


def test_run_json_fields_are_typed_and_in_range() -> None:
    base = {"label": "run", "groups": ["G1_instruction"]}
    assert contents.check(contents.RunFile, {**base, "reference": "cot"}, "run.json").reference_label == "cot"
    for bad, field in (({"groups": "G1_instruction"}, "groups"), ({"evaluate_times": True}, "evaluate_times"),
                       ({"evaluate_times": "4"}, "evaluate_times"), ({"seed": -1}, "seed"), ({"threads": 0}, "threads"),
                       ({"method": "CoT@1; rm -rf /"}, "method"), ({"backbone": "x"}, "backbone"),
                       ({"reference": {"label": "cot", "content_hash": "md5:1"}}, "reference.content_hash")):
        with pytest.raises(contents.ContentsError, match=f"run.json: {field}:"):
            contents.check(contents.RunFile, {**base, **bad}, "run.json")
    with pytest.raises(contents.ContentsError, match="score.json: pass_rate.G1.solve_rate: a finite number expected"):
        contents.check(contents.ScoreFile, {"pass_rate": {"G1": {"solve_rate": float("nan"), "std": 0, "queries": 1}}}, "score.json")
