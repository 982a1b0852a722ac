"""Leave-one-source-out figures of docs/physics.md (until `solve validate` reports them itself).

    .venv/bin/python docs/physics_loso.py [--off=term,term ...]      # about 10 minutes on one core

For each source family of the visible reference runs (published_runs.csv and published_runs_torchtitan.csv,
torchtitan rows numbered from 1000), refit `solve calibrate`'s parameters of every calibration key the family
uses on the other families only (Nelder-Mead, 150 iterations), falling back to the chip's Megatron fit and
then to the catalog default, and predict the family. Prints per family: runs, median signed error, median
|error|, worst row; the pooled figures, FP8 rows and measured peak memory. `--off` switches physics terms of
`formulation.physics.cost.PHYSICS_TERMS` off (the ablation table of docs/physics.md).
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import sys

import numpy as np
from scipy.optimize import minimize

from formulation.data import REFERENCE_DIR
from formulation.evaluate import evaluate
from formulation.inputs.gpus import CALIBRATION_PATH
from formulation.physics import cost
from solvers.validation import calibrate
from solvers.validation.runs import load_runs

FAMILIES = [("SC21", "sc21"), ("Korthikanti", "korthikanti"), ("Sept 2020", "megatron-2020"),
            ("Training Speed", "megatron-2024"), ("strong scaling", "megatron-2024"),
            ("dgxc-benchmarking", "dgxc"), ("performance_summary", "nemo-perf"),
            ("performance_long_sequence", "nemo-longseq"), ("llm-foundry", "llm-foundry"),
            ("examples/llama", "megatron-llama-examples"), ("torchtitan", "torchtitan")]
DEFAULT = {k: v for k, v in json.loads(CALIBRATION_PATH.read_text())["default"].items() if k in calibrate.FITTED}
CACHED = ("_links_cache", "gpu_node", "gpu_local", "node_offset", "node_index")


def family(source: str) -> str:
    return next((name for key, name in FAMILIES if key in source), source[:30])


def with_parameters(run, params: dict):
    """calibrate.with_parameters, keeping the cluster's memoised group links (five times faster)."""
    inst = run.instance
    for name in CACHED:
        getattr(inst.cluster, name)
    types = {n: dataclasses.replace(t, **params) for n, t in inst.cluster.gpu_types.items()}
    cluster = dataclasses.replace(inst.cluster, gpu_types=types)
    cluster.__dict__.update({name: inst.cluster.__dict__[name] for name in CACHED})
    return dataclasses.replace(inst, cluster=cluster)


def runs() -> list:
    visible = load_runs(REFERENCE_DIR / "published_runs.csv")
    titan = load_runs(REFERENCE_DIR / "published_runs_torchtitan.csv")
    for r in titan:
        r.row += 1000
    return [r for r in visible + titan if r.skipped_reason is None and r.row not in calibrate.EXCLUDED]


def key(run) -> str | None:
    return calibrate.calibration_key(run) if calibrate.chip_of(run.gpu_type) else None


def fit(rows: list) -> dict:
    x0 = np.array([math.log(0.75 / 0.25), math.log(20.0), math.log(0.45 / 0.55)])
    free = len(x0) if len(rows) >= calibrate.MIN_ROWS_FULL_FIT else 1

    def params(z):
        x = np.concatenate([z, x0[free:]])
        return {"matmul_efficiency": 1 / (1 + math.exp(-x[0])), "efficiency_half_gflop": math.exp(x[1]),
                "attention_efficiency": 1 / (1 + math.exp(-x[2]))}

    def objective(z):
        return sum(math.log(evaluate(with_parameters(r, params(z)), r.placement, check=False).iteration_time_s
                            / r.measured_iter_s) ** 2 for r in rows)

    result = minimize(objective, x0[:free], method="Nelder-Mead",
                      options={"maxiter": 150, "xatol": 1e-3, "fatol": 1e-6})
    return params(result.x)


def predictions(all_runs: list) -> list[dict]:
    full, out = {}, []
    for fam in sorted({family(r.source) for r in all_runs}):
        held = [r for r in all_runs if family(r.source) == fam]
        fits = {}
        for k in {key(r) for r in held if key(r)}:
            rest = [r for r in all_runs if key(r) == k and family(r.source) != fam]
            if rest:
                fits[k] = fit(rest)
        for r in held:
            k = key(r)
            chip = k.partition("+")[0] if k else None
            if k and k not in fits and chip not in fits:
                rest = [x for x in all_runs if key(x) == chip and family(x.source) != fam]
                fits[chip] = full.setdefault(chip, fit(rest)) if rest else None
            # no other source fits this chip: the catalog default, never the shipped fit (made on this source)
            params = (fits.get(k) or fits.get(chip) if k else None) or DEFAULT
            est = evaluate(with_parameters(r, params), r.placement, check=False)
            out.append({"row": r.row, "family": fam, "error": est.iteration_time_s / r.measured_iter_s - 1,
                        "fp8": r.instance.training.precision == "fp8",
                        "memory_error": (est.peak_memory_gib * 2 ** 30 / 1e9 / r.measured_peak_memory_gb - 1
                                         if r.measured_peak_memory_gb else None)})
    return out


def report(out: list[dict]) -> None:
    print(f"{'source':24s} {'n':>3s} {'median':>8s} {'|median|':>8s} worst")
    for fam in sorted({o["family"] for o in out}):
        rows = [o for o in out if o["family"] == fam]
        errors = [o["error"] for o in rows]
        worst = max(rows, key=lambda o: abs(o["error"]))
        print(f"{fam:24s} {len(rows):3d} {statistics.median(errors):+8.3f} {statistics.median(map(abs, errors)):8.3f} "
              f"row {worst['row']} {worst['error']:+.3f}")
    errors = [o["error"] for o in out]
    print(f"{'POOLED':24s} {len(out):3d} {statistics.median(errors):+8.3f} {statistics.median(map(abs, errors)):8.3f}")
    fp8 = [abs(o["error"]) for o in out if o["fp8"]]
    print(f"FP8 rows {len(fp8)}: median |error| {statistics.median(fp8):.3f}")
    memory = [o for o in out if o["memory_error"] is not None]
    print("peak memory: " + ", ".join(f"row {o['row']} {o['memory_error']:+.3f}" for o in memory)
          + f"; median |error| {statistics.median(abs(o['memory_error']) for o in memory):.3f}")


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        if arg.startswith("--off="):
            for term in arg[len("--off="):].split(","):
                cost.PHYSICS_TERMS[term] = False
    report(predictions(runs()))
