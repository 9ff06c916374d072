"""StableToolBench's pass rate (SoPR) of one test set, computed as ``eval_pass_rate`` computes it.

``eval_pass_rate`` asks the judge ``--evaluate_times`` times per answer and writes each query's labels
(``{"is_solved": {"0": "AnswerStatus.Solved", "1": "AnswerStatus.Unsure", ...}}``).  Its score, per
evaluation ``i``: Solved counts 1, Unsure 0.5, anything else (Unsolved, or no label for ``i``) 0,
summed over the queries and divided by their number; the solve rate is the mean of those scores and
``Std`` their population standard deviation (``numpy.std``), both in percent.  :func:`pass_rate` is that
rule, written once for the ``score`` command and for ``report``.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass

SOLVED = "AnswerStatus.Solved"
UNSURE = "AnswerStatus.Unsure"
#: what one label adds to an evaluation's score (every other label adds 0)
WEIGHTS = {SOLVED: 1.0, UNSURE: 0.5}


@dataclass(frozen=True)
class PassRate:
    """One test set's pass rate: percent, as ``eval_pass_rate`` prints it (``Solve rate: X% Std: Y%``)."""

    solve_rate: float
    std: float
    per_evaluation: list[float]
    """Each evaluation's score, percent."""
    queries: int


def pass_rate(labels: Mapping[str, Mapping[str, str]], evaluate_times: int) -> PassRate:
    """The pass rate of ``{query_id: {evaluate_time: label}}`` over ``evaluate_times`` evaluations.

    ``evaluate_time`` keys are read as integers (``"0"`` and ``0`` are one); a query without a label for
    an evaluation scores 0 in it, as upstream's does.  :class:`ValueError` for no query or no evaluation
    (upstream divides by zero there).
    """
    if not labels:
        raise ValueError("no query has a label: a pass rate needs at least one")
    if evaluate_times < 1:
        raise ValueError(f"evaluate_times must be at least 1, not {evaluate_times}")
    by_time = [{int(time): label for time, label in evaluations.items()} for evaluations in labels.values()]
    scores = [sum(WEIGHTS.get(evaluations.get(time, ""), 0.0) for evaluations in by_time) / len(by_time)
              for time in range(evaluate_times)]
    return PassRate(
        solve_rate=statistics.fmean(scores) * 100,
        std=statistics.pstdev(scores) * 100,
        per_evaluation=[score * 100 for score in scores],
        queries=len(by_time),
    )
