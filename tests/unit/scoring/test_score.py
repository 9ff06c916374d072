"""StableToolBench's pass rate: Solved 1, Unsure 0.5, per evaluation; the mean and the population std, percent."""

from __future__ import annotations

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
