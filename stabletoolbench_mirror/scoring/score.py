"""A run's score from its label files: the Solvable Pass Rate (SoPR) and the Solvable Win Rate (SoWR), each rule once.

The figures are upstream's own, computed the way its scripts print them, from the files they write:

* **SoPR** (``eval_pass_rate``'s ``{group}_{label}.json``: per query ``is_solved`` by evaluation): for each
  evaluation ``k`` of ``evaluate_times``, the share of the file's queries whose evaluation ``k`` says
  ``AnswerStatus.Solved`` (1) or ``AnswerStatus.Unsure`` (0.5), a missing evaluation 0; the solve rate is
  their mean and ``std`` their population standard deviation, in percent.  A query counts as ``solved``
  when more than half of its evaluations say ``Solved``.
* **SoWR** (``eval_preference``'s ``{group}_{reference}_{label}.json``: per query the votes for each run):
  a query is a win when the candidate's votes exceed the reference's, a loss when fewer, a tie when equal;
  ``win``, ``tie`` and ``lose`` are fractions of the file's queries.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stabletoolbench_mirror.scoring.contents import ContentsError, read_json

SOLVED = "AnswerStatus.Solved"
UNSURE = "AnswerStatus.Unsure"
#: what one label adds to an evaluation's score (every other label adds 0)
WEIGHTS = {SOLVED: 1.0, UNSURE: 0.5}


class ScoreError(ValueError):
    """A label or preference file cannot be read as upstream writes it (the message names the file)."""


def _read(path: Path) -> dict[str, Any]:
    """A label or preference file, read bounded (:func:`.contents.read_json`)."""
    try:
        data = read_json(path)
    except FileNotFoundError as exc:
        raise ScoreError(f"{path}: cannot be read ({exc})") from None
    except ContentsError as exc:
        raise ScoreError(str(exc)) from None
    if not isinstance(data, dict):
        raise ScoreError(f"{path}: a JSON object by query id expected")
    return data


def evaluations(entry: Any) -> dict[str, str]:
    """One query's labels by evaluation (``{"0": "AnswerStatus.Solved", ...}``) in a label file's entry."""
    solved = entry.get("is_solved", {}) if isinstance(entry, dict) else {}
    return {str(k): str(v) for k, v in solved.items()} if isinstance(solved, dict) else {}


def is_solved(labels: Mapping[str, str]) -> bool:
    """More than half of the evaluations say ``Solved``."""
    return sum(1 for v in labels.values() if v == SOLVED) * 2 > len(labels) > 0


@dataclass(frozen=True)
class PassRate:
    """One test set's pass rate: percent, as ``eval_pass_rate`` prints it (``Solve rate: X% Std: Y%``)."""

    solve_rate: float
    std: float
    per_evaluation: list[float]
    """Each evaluation's score, percent."""
    queries: int

    def figures(self) -> dict[str, Any]:
        """As ``score.json`` holds them."""
        return {"solve_rate": self.solve_rate, "std": self.std, "per_evaluation": self.per_evaluation, "queries": self.queries}


def _evaluation(key: Any) -> int:
    """An evaluation's number (``"0"``, ``1``): :class:`ScoreError` for anything else (a label file is input)."""
    text = str(key)
    if not (text.isascii() and text.isdigit() and len(text) <= 4):
        raise ScoreError(f"evaluation {text[:40]!r}: an evaluation's number (0, 1, ...) expected")
    return int(text)


def pass_rate(labels: Mapping[str, Mapping[Any, str]], evaluate_times: int) -> PassRate:
    """The pass rate of ``{query_id: {evaluate_time: label}}`` over ``evaluate_times`` evaluations: the rule.

    ``evaluate_time`` keys are read as integers (``"0"`` and ``0`` are one); a query without a label for
    an evaluation scores 0 in it, as upstream's does.  :class:`ScoreError` for no query or no evaluation
    (upstream divides by zero there).
    """
    if not labels:
        raise ScoreError("no query has a label: a pass rate needs at least one")
    if evaluate_times < 1:
        raise ScoreError(f"evaluate_times must be at least 1, not {evaluate_times}")
    by_time = [{_evaluation(time): label for time, label in evaluations.items()} for evaluations in labels.values()]
    scores = [sum(WEIGHTS.get(evaluations.get(time, ""), 0.0) for evaluations in by_time) / len(by_time)
              for time in range(evaluate_times)]
    return PassRate(solve_rate=statistics.fmean(scores) * 100, std=statistics.pstdev(scores) * 100,
                    per_evaluation=[score * 100 for score in scores], queries=len(by_time))


def pass_rate_file(labels_file: Path, evaluate_times: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """``({"solve_rate", "std", "per_evaluation", "queries"}, {query_id: {"evaluations", "solved"}})`` of one label file
    (``eval_pass_rate``'s ``.json``); an empty file scores 0."""
    per_query = {qid: evaluations(entry) for qid, entry in _read(labels_file).items()}
    try:
        figures = pass_rate(per_query, evaluate_times).figures() if per_query else \
            {"solve_rate": 0.0, "std": 0.0, "per_evaluation": [0.0] * evaluate_times, "queries": 0}
    except ScoreError as exc:
        raise ScoreError(f"{labels_file}: {exc}") from None
    labels = {qid: {"evaluations": dict(sorted(ev.items())), "solved": is_solved(ev)} for qid, ev in sorted(per_query.items())}
    return figures, labels


def win_rate(preference_file: Path, reference: str, label: str) -> dict[str, Any]:
    """``{"win", "tie", "lose", "queries"}`` of one preference file (``label`` against ``reference``)."""
    data = _read(preference_file)
    win = lose = tie = 0
    for qid, votes in data.items():
        if not isinstance(votes, dict):
            raise ScoreError(f"{preference_file}: query {qid}: votes expected")
        ref, candidate = votes.get(reference, 0), votes.get(label, 0)
        if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in (ref, candidate)):
            raise ScoreError(f"{preference_file}: query {qid}: the votes for {reference} and {label} must be numbers")
        if ref > candidate:
            lose += 1
        elif ref < candidate:
            win += 1
        else:
            tie += 1
    n = len(data)
    return {"win": win / n if n else 0.0, "tie": tie / n if n else 0.0, "lose": lose / n if n else 0.0, "queries": n}


def mean_or_none(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None
