"""Prediction intervals: how far measured iteration times fell from the predictions on sources the model was
not fitted on (leave-one-source-out residuals, written by `solve validate --write-intervals`).

With r = log(predicted / measured) over the visible reference runs, a prediction T has the interval
[T exp(-r90), T exp(-r10)]: the p10-p90 range of what a run like the reference ones measured.

The quantiles are taken per precision group: runs whose GEMMs ran in FP8, and the 16-bit rest. The model's
errors differ between the two (cross-source median signed error about -7% for the FP8 runs, near 0 for the
others), so one pooled band is lopsided for both: predicted from the other sources' residuals, 29% of the
FP8 runs measured slower than the pooled band's slow end (10% nominal) and 16% of the 16-bit runs faster than
its fast end. Per group the tails are 11-15% each and the band narrows from 0.22 to 0.15 in log
(docs/validation.md, "Prediction intervals"). A group with fewer than MIN_GROUP_RUNS residuals uses the pooled
quantiles. The bands are shared by the software stacks, but the PyTorch stacks' runs fall beyond the slow end far
more often than the Megatron stack's; bands per stack did not hold out by source (docs/validation.md), so the
share is stored instead and the report states it (slow_tail_share)."""

from __future__ import annotations

import functools
import json
import math

from formulation.data import DATA_DIR
from formulation.inputs.job import PYTORCH_STACKS
from formulation.physics.cost import fp8_gemms

INTERVALS_PATH = DATA_DIR / "intervals.json"
POOLED = "pooled"
FP8, SIXTEEN_BIT = "fp8", "16-bit"
MIN_GROUP_RUNS = 20


def stack_kind(job) -> str:
    """"pytorch" for the PyTorch stacks (torchtitan, llm-foundry), else "megatron": the intervals' tails differ
    between the two (slow_tail_share)."""
    return "pytorch" if job.software_stack in PYTORCH_STACKS else "megatron"


def slow_tail_share(kind: str) -> float | None:
    """The share of published runs of a stack kind (stack_kind) that measured slower than the slow end of the
    band they were scored against (held out by source; `solve validate --write-intervals` stores it), None where
    it was not stored."""
    return _stored().get("slower_than_p90_by_stack", {}).get(kind)


def interval_group(job, gpu_type) -> str:
    """The residual group of a prediction: FP8 where the job's GEMMs run in FP8 on this GPU type (an FP8 job on
    a GPU without FP8 tensor cores runs them in bf16), else 16-bit."""
    return FP8 if fp8_gemms(job, gpu_type) else SIXTEEN_BIT


def _stored() -> dict:
    """What `solve validate --write-intervals` stored; empty without the file."""
    return json.loads(INTERVALS_PATH.read_text()) if INTERVALS_PATH.is_file() else {}


@functools.cache
def _quantiles() -> dict[str, tuple[float, float]]:
    """Group -> (p10, p90) of log(predicted / measured); empty without a stored file."""
    data = _stored()
    if not data:
        return {}
    out = {POOLED: (data["log_residual_p10"], data["log_residual_p90"])}
    for group, q in data.get("by_precision", {}).items():
        if q["runs"] >= MIN_GROUP_RUNS:
            out[group] = (q["log_residual_p10"], q["log_residual_p90"])
    return out


def interval_basis(group: str) -> str | None:
    """The residuals a prediction of `group` takes its interval from: the group's own where enough are stored,
    else the pooled ones; None without stored residuals."""
    stored = _quantiles()
    return group if group in stored else POOLED if stored else None


def prediction_interval(iteration_time_s: float, group: str = POOLED) -> tuple[float, float] | None:
    """(p10, p90) of the measured iteration time for this prediction (interval_basis(group)'s quantiles); None
    without stored residuals."""
    basis = interval_basis(group)
    if basis is None:
        return None
    q = _quantiles()[basis]
    return iteration_time_s * math.exp(-q[1]), iteration_time_s * math.exp(-q[0])


def intervals_overlap(best, other) -> bool:
    """Whether a runner-up's interval reaches into the best plan's: the two are then a tie (`--top K`)."""
    return bool(best and other and other[0] <= best[1])
