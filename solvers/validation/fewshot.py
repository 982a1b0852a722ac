"""Few-shot calibration on a user's own runs: at most three knobs (compute scale, network scale, fixed
per-iteration overhead) fitted on two or more measured runs of their cluster and stack.

The fit minimises the Huber loss of the log error of iteration time (robust to a run the model gets far wrong)
plus a pull of each knob toward "no change" whose strength is how far clusters were seen to differ (an
empirical prior, below), so that a knob moves as far as the runs speak for it. Measured on every pair and on
subsets of 3, 4 and 6 runs of every visible cluster (docs/fewshot_pairs.py, docs/validation.md): from three runs
on, three knobs beat the compute scale alone (4.3% against 4.5% with three, 3.2% against 4.3% with six). With two
runs the compute scale alone is the better (4.2% against 4.7%, seven of nineteen clusters above 5% either way), and
two runs cannot tell a slower network from slower compute: a cluster 20%
slower in compute is read by three knobs as a network at 0.56 of its speed plus 40 ms of overhead (its other
runs then 5-12% off), and recovered by the compute scale alone (tests/test_crossval.py). So fewer than three
runs fit the compute scale only. The former fixed weak pull (0.05 on every knob) gave 5.9% with two runs,
worse than no calibration on several clusters."""

from __future__ import annotations

import math
import statistics

import numpy as np
from scipy.optimize import least_squares

from formulation.evaluate import evaluate
from formulation.inputs.user_calibration import UserCalibration, apply_user_calibration
from solvers.validation.crossval import Prediction, spearman
from solvers.validation.joint_fit import huber_loss

# How far the knobs differ between clusters: per source and GPU type with >= 4 visible runs, the three knobs
# fitted on all its runs over the leave-one-source-out model; their rms over the 14 groups (log compute scale,
# log network scale, overhead as a share of the mean iteration time). The network scale is barely determined
# by most groups' runs (their communication is small or hidden), hence its wide spread and weak pull.
KNOB_SPREAD = (0.17, 1.22, 0.054)
# rms of a run's log error once its cluster's knobs are fitted (the same groups): the scale of one run's say
RUN_SPREAD = 0.057
MIN_RUNS_FOR_ALL_KNOBS = 3
# A run's residual counts in full up to this many RUN_SPREADs and linearly beyond (Huber's loss, at the usual
# 95%-efficiency constant): cross-source residuals are heavy-tailed (a few runs 20-50% off in sources whose
# median is within 5%), so a run far from its companions moves the fit by a bounded amount, and two runs that
# contradict each other leave the knobs nearer to "no change" than to their midpoint.
HUBER_RUNS = 1.345
# Two runs' log errors each spread by RUN_SPREAD around their cluster's common factor, so one run predicted from a
# fit on the other is off by sqrt(2) x RUN_SPREAD at one standard deviation. A median leave-one-out error beyond
# that says the runs differ by more than a common factor explains, and the calibration then predicts the cluster's
# other configurations about twice as far off: over every pair of the visible clusters' runs a median error of
# 6.9% where the pair's leave-one-out error is beyond it, 2.7% where it is within; over 3-run subsets 5.3% against
# 2.9% (docs/fewshot_pairs.py --disagreement). `solve calibrate` and `solve --calibration` warn then.
DISAGREEMENT = math.sqrt(2) * RUN_SPREAD


def _knobs(z: np.ndarray, mean_time_s: float) -> UserCalibration:
    return UserCalibration(compute_scale=math.exp(z[0]), network_scale=math.exp(z[1]),
                           iteration_overhead_s=max(0.0, z[2]) * mean_time_s)


def huber_residual(r: float, scale: float = HUBER_RUNS * RUN_SPREAD) -> float:
    """A residual whose square is Huber's loss of r (joint_fit.huber_loss: r itself within `scale`, then growing
    as sqrt(|r|)): least squares on these minimises the Huber loss; continuous with its first derivative at
    `scale`."""
    return math.copysign(math.sqrt(float(huber_loss(r, scale))), r)


def fit_user_calibration(cases: list[tuple], names: tuple = ()) -> UserCalibration:
    """`cases`: (instance, placement, measured iteration time) of the user's runs; >= 1. Fewer than
    MIN_RUNS_FOR_ALL_KNOBS runs fit the compute scale only."""
    mean_time = statistics.fmean(t for *_, t in cases)
    free = 3 if len(cases) >= MIN_RUNS_FOR_ALL_KNOBS else 1
    pull = np.array([RUN_SPREAD / spread for spread in KNOB_SPREAD[:free]])

    def residuals(x: np.ndarray) -> np.ndarray:
        z = np.concatenate([x, np.zeros(3 - free)])
        cal = _knobs(z, mean_time)
        errs = [huber_residual(math.log(evaluate(apply_user_calibration(inst, cal), p, check=False).iteration_time_s
                                        / t)) for inst, p, t in cases]
        return np.concatenate([errs, pull * x])

    # start strictly inside the bounds: the trust region collapses on a variable that starts on its bound
    result = least_squares(residuals, np.array([0.0, 0.0, 0.01][:free]),
                           bounds=([-2.0, -3.0, 0.0][:free], [2.0, 3.0, 5.0][:free]), diff_step=1e-3, max_nfev=80)
    cal = _knobs(np.concatenate([result.x, np.zeros(3 - free)]), mean_time)
    return UserCalibration(cal.compute_scale, cal.network_scale, cal.iteration_overhead_s, tuple(names))


def leave_one_out(cases: list[tuple], names: tuple) -> tuple[UserCalibration, list[float]]:
    """The fit on all runs, and each run's error when predicted from a fit on the others."""
    errors = []
    if len(cases) >= 2:
        for k, (inst, p, t) in enumerate(cases):
            cal = fit_user_calibration(cases[:k] + cases[k + 1:])
            errors.append(evaluate(apply_user_calibration(inst, cal), p, check=False).iteration_time_s / t - 1)
    full = fit_user_calibration(cases, names)
    loo = statistics.median(abs(e) for e in errors) if errors else None
    return UserCalibration(full.compute_scale, full.network_scale, full.iteration_overhead_s, names, loo), errors


def disagreement_warning(cal: UserCalibration) -> str | None:
    """One line for a calibration whose runs disagree beyond DISAGREEMENT (its stored leave-one-out error), else
    None."""
    loo = cal.leave_one_out_error
    if isinstance(loo, bool) or not isinstance(loo, (int, float)) or not loo >= DISAGREEMENT:
        return None
    return (f"the calibration runs disagree (median leave-one-out error {100 * loo:.1f} %, above "
            f"{100 * DISAGREEMENT:.1f} %): the model misses a difference between their configurations that no "
            "common knob removes; on the reference clusters, calibrations whose runs disagreed this much predicted "
            "their other configurations with a median error of 5-7 % (3 % where the runs agreed). Add runs like the "
            "plans you will compare (docs/validation.md)")


def clusters(predictions: list[Prediction], min_runs: int = 4) -> list[tuple[str, list[Prediction]]]:
    """The clusters few-shot calibration is measured on: a source's runs on one GPU type, >= `min_runs` runs, each
    sorted by measured time; named by the source (and GPU type where the source ran several)."""
    keys = sorted({(p.family, p.run.gpu_type) for p in predictions})
    families = [family for family, _ in keys]
    several_types = {family for family in families if families.count(family) > 1}
    out = []
    for family, gpu_type in keys:
        items = sorted((p for p in predictions if (p.family, p.run.gpu_type) == (family, gpu_type)),
                       key=lambda p: p.run.measured_iter_s)
        if len(items) >= min_runs:
            out.append((f"{family} ({gpu_type})" if family in several_types else family, items))
    return out


def few_shot_table(predictions: list[Prediction], shots: int = 2, min_runs: int = 4) -> list[dict]:
    """For every cluster (`clusters`): calibrate on `shots` of its runs on top of the cross-validated model,
    predict the others. The calibration runs are those at the lower and upper quartile of measured time: they span
    the cluster's range as a user's first runs would, without resting the fit on its most extreme configuration.
    One pair of many a user could start from: `every_pair_table` is the measure."""
    out = []
    for name, items in clusters(predictions, min_runs):
        picks = sorted({round(q * (len(items) - 1)) for q in (0.25, 0.75)})[:shots]
        chosen = [items[i] for i in picks]
        rest = [p for p in items if p not in chosen]
        cal = fit_user_calibration([(p.instance, p.run.placement, p.run.measured_iter_s) for p in chosen])
        after = [evaluate(apply_user_calibration(p.instance, cal), p.run.placement, check=False).iteration_time_s
                 for p in rest]
        errors = [a / p.run.measured_iter_s - 1 for a, p in zip(after, rest)]
        out.append({"source": name, "predicted_runs": len(rest), "calibrated_on": [p.run.row for p in chosen],
                    "median_abs_error_before": statistics.median(abs(p.error) for p in rest),
                    "median_abs_error_after": statistics.median(abs(e) for e in errors),
                    "log_errors_after": [math.log1p(e) for e in errors],
                    "spearman_after": spearman(after, [p.run.measured_iter_s for p in rest]) if len(rest) >= 4
                    else None, "knobs": cal.to_dict()})
    return out


# every_pair_table tabulates each run's log iteration time at these log compute scales (linear between knots; the
# fit's bounds are wider, but no visible pair fits beyond +-0.4) and fits each pair on FINE_LOG_C
KNOT_LOG_C = np.linspace(-0.6, 0.6, 49)
FINE_LOG_C = np.linspace(-0.6, 0.6, 1201)


def tabulated_log_times(p: Prediction) -> np.ndarray:
    """log(iteration time) of one prediction at FINE_LOG_C compute scales (the two-run rule's only knob)."""
    knots = [math.log(evaluate(apply_user_calibration(p.instance, UserCalibration(math.exp(c))), p.run.placement,
                               check=False).iteration_time_s) for c in KNOT_LOG_C]
    return np.interp(FINE_LOG_C, KNOT_LOG_C, knots)


def every_pair_table(predictions: list[Prediction], min_runs: int = 4) -> list[dict]:
    """Per cluster (`clusters`), over every pair of its runs: the two-run rule (the compute scale alone, with
    fit_user_calibration's Huber loss and pull, on a grid of the knob) fitted on the pair, the median |error| of
    the cluster's other runs. A user may start from any two of their runs, so the figure of the procedure is the
    median over pairs (with its quartiles and the share of pairs above 5 %), not one pair's."""
    pull = (RUN_SPREAD / KNOB_SPREAD[0] * FINE_LOG_C) ** 2
    out = []
    for name, items in clusters(predictions, min_runs):
        # per run: log(predicted / measured) at every compute scale of the grid
        residuals = np.array([tabulated_log_times(p) - math.log(p.run.measured_iter_s) for p in items])
        losses = huber_loss(residuals, HUBER_RUNS * RUN_SPREAD)
        per_pair = []
        for a in range(len(items)):
            for b in range(a + 1, len(items)):
                k = int(np.argmin(losses[a] + losses[b] + pull))
                rest = [abs(math.expm1(residuals[j, k])) for j in range(len(items)) if j not in (a, b)]
                per_pair.append(statistics.median(rest))
        q1, median, q3 = np.percentile(per_pair, [25, 50, 75])
        out.append({"source": name, "runs": len(items), "pairs": len(per_pair), "median_over_pairs": float(median),
                    "quartiles": [float(q1), float(q3)],
                    "share_of_pairs_above_5_percent": sum(e > 0.05 for e in per_pair) / len(per_pair)})
    return out
