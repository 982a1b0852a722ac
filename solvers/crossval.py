"""Leave-one-source-out cross-validation: refit on the other sources, predict the held-out one.

Library API (also used by the physics work for its ablations):

    from solvers.crossval import cross_validate
    result = cross_validate(runs)                      # default fit/predict: solvers.calibrate
    result["sources"], result["pooled"], result["groups"], result["rows"]

`fit(train_runs) -> params` and `predict(run, params) -> Estimate` can be replaced (e.g. a model variant).
`ablation(runs)` repeats it with each term of `formulation.terms.TERMS` switched off.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable

from formulation import terms
from formulation.evaluate import evaluate
from formulation.memory import GIB

from .calibrate import excluded_reason, fit_on, parameters_for, with_parameters
from .runs import Run

GB = 1e9
MIN_GROUP_RUNS = 4


def predict_with(run: Run, fitted: dict):
    """The evaluator's estimate of `run` with the fold's fitted parameters for its chip and stack."""
    return evaluate(with_parameters(run, parameters_for(run, fitted)), run.placement, check=False)


def scorable(run: Run) -> bool:
    return run.skipped_reason is None and excluded_reason(run) is None


def score(run: Run, est, fold: str) -> dict:
    """One row of the table: time error (if time was measured), memory error (if measured), OOM verdicts."""
    capacity = min(m.memory.capacity_gib for m in est.stages)
    peak_gb = est.peak_memory_gib * GIB / GB
    measured = run.measured_iter_s
    return {"row": run.label, "source": fold, "model": run.name, "gpu_type": run.gpu_type, "group": run.group,
            "predicted_iter_s": est.iteration_time_s, "measured_iter_s": measured,
            "relative_error": est.iteration_time_s / measured - 1 if measured else None,
            "predicted_peak_memory_gb": peak_gb, "measured_peak_memory_gb": run.measured_peak_memory_gb,
            "memory_relative_error": (peak_gb / run.measured_peak_memory_gb - 1
                                      if run.measured_peak_memory_gb else None),
            "predicted_oom": est.peak_memory_gib > capacity, "measured_oom": run.measured_oom}


def cross_validate(runs: list[Run], fit: Callable = fit_on, predict: Callable = predict_with,
                   progress: Callable[[str], None] | None = None) -> dict:
    """Per source: fit on all other sources, score this one. Returns rows, per-source table, pooled, groups."""
    candidates = [r for r in runs if scorable(r)]
    folds = sorted({r.source_key for r in candidates})
    rows = []
    for i, fold in enumerate(folds, 1):
        if progress:
            progress(f"[{i}/{len(folds)}] fitting without {fold}")
        params = fit([r for r in runs if r.source_key != fold])
        rows += [score(r, predict(r, params), fold) for r in candidates if r.source_key == fold]
    return summarise(rows)


def in_sample(runs: list[Run], fitted: dict | None = None) -> dict:
    """The same table with one fit on every source (what the model was tuned to: not a test)."""
    fitted = fit_on(runs) if fitted is None else fitted
    return summarise([score(r, predict_with(r, fitted), r.source_key) for r in runs if scorable(r)])


def summarise(rows: list[dict]) -> dict:
    by_source = {}
    for r in rows:
        by_source.setdefault(r["source"], []).append(r)
    return {"rows": rows, "sources": {k: time_stats(v) for k, v in sorted(by_source.items())},
            "pooled": time_stats(rows) | memory_stats(rows), "groups": rank_groups(rows)}


def time_stats(rows: list[dict]) -> dict:
    timed = [r for r in rows if r["relative_error"] is not None]
    out = {"runs": len(rows), "timed": len(timed),
           "fit_but_measured_oom": sum(1 for r in rows if r["measured_oom"] and not r["predicted_oom"])}
    if timed:
        worst = max(timed, key=lambda r: abs(r["relative_error"]))
        out |= {"median_signed_error": statistics.median(r["relative_error"] for r in timed),
                "median_abs_error": statistics.median(abs(r["relative_error"]) for r in timed),
                "worst_row": worst["row"], "worst_error": worst["relative_error"]}
    return out


def memory_stats(rows: list[dict]) -> dict:
    errs = [r["memory_relative_error"] for r in rows if r["memory_relative_error"] is not None]
    return {"memory_runs": len(errs),
            "memory_median_signed_error": statistics.median(errs) if errs else None,
            "memory_median_abs_error": statistics.median(abs(e) for e in errs) if errs else None,
            "predicted_oom_but_ran": sum(1 for r in rows if r["predicted_oom"] and not r["measured_oom"])}


def rank_groups(rows: list[dict]) -> list[dict]:
    """Spearman of predicted vs measured time inside each sweep of >= MIN_GROUP_RUNS timed runs."""
    groups = {}
    for r in rows:
        if r["relative_error"] is not None:
            groups.setdefault(tuple(r["group"]), []).append(r)
    return [{"group": list(k), "source": v[0]["source"], "runs": len(v),
             "spearman": spearman([r["predicted_iter_s"] for r in v], [r["measured_iter_s"] for r in v])}
            for k, v in groups.items() if len(v) >= MIN_GROUP_RUNS]


def spearman(xs: list[float], ys: list[float]) -> float | None:
    """Rank correlation with average ranks for ties; None when undefined (fewer than 2 values, constant)."""
    def ranks(v):
        order = sorted(range(len(v)), key=v.__getitem__)
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r
    if len(xs) < 2:
        return None
    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    num = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    den = (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5
    return num / den if den else None


def ablation(runs: list[Run], names: list[str] | None = None, progress=None) -> list[dict]:
    """Pooled cross-source figures with all terms on, then with each registered term off (refitting each time)."""
    table = [{"term": "(all on)", **cross_validate(runs, progress=progress)["pooled"]}]
    for name in names or list(terms.TERMS):
        with terms.disabled(name):
            table.append({"term": f"without {name}", **cross_validate(runs, progress=progress)["pooled"]})
    return table


def stderr_progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
