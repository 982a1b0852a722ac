"""Prediction intervals: how far measured iteration times fell from the predictions on sources the model was
not fitted on (leave-one-source-out residuals, written by `solve validate --write-intervals`).

With r = log(predicted / measured) over the visible reference runs, a prediction T has the interval
[T exp(-r90), T exp(-r10)]: the p10-p90 range of what a run like the reference ones measured."""

from __future__ import annotations

import functools
import json
import math

from formulation.data import DATA_DIR

INTERVALS_PATH = DATA_DIR / "intervals.json"


@functools.cache
def _quantiles() -> tuple[float, float] | None:
    if not INTERVALS_PATH.is_file():
        return None
    data = json.loads(INTERVALS_PATH.read_text())
    return data["log_residual_p10"], data["log_residual_p90"]


def prediction_interval(iteration_time_s: float) -> tuple[float, float] | None:
    """(p10, p90) of the measured iteration time for this prediction; None without stored residuals."""
    q = _quantiles()
    if q is None:
        return None
    return iteration_time_s * math.exp(-q[1]), iteration_time_s * math.exp(-q[0])


def intervals_overlap(best, other) -> bool:
    """Whether a runner-up's interval reaches into the best plan's: the two are then a tie (`--top K`)."""
    return bool(best and other and other[0] <= best[1])
