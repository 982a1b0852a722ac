"""What the model knows about a prediction, measured: the reference runs predicted held out by source, by cluster
and by stack (solvers/validation/crossval.py, HOLDOUTS), the intervals each level of evidence gets from its own
hold-out (formulation/intervals.py), their coverage on runs they were not derived from, the evidence profile per
stack that `solve validate --write-intervals` stores, and the regret of the model's first choice per sweep group."""

from __future__ import annotations

import math
import statistics

import numpy as np

from formulation.inputs.gpus import gpu_catalog
from formulation.inputs.job import DEFAULT_STACK
from formulation.intervals import NEW_SETUP, POOLED, PROFILED, UNPROFILED, fabric, interval_group, regimes
from solvers.validation import crossval
from solvers.validation.calibrate import chip_of, with_parameters
from solvers.validation.crossval import (Prediction, log_residual, other_units_bands, p10_p90, residual_group,
                                         run_stack)
from solvers.validation.fewshot import few_shot_table
from solvers.validation.joint_fit import TimeTables
from solvers.validation.runs import Run

# The hold-out each level's band comes from (formulation/intervals.py)
LEVEL_HOLDOUT = {PROFILED: "source", NEW_SETUP: "cluster", UNPROFILED: "stack"}


def holdouts(runs: list[Run], progress=None, adjust=None) -> dict[str, list[Prediction]]:
    """The reference runs predicted under each hold-out of crossval.HOLDOUTS (one set of time tables)."""
    fitted = [r for r in crossval.scored(runs) if r.fitted and chip_of(r.gpu_type)]
    tables = TimeTables(fitted, with_parameters)
    return {by: crossval.cross_validate(runs, progress=progress, adjust=adjust, by=by, tables=tables)
            for by in crossval.HOLDOUTS}


def unit_of(by: str, p: Prediction) -> str:
    """The unit a band is held out from: a run's source (held out by source or cluster) or its stack."""
    return run_stack(p.run) if by == "stack" else p.family


def band(level: str, residuals: list[float]) -> tuple[float, float]:
    """The 80% band of log(predicted / measured) a level takes from residuals: per precision, p10-p90 where the
    stack is profiled; for a new setup symmetric, +-p80 of |r|: which way a GPU or regime the model has not measured
    for this stack departs is not known, only how far the measured ones departed. (An unprofiled stack's band is
    `stack_band`: it needs the residuals per stack.)"""
    if level == PROFILED:
        return p10_p90(residuals)
    width = statistics.quantiles([abs(r) for r in residuals], n=10, method="inclusive")[7]
    return -width, width


def weighted_quantile(values: list[float], weights: list[float], q: float) -> float:
    """The q-quantile of weighted values: each value at the midpoint of its share of the cumulative weight,
    linear between (Hazen's plotting position; with equal weights, the (i - 1/2) / n rule)."""
    order = np.argsort(values, kind="stable")
    v, w = np.asarray(values, float)[order], np.asarray(weights, float)[order]
    position = (np.cumsum(w) - w / 2) / w.sum()
    return float(np.interp(q, position, v))


def stack_band(by_stack: dict[str, list[float]]) -> tuple[float, float]:
    """The band of an unprofiled stack (held out by stack: each measured stack's runs predicted with nothing fitted
    on it). A stack's runs measure two things: how far its efficiency lies from the one it was predicted with (their
    median m, one draw of the spread between stacks) and how its runs spread about that (within the stack). The band
    takes every measured stack's residuals shifted so that its median lies on the slow side (r - m - |m|): a stack
    departs from Megatron-Core towards slow (the decision in docs/uncertainty.md: every measured stack runs slower than
    Megatron-Core, and so did every unmeasured stack seen but one), as far as the measured stacks departed; each stack
    weighs one (one draw of the between-stack spread, whatever its number of runs); p10 and p90."""
    values, weights = [], []
    for residuals in by_stack.values():
        m = statistics.median(residuals)
        values += [r - m - abs(m) for r in residuals]
        weights += [1 / len(residuals)] * len(residuals)
    return weighted_quantile(values, weights, 0.1), weighted_quantile(values, weights, 0.9)


def band_group(level: str, p: Prediction) -> str:
    """Profiled bands are per precision group; the other levels' are pooled (too few runs to split)."""
    return residual_group(p) if level == PROFILED else POOLED


def held_out_bands(level: str, predictions: list[Prediction]) -> dict[int, tuple[float, float]]:
    """Per timed run (by row): the level's band (`band`) of the other units' residuals of its band group (the
    pooled residuals where that group has fewer than MIN_GROUP_RUNS), from the level's own hold-out; a run whose
    unit is the only one has no band. UNPROFILED: the `stack_band` of the other stacks; the reference stack
    (Megatron-Core, what an unprofiled stack is planned as) held out is predicted with the slower stacks' efficiency,
    the mirror case, and is scored against the mirrored band."""
    by = LEVEL_HOLDOUT[level]
    timed = [(unit_of(by, p), band_group(level, p), log_residual(p), p.run.row) for p in predictions if p.timed]
    if level != UNPROFILED:
        return other_units_bands(timed, lambda residuals: band(level, residuals))
    out = {}
    for unit in sorted({u for u, *_ in timed}):
        others: dict[str, list[float]] = {}
        for u, _, r, _ in timed:
            if u != unit:
                others.setdefault(u, []).append(r)
        if not others:
            continue
        lo, hi = stack_band(others)
        out.update({row: (-hi, -lo) if unit == DEFAULT_STACK else (lo, hi) for u, _, _, row in timed if u == unit})
    return out


def coverage(predictions: list[Prediction], bands: dict[int, tuple[float, float]], key_of) -> dict:
    """Per key_of(prediction): runs, and the shares measured faster than the band (below p10), inside it, and
    slower (above p90): 10 / 80 / 10 % if the band is right."""
    counts: dict[str, list[int]] = {}
    for p in predictions:
        if not p.timed or p.run.row not in bands:
            continue
        lo, hi = bands[p.run.row]
        r = log_residual(p)
        counts.setdefault(key_of(p), [0, 0, 0])[0 if r > hi else 2 if r < lo else 1] += 1
    return {k: {"runs": sum(c), "faster_than_p10": c[0] / sum(c), "inside": c[1] / sum(c),
                "slower_than_p90": c[2] / sum(c)} for k, c in sorted(counts.items())}


def level_coverage(by_holdout: dict[str, list[Prediction]]) -> dict:
    """Each level's band on runs it was not derived from, per stack and per source (held out as the level is)."""
    out = {}
    for level, by in LEVEL_HOLDOUT.items():
        predictions = by_holdout[by]
        bands = held_out_bands(level, predictions)
        out[level] = {"held_out_by": by,
                      "by_stack": coverage(predictions, bands, lambda p: run_stack(p.run)),
                      "by_source": coverage(predictions, bands, lambda p: p.family),
                      "all": coverage(predictions, bands, lambda p: "all").get("all", {"runs": 0})}
    return out


def quantiles(values: list[float], level: str = PROFILED) -> dict:
    lo, hi = band(level, values)
    return {"log_residual_p10": round(lo, 6), "log_residual_p90": round(hi, 6), "runs": len(values)}


def stack_spread(predictions: list[Prediction]) -> dict[str, float]:
    """Held out by stack: each stack's median error (predicted / measured - 1) with nothing fitted on it."""
    stacks = sorted({run_stack(p.run) for p in predictions if p.timed})
    return {s: statistics.median(p.error for p in predictions if p.timed and run_stack(p.run) == s) for s in stacks}


def level_quantiles(by_holdout: dict[str, list[Prediction]]) -> dict:
    """The stored bands of the levels beyond `profiled` (whose bands are the per-precision ones): NEW_SETUP from
    the hold-out by cluster, UNPROFILED (`stack_band`) from the hold-out by stack, with the largest of the stacks'
    median errors held out (`stack_spread`)."""
    new = [log_residual(p) for p in by_holdout["cluster"] if p.timed]
    by_stack: dict[str, list[float]] = {}
    for p in by_holdout["stack"]:
        if p.timed:
            by_stack.setdefault(run_stack(p.run), []).append(log_residual(p))
    lo, hi = stack_band(by_stack)
    spread = stack_spread(by_holdout["stack"])
    return {NEW_SETUP: quantiles(new, NEW_SETUP),
            UNPROFILED: {"log_residual_p10": round(lo, 6), "log_residual_p90": round(hi, 6),
                         "runs": sum(len(r) for r in by_stack.values()),
                         "stack_spread": round(max(abs(e) for e in spread.values()), 4),
                         "median_error_by_stack": {s: round(e, 4) for s, e in spread.items()}}}


def after_two_runs(predictions: list[Prediction]) -> dict:
    """The band once a user calibrates on 2 runs of their own (solve calibrate --runs): every cluster of the
    hold-out by stack with >= 4 runs calibrated on 2 of them (fewshot.few_shot_table), the rest predicted."""
    rows = few_shot_table([p for p in predictions if p.timed])
    return quantiles([r for row in rows for r in row["log_errors_after"]]) | {"clusters": len(rows)}


def evidence_profile(runs: list[Run]) -> dict:
    """Per stack with timed runs: the GPU types measured (each with its bf16 peak; a type of the same peak counts as
    measured, formulation/intervals.py CHIP_MATCH), also per precision group (a chip measured only in FP8 has no
    measured 16-bit run), the
    fabrics (intra-node link class, inter-node GB/s per GPU or None on one node) and the REGIMES it was measured
    on (formulation/intervals.py reads it)."""
    catalog = gpu_catalog()
    out: dict[str, dict] = {}
    for run in crossval.scored(runs):
        if run.measured_iter_s is None:
            continue
        inst, p = run.instance, run.placement
        seen = out.setdefault(run_stack(run), {"runs": 0, "gpu_peak_tflops": {}, "gpu_peak_tflops_by_precision": {},
                                               "fabrics": [], "regimes": []})
        seen["runs"] += 1
        gpu = inst.cluster.gpu_types[inst.cluster.nodes[0].gpu_type]
        # the measured type only: a type that shares its chip's fit (H20, H100 PCIe) but not its peaks has no run
        if run.gpu_type in catalog:
            peak = catalog[run.gpu_type]["peak_tflops"]
            seen["gpu_peak_tflops"][run.gpu_type] = peak
            by_precision = seen["gpu_peak_tflops_by_precision"].setdefault(interval_group(inst.training, gpu), {})
            by_precision[run.gpu_type] = peak
        link, across = fabric(inst.cluster)
        if [link, across] not in seen["fabrics"]:
            seen["fabrics"].append([link, across])
        for regime in regimes(inst.training, inst.model, gpu, p):
            if regime not in seen["regimes"]:
                seen["regimes"].append(regime)
    for seen in out.values():
        seen["fabrics"].sort(key=lambda f: (f[0], f[1] or 0.0))
        seen["regimes"].sort()
        seen["gpu_peak_tflops_by_precision"] = dict(sorted(seen["gpu_peak_tflops_by_precision"].items()))
    return dict(sorted(out.items()))


def regret(predictions: list[Prediction], min_runs: int = 4) -> dict:
    """Inside each sweep group (crossval.summarize's, >= min_runs timed runs): the measured time of the
    configuration the model ranks first over the best measured one, - 1 (0: the model's first choice was the
    fastest measured); per group, and the median and worst over groups."""
    groups: dict[tuple, list[Prediction]] = {}
    for p in predictions:
        if p.timed:
            groups.setdefault(p.run.group, []).append(p)
    rows = []
    for group, items in sorted(groups.items(), key=lambda kv: str(kv[0])):
        if len(items) < min_runs:
            continue
        chosen = min(items, key=lambda p: (p.iteration_time_s, p.run.row))
        best = min(items, key=lambda p: (p.run.measured_iter_s, p.run.row))
        rows.append({"group": list(group), "runs": len(items), "chosen_row": chosen.run.row, "best_row": best.run.row,
                     "regret": chosen.run.measured_iter_s / best.run.measured_iter_s - 1})
    values = [r["regret"] for r in rows]
    return {"groups": rows, "median": statistics.median(values) if values else None,
            "worst": max(values) if values else None}


def prediction_bands(predictions: list[Prediction], held_out: bool) -> dict[int, tuple[float, float]]:
    """Per timed run: (p10, p90) of its measured time in seconds. Held out by source: the profiled band of the
    other sources' residuals; else (a user's runs, or in-sample) the interval its estimate carries."""
    if held_out:
        bands = held_out_bands(PROFILED, predictions)
        return {p.run.row: (p.iteration_time_s * math.exp(-bands[p.run.row][1]),
                            p.iteration_time_s * math.exp(-bands[p.run.row][0]))
                for p in predictions if p.timed and p.run.row in bands}
    out = {}
    for p in predictions:
        interval = p.interval_s if p.timed else None
        if interval:
            out[p.run.row] = tuple(interval)
    return out


def band_coverage(predictions: list[Prediction], bands: dict[int, tuple[float, float]]) -> dict:
    """The coverage of given bands in seconds (prediction_bands) per stack and per source."""
    log_bands = {p.run.row: (math.log(p.iteration_time_s / bands[p.run.row][1]),
                             math.log(p.iteration_time_s / bands[p.run.row][0]))
                 for p in predictions if p.timed and p.run.row in bands}
    return {"by_stack": coverage(predictions, log_bands, lambda p: run_stack(p.run)),
            "by_source": coverage(predictions, log_bands, lambda p: p.family)}
