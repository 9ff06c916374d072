"""StableToolBench's pass rate: Solved 1, Unsure 0.5, per evaluation; the mean and the population std, percent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stabletoolbench_mirror.scoring.score import SOLVED, UNSURE, pass_rate

UNSOLVED = "AnswerStatus.Unsolved"


def test_each_evaluation_scores_solved_one_unsure_half_and_the_rate_is_their_mean_and_population_std() -> None:
    labels = {
        "1": {"0": SOLVED, "1": SOLVED, "2": SOLVED, "3": SOLVED},
        "2": {"0": UNSOLVED, "1": UNSOLVED, "2": UNSOLVED, "3": UNSOLVED},
        "3": {"0": SOLVED, "1": UNSURE, "2": UNSOLVED, "3": UNSOLVED},
        "4": {"0": UNSURE, "1": SOLVED, "2": SOLVED, "3": UNSOLVED},
    }
    got = pass_rate(labels, 4)
    # per evaluation: (1 + 0 + 1 + 0.5) / 4, (1 + 0 + 0.5 + 1) / 4, (1 + 0 + 0 + 1) / 4, (1 + 0 + 0 + 0) / 4
    assert got.per_evaluation == [62.5, 62.5, 50.0, 25.0]
    assert got.solve_rate == pytest.approx(50.0)
    # population std of (0.625, 0.625, 0.5, 0.25): sqrt(((0.125)^2 * 2 + 0 + 0.25^2) / 4)
    assert got.std == pytest.approx(((0.125**2 * 2 + 0.25**2) / 4) ** 0.5 * 100)
    assert got.queries == 4


def test_a_missing_evaluation_scores_zero_and_integer_keys_are_the_same_keys() -> None:
    got = pass_rate({"7": {0: SOLVED, 1: SOLVED}, "8": {"0": SOLVED}}, 3)
    assert got.per_evaluation == [100.0, 50.0, 0.0]
    assert got.solve_rate == pytest.approx(50.0)


def test_no_query_or_no_evaluation_is_refused() -> None:
    with pytest.raises(ValueError, match="no query"):
        pass_rate({}, 4)
    with pytest.raises(ValueError, match="evaluate_times"):
        pass_rate({"1": {"0": SOLVED}}, 0)


def test_a_label_or_preference_file_of_another_shape_is_a_score_error_naming_it(tmp_path: Path) -> None:
    from stabletoolbench_mirror.scoring.score import ScoreError, pass_rate_file, win_rate

    labels = tmp_path / "G1_run.json"
    for solved in ({"x": "AnswerStatus.Solved"}, {"1" * 5000: "AnswerStatus.Solved"}):
        labels.write_text(json.dumps({"1": {"is_solved": solved}}))
        with pytest.raises(ScoreError, match=r"G1_run.json: evaluation .*: an evaluation's number \(0, 1, ...\) expected"):
            pass_rate_file(labels, 2)
    votes = tmp_path / "G1_ref_run.json"
    votes.write_text(json.dumps({"1": {"ref": "3", "run": 1}}))
    with pytest.raises(ScoreError, match="G1_ref_run.json: query 1: the votes for ref and run must be numbers"):
        win_rate(votes, "ref", "run")
    votes.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ScoreError, match="nested deeper than 500 levels"):
        win_rate(votes, "ref", "run")
