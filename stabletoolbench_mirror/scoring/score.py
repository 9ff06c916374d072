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

import json
import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any

SOLVED = "AnswerStatus.Solved"
UNSURE = "AnswerStatus.Unsure"
_VALUE = {SOLVED: 1.0, UNSURE: 0.5}


class ScoreError(ValueError):
    """A label or preference file cannot be read as upstream writes it (the message names the file)."""


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ScoreError(f"{path}: cannot be read ({exc})") from None
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


def pass_rate(labels_file: Path, evaluate_times: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """``({"solve_rate", "std", "per_evaluation", "queries"}, {query_id: {"evaluations", "solved"}})`` of one label file."""
    data = _read(labels_file)
    per_query = {qid: evaluations(entry) for qid, entry in data.items()}
    scores = []
    for k in range(evaluate_times):
        total = sum(_VALUE.get(labels.get(str(k), ""), 0.0) for labels in per_query.values())
        scores.append(total / len(per_query) if per_query else 0.0)
    figures = {
        "solve_rate": 100 * statistics.fmean(scores) if scores else 0.0,
        "std": 100 * statistics.pstdev(scores) if scores else 0.0,
        "per_evaluation": [100 * s for s in scores],
        "queries": len(per_query),
    }
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
