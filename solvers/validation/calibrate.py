"""Fit the per-GPU-type efficiency parameters on measured runs; the result is data (calibration.json).

Fitted per chip and software stack (all memory sizes and form factors of one chip share the fit): one number,
the large-GEMM efficiency `matmul_efficiency` (C1). The shape scale `efficiency_half_gflop` (C1) and the
attention-core efficiency `attention_efficiency` (C2) are catalog facts, not fits (gpu_types.json, cited in
docs/physics.md): fitted per chip and stack they were degenerate (a GEMM half-point of 566 GFLOP and an
attention efficiency of 1.0 on 8 rows) and moved from fold to fold, which is what made predictions of unseen
sources drift. Objective: the sum of squared log errors of predicted iteration time over the calibration
split (rows not held out by `is_test_row`), jointly with one per-iteration overhead `iteration_overhead_s`
(C14) shared by every chip and stack (solvers/validation/joint_fit.py; fitted per chip it was degenerate).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from formulation.inputs.gpus import CALIBRATION_PATH, CATALOG_PATH

from solvers.validation.joint_fit import TimeTables, joint_fit
from solvers.validation.runs import Run, is_test_row

# Which catalog types share a chip (and so a fit), keyed by the type whose rows calibrate it.
CHIPS = {
    "a100-sxm-80gb": ("a100-sxm-80gb", "a100-sxm-40gb", "a100-pcie-80gb"),
    "h100-sxm-80gb": ("h100-sxm-80gb", "h100-pcie-80gb", "h100-sxm-96gb-500w", "h200-sxm-141gb", "h200-nvl-141gb",
                      "h20-96gb"),
    "v100-sxm-32gb": ("v100-sxm-32gb",),
    # Blackwell (B200 on HGX boards, GB200 in NVL72 racks) and Blackwell Ultra (B300, GB300): two dies, two fits;
    # their peaks differ by form factor (gpu_types.json), so the efficiency against the peak is what they share
    "b200": ("b200", "gb200"),
    "gb300": ("gb300", "b300"),
}
FITTED = ("matmul_efficiency",)  # per chip and stack; iteration_overhead_s is shared (`default`)
# The chips whose runs choose the shared per-iteration overhead (C14). A chip added to CHIPS later fits its
# GEMM efficiency at that overhead (joint_fit's `votes`), so adding its runs moves no other chip's figures;
# making it a voter is a decision of its own, measured leave-one-source-out (docs/validation.md).
OVERHEAD_CHIPS = ("a100-sxm-80gb", "h100-sxm-80gb", "v100-sxm-32gb")


def votes_on_overhead(key: str) -> bool:
    """Whether a calibration key's runs choose the shared overhead (OVERHEAD_CHIPS)."""
    return key.partition("+")[0] in OVERHEAD_CHIPS


def chip_of(gpu_type: str) -> str | None:
    return next((chip for chip, members in CHIPS.items() if gpu_type in members), None)


def with_parameters(run: Run, params: dict):
    """The run's instance with its GPU type's parameters replaced (instances are immutable)."""
    inst = run.instance
    types = {name: dataclasses.replace(t, **params) for name, t in inst.cluster.gpu_types.items()}
    cluster = dataclasses.replace(inst.cluster, gpu_types=types)
    return dataclasses.replace(inst, cluster=cluster)


def usable(runs: list[Run]) -> list[Run]:
    return [r for r in runs if r.skipped_reason is None and chip_of(r.gpu_type) and r.fitted]


def calibration_key(run: Run) -> str:
    """Where a run's fit is stored: the chip's type name, suffixed by a non-default software stack."""
    chip, stack = chip_of(run.gpu_type), run.instance.training.software_stack
    return chip if stack == "megatron" else f"{chip}+{stack}"


def fit(runs: list[Run]) -> dict[str, dict]:
    """Per chip and software stack, the GEMM efficiency and the shared per-iteration overhead (in every entry)
    minimising the squared log error on the calibration split (solvers/validation/joint_fit.py)."""
    train = [r for r in usable(runs) if not is_test_row(r.row)]
    result = joint_fit(train, calibration_key, TimeTables(train, with_parameters), votes_on_overhead)
    return {key: {"matmul_efficiency": round(efficiency, 6), "iteration_overhead_s": result.overhead_s,
                  "fitted_on_rows": [r.row for r in train if calibration_key(r) == key]}
            for key, efficiency in result.efficiency.items()}


def write_calibration(fitted: dict[str, dict], path: Path = CALIBRATION_PATH) -> None:
    """Rewrite calibration.json: the fitted chip's values for every catalog type of that chip."""
    current = json.loads(path.read_text())
    catalog = json.loads(CATALOG_PATH.read_text())
    for key, values in fitted.items():
        current["default"]["iteration_overhead_s"] = values["iteration_overhead_s"]  # shared: the same in each
        chip, _, stack = key.partition("+")
        for name in CHIPS[chip]:
            if name in catalog:
                current[name + (f"+{stack}" if stack else "")] = {k: values[k] for k in FITTED} | {
                    "fitted_on": f"{key} rows {values['fitted_on_rows']}"}
    current["_comment"] = ("Fitted by `solve calibrate --write` on the calibration split (rows with row % 3 != 0) of "
                           "the packaged reference runs (published_runs.csv and the files crossval.reference_runs "
                           "numbers from 1000 on): matmul_efficiency per chip and software stack, and one "
                           "iteration_overhead_s shared by all (in `default`, chosen by the runs of OVERHEAD_CHIPS in "
                           "solvers/validation/calibrate.py); the shape and attention parameters "
                           "are catalog facts (gpu_types.json). `default` fills GPU types without a fit.")
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(current, indent=2) + "\n")
    tmp.replace(path)
