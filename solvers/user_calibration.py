"""Few-shot calibration on a user's own measured runs: at most three per-cluster knobs.

    solve calibrate --runs mine.csv --output cal.json     # fit, print a summary with leave-one-out error
    solve --calibration cal.json ...                      # apply (also `solve --evaluate`, `solve validate`)

Knobs, applied on top of the shipped calibration (so 2 runs suffice):
- `compute_scale`: multiplies every GPU type's GEMM and attention efficiency (capped at 1 of peak);
- `network_scale`: multiplies every link bandwidth (intra-node, inter-node, per-pair overrides), i.e. the
  fraction of nominal bandwidth the collectives actually reach on this cluster;
- `iteration_overhead_s`: a fixed per-iteration cost (launch, data loader, logging, synchronisation).
How many are fitted grows with the runs: 2 runs fit compute_scale alone, 3 add the overhead, 4 or more
all three (a knob is only fitted when at least one run is left over to constrain it).
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from formulation.errors import InputError
from formulation.evaluate import evaluate

KNOBS = ("compute_scale", "network_scale", "iteration_overhead_s")
NEUTRAL = {"compute_scale": 1.0, "network_scale": 1.0, "iteration_overhead_s": 0.0}
FIT_ORDER = ("compute_scale", "iteration_overhead_s", "network_scale")
PRIOR_WEIGHT = 0.05  # a knob moving by e (or the overhead by the shortest run) costs as much as a 5 % misfit


def apply_calibration(instance, calibration: dict):
    """The instance with the knobs applied (absent knobs are neutral)."""
    cal = NEUTRAL | {k: v for k, v in calibration.items() if k in KNOBS}
    cluster = instance.cluster
    types = {name: dataclasses.replace(
        t, matmul_efficiency=min(1.0, t.matmul_efficiency * cal["compute_scale"]),
        attention_efficiency=min(1.0, t.attention_efficiency * cal["compute_scale"]),
        iteration_overhead_s=t.iteration_overhead_s + cal["iteration_overhead_s"])
        for name, t in cluster.gpu_types.items()}
    s = cal["network_scale"]
    cluster = dataclasses.replace(cluster, gpu_types=types, intra_gb_per_s=tuple(m * s for m in cluster.intra_gb_per_s),
                                  inter_gb_per_s=cluster.inter_gb_per_s * s,
                                  gpu_pair_gb_per_s={k: v * s for k, v in cluster.gpu_pair_gb_per_s.items()})
    return dataclasses.replace(instance, cluster=cluster)


def predicted_time(run, calibration: dict, base=None) -> float:
    inst = base(run) if base else run.instance
    return evaluate(apply_calibration(inst, calibration), run.placement, check=False).iteration_time_s


def fit_knobs(runs: list, base=None) -> dict:
    """Knobs minimising the squared log error of iteration time on `runs` (>= 2 timed runs).

    `base(run) -> Instance` gives the uncalibrated instance (default: the run's own, shipped calibration).
    """
    timed = [r for r in runs if r.measured_iter_s]
    if len(timed) < 2:
        raise InputError("calibration needs at least 2 runs with a measured iteration time")
    free = FIT_ORDER[:min(len(FIT_ORDER), len(timed) - 1)]
    shortest = min(r.measured_iter_s for r in timed)
    lower = {"compute_scale": 0.2, "network_scale": 0.05, "iteration_overhead_s": 0.0}
    upper = {"compute_scale": 3.0, "network_scale": 3.0, "iteration_overhead_s": 0.5 * shortest}
    start = {"compute_scale": 1.0, "network_scale": 1.0, "iteration_overhead_s": 0.01 * shortest}

    def residuals(x: np.ndarray) -> np.ndarray:
        cal = NEUTRAL | dict(zip(free, x))
        fit = [math.log(predicted_time(r, cal, base) / r.measured_iter_s) for r in timed]
        # A weak pull to neutral knobs: runs that barely differ (a weak-scaling sweep) cannot separate compute
        # from network from overhead, and without it the knobs run to their bounds.
        prior = [PRIOR_WEIGHT * (cal[k] / shortest if k == "iteration_overhead_s" else math.log(cal[k])) for k in free]
        return np.array(fit + prior)

    result = least_squares(residuals, [start[k] for k in free], bounds=([lower[k] for k in free],
                           [upper[k] for k in free]), diff_step=1e-3, xtol=1e-4, ftol=1e-6, max_nfev=80)
    return NEUTRAL | {k: float(v) for k, v in zip(free, result.x)} | {"fitted_knobs": list(free),
                                                                     "fitted_on": [r.label for r in timed]}


def leave_one_out(runs: list, base=None) -> list[dict]:
    """Each run predicted by knobs fitted on the others (needs >= 3 timed runs; else empty)."""
    timed = [r for r in runs if r.measured_iter_s]
    if len(timed) < 3:
        return []
    out = []
    for r in timed:
        cal = fit_knobs([o for o in timed if o is not r], base)
        out.append({"row": r.label, "measured_iter_s": r.measured_iter_s,
                    "predicted_iter_s": predicted_time(r, cal, base),
                    "relative_error": predicted_time(r, cal, base) / r.measured_iter_s - 1})
    return out


def summary_lines(cal: dict, loo: list[dict], runs: list) -> list[str]:
    """What a user reads after `solve calibrate`: the knobs in words, fit and leave-one-out errors."""
    lines = [f"calibrated on {len(cal['fitted_on'])} runs ({', '.join(cal['fitted_on'])}); fitted: "
             f"{', '.join(cal['fitted_knobs'])}",
             f"  compute efficiency x {cal['compute_scale']:.3f}   network bandwidth x {cal['network_scale']:.3f}"
             f"   fixed overhead {cal['iteration_overhead_s'] * 1e3:.1f} ms per iteration"]
    for r in runs:
        if r.measured_iter_s:
            p = predicted_time(r, cal)
            lines.append(f"  run {r.label}: measured {r.measured_iter_s:.3f} s, calibrated {p:.3f} s "
                         f"({100 * (p / r.measured_iter_s - 1):+.1f} %)")
    if loo:
        errs = [abs(x["relative_error"]) for x in loo]
        lines.append(f"leave-one-out on these runs: median |error| {100 * statistics.median(errs):.1f} %, "
                     f"max {100 * max(errs):.1f} %")
    else:
        lines.append("leave-one-out error: needs >= 3 runs (2 runs fit exactly one knob)")
    return lines


def load_calibration(path: str | Path) -> dict:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(f"{path}: <root>: expected a calibration JSON written by `solve calibrate` ({exc})")
    for k in KNOBS:
        if k in data and not isinstance(data[k], (int, float)):
            raise InputError(f"{path}: {k}: expected a number, got {data[k]!r}")
    return data


def few_shot(runs: list, progress=None, shots: int = 2) -> list[dict]:
    """Per source with >= shots + 2 timed runs: base model fitted without that source, knobs fitted on
    `shots` of its runs (evenly spaced in file order: what a user would have, not the best pair), the
    rest predicted. Returns per source: median |error| of the rest and Spearman inside its sweep groups."""
    from .calibrate import fit_on, parameters_for, with_parameters
    from .crossval import MIN_GROUP_RUNS, scorable, spearman

    timed = [r for r in runs if scorable(r) and r.measured_iter_s]
    table = []
    sources = sorted({r.source_key for r in timed})
    for i, source in enumerate(sources, 1):
        own = [r for r in timed if r.source_key == source]
        if len(own) < shots + 2:
            continue
        if progress:
            progress(f"[{i}/{len(sources)}] few-shot {source}")
        fitted = fit_on([r for r in runs if r.source_key != source])

        def base(run):
            return with_parameters(run, parameters_for(run, fitted))
        picked = [own[round(k * (len(own) - 1) / (2 * (shots - 1)))] if shots > 1 else own[0]
                  for k in range(shots)]
        cal = fit_knobs(picked, base)
        rest = [r for r in own if r not in picked]
        pred = {r.label: predicted_time(r, cal, base) for r in rest}
        errs = [pred[r.label] / r.measured_iter_s - 1 for r in rest]
        groups = {}
        for r in rest:
            groups.setdefault(r.group, []).append(r)
        rhos = [spearman([pred[r.label] for r in g], [r.measured_iter_s for r in g])
                for g in groups.values() if len(g) >= MIN_GROUP_RUNS]
        table.append({"source": source, "calibrated_on": [r.label for r in picked], "predicted": len(rest),
                      "median_abs_error": statistics.median(abs(e) for e in errs),
                      "median_signed_error": statistics.median(errs), "spearman_groups": rhos, "knobs": cal})
    return table
