"""Fit the per-GPU-type efficiency parameters on measured runs; the result is data (calibration.json).

Fitted per chip and software stack (all memory sizes and form factors of one chip share the fit): one number,
the large-GEMM efficiency `matmul_efficiency` (C1). The shape scale `efficiency_half_gflop` (C1) and the
attention-core efficiency `attention_efficiency` (C2) are catalog facts, not fits (gpu_types.json, cited in
docs/physics.md): fitted per chip and stack they were degenerate (a GEMM half-point of 566 GFLOP and an
attention efficiency of 1.0 on 8 rows) and moved from fold to fold, which is what made predictions of unseen
sources drift. Objective: the sum of squared log errors of predicted iteration time over the calibration
split (rows not held out by `is_test_row`). A fixed per-iteration overhead was tried as a fourth
parameter and did not lower the held-out error, so it stays 0 (users may set `iteration_overhead_s`).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
from scipy.optimize import minimize

from formulation.inputs.gpus import CALIBRATION_PATH, CATALOG_PATH
from formulation.evaluate import evaluate

from solvers.validation.runs import Run, is_test_row

# Which catalog types share a chip (and so a fit), keyed by the type whose rows calibrate it.
CHIPS = {
    "a100-sxm-80gb": ("a100-sxm-80gb", "a100-sxm-40gb", "a100-pcie-80gb"),
    "h100-sxm-80gb": ("h100-sxm-80gb", "h100-pcie-80gb", "h100-sxm-96gb-500w", "h200-sxm-141gb"),
    "v100-sxm-32gb": ("v100-sxm-32gb",),
}
FITTED = ("matmul_efficiency",)
# Rows not used for fitting nor for the accuracy figures, with the reason (printed by `solve validate`).
EXCLUDED = {
    row: "DeepSpeed ZeRO-3 baseline of SC21 (2021): its per-parameter gathers ran far below NCCL link bandwidth "
         "(measured 3-5x slower than the bandwidth bound); our ZeRO-3 model assumes bucketed per-layer "
         "gathers at full bandwidth as in PyTorch FSDP, which the MPT rows validate"
    for row in range(10, 16)
}


def chip_of(gpu_type: str) -> str | None:
    return next((chip for chip, members in CHIPS.items() if gpu_type in members), None)


def with_parameters(run: Run, params: dict):
    """The run's instance with its GPU type's parameters replaced (instances are immutable)."""
    inst = run.instance
    types = {name: dataclasses.replace(t, **params) for name, t in inst.cluster.gpu_types.items()}
    cluster = dataclasses.replace(inst.cluster, gpu_types=types)
    return dataclasses.replace(inst, cluster=cluster)


def to_params(x: np.ndarray) -> dict:
    """Unconstrained search space: the logit of the GEMM efficiency."""
    return {"matmul_efficiency": 1 / (1 + math.exp(-x[0]))}


def to_vector(params: dict) -> np.ndarray:
    """The inverse of `to_params`."""
    p = min(max(params["matmul_efficiency"], 1e-6), 1 - 1e-6)
    return np.array([math.log(p / (1 - p))])


def log_errors(runs: list[Run], params: dict) -> np.ndarray:
    return np.array([math.log(evaluate(with_parameters(r, params), r.placement, check=False).iteration_time_s
                              / r.measured_iter_s) for r in runs])


def usable(runs: list[Run]) -> list[Run]:
    return [r for r in runs if r.skipped_reason is None and r.row not in EXCLUDED and chip_of(r.gpu_type) and r.fitted]


def calibration_key(run: Run) -> str:
    """Where a run's fit is stored: the chip's type name, suffixed by a non-default software stack."""
    chip, stack = chip_of(run.gpu_type), run.instance.training.software_stack
    return chip if stack == "megatron" else f"{chip}+{stack}"


def fit(runs: list[Run]) -> dict[str, dict]:
    """Per chip and software stack, the parameters minimising squared log error on the calibration split."""
    fitted = {}
    train = [r for r in usable(runs) if not is_test_row(r.row)]
    for key in sorted({calibration_key(r) for r in train}):
        rows = [r for r in train if calibration_key(r) == key]

        def objective(x: np.ndarray) -> float:
            return float(np.sum(log_errors(rows, to_params(x)) ** 2))

        result = minimize(objective, np.array([math.log(0.75 / 0.25)]), method="Nelder-Mead",
                          options={"maxiter": 200, "xatol": 1e-5, "fatol": 1e-9})
        params = to_params(result.x)
        fitted[key] = {k: round(v, 6) for k, v in params.items()} | {"fitted_on_rows": [r.row for r in rows]}
    return fitted


def write_calibration(fitted: dict[str, dict], path: Path = CALIBRATION_PATH) -> None:
    """Rewrite calibration.json: the fitted chip's values for every catalog type of that chip."""
    current = json.loads(path.read_text())
    catalog = json.loads(CATALOG_PATH.read_text())
    for key, values in fitted.items():
        chip, _, stack = key.partition("+")
        for name in CHIPS[chip]:
            if name in catalog:
                current[name + (f"+{stack}" if stack else "")] = {k: values[k] for k in FITTED} | {
                    "fitted_on": f"{key} rows {values['fitted_on_rows']}"}
    current["_comment"] = ("Fitted by `solve calibrate --write` on the calibration split (rows with row % 3 != 0) of "
                           "the packaged reference runs (published_runs.csv and published_runs_torchtitan.csv, whose "
                           "rows count from 1000): matmul_efficiency only, per chip and software stack; the shape and "
                           "attention parameters are catalog facts (gpu_types.json). `default` fills GPU types "
                           "without a fit.")
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(current, indent=2) + "\n")
    tmp.replace(path)
