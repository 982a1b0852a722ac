"""Prediction intervals by evidence: how far measured iteration times fell from the predictions where the model
knew as much about a run as it knows about this estimate (written by `solve validate --write-intervals`).

With r = log(predicted / measured), a prediction T has the interval [T exp(-r90), T exp(-r10)]: the p10-p90 of
what runs like it measured. Which runs are "like it" depends on what the visible reference holds for it
(`evidence`), three levels:

- profiled: the stack has measured runs on this GPU chip, at this fabric and in this regime. The quantiles are
  those of the leave-one-source-out residuals, per precision group (FP8 GEMMs or 16-bit: the model's errors
  differ between the two; a group of fewer than MIN_GROUP_RUNS residuals takes the pooled quantiles).
- NEW_SETUP: the stack has measured runs, but none on this GPU chip, or at this fabric (intra-node link class,
  inter-node bandwidth within a factor FABRIC_FACTOR), or in one of REGIMES. Quantiles of runs held out by
  cluster: one source's runs on one GPU chip predicted with nothing fitted on that source nor on that stack's
  runs on that chip.
- UNPROFILED: no measured runs of the stack (megatron-deepspeed, or a name no modelled stack has: nanotron,
  maxtext, ...; planned as megatron, formulation/inputs/job.py). Quantiles of runs held out by stack: each stack's
  runs predicted with nothing fitted on that stack (the Megatron-Core efficiency of their chip, what an unprofiled
  stack is planned with), so the band is the spread of efficiencies between the stacks, not within one.

The NEW_SETUP band is symmetric (+-p80 of |r|): which way an unmeasured GPU or regime departs is not known, only
how far the measured ones did (solvers/validation/evidence.py, band). The UNPROFILED band leans slow: every measured
stack's runs shifted so that their median departure lies on the slow side, one vote per stack (evidence.stack_band;
the decision and its coverage: docs/uncertainty.md). Neither is narrower than the profiled band of the estimate's
precision group on either side. Every estimate carries its level and what is
missing (`Estimate.interval_group`: a precision group, or `level+precision`; `interval_gaps`), and
`interval_note` says it in one line with what would narrow it (docs/uncertainty.md)."""

from __future__ import annotations

import functools
import json
import math
import weakref

import numpy as np

from formulation.data import DATA_DIR
from formulation.inputs.job import PYTORCH_STACKS
from formulation.physics.collectives import fabrics
from formulation.physics.cost import fp8_gemms

INTERVALS_PATH = DATA_DIR / "intervals.json"
POOLED = "pooled"
FP8, SIXTEEN_BIT = "fp8", "16-bit"
PROFILED, NEW_SETUP, UNPROFILED = "profiled", "new-setup", "unprofiled-stack"
MIN_GROUP_RUNS = 20
# A fabric counts as measured for a stack when one of its runs had the same intra-node link class and an
# inter-node bandwidth per GPU within this factor; a fabric kind other than InfiniBand (network.inter_node_fabric)
# has no measured run, since the published runs name none and are read as InfiniBand
FABRIC_FACTOR = 2.0
NVLINK_MIN_GB_PER_S = 100.0  # below: GPUs that talk over PCIe inside a node
SMALL_MODEL_PARAMS = 10e9
# Regimes where the model's terms are stretched: a stack without a measured run in one is NEW_SETUP there
# (expert parallelism: the MoE reference runs are predicted, never part of the bands' hold-outs)
REGIMES = ("FP8 GEMMs", "pp >= 16", "cp >= 8", "dp >= 64 with a model under 10B parameters",
           "expert parallelism (ep > 1)")
CHIP_MATCH = 0.02  # a GPU is a measured chip when its bf16 peak is within 2% of one


def stack_kind(job) -> str:
    """"pytorch" for the PyTorch stacks (torchtitan, llm-foundry), else "megatron": the intervals' tails differ
    between the two (slow_tail_share)."""
    return "pytorch" if job.software_stack in PYTORCH_STACKS else "megatron"


def slow_tail_share(kind: str) -> float | None:
    """The share of published runs of a stack kind (stack_kind) that measured slower than the slow end of the
    band they were scored against (held out by source; `solve validate --write-intervals` stores it), None where
    it was not stored."""
    return stored().get("slower_than_p90_by_stack", {}).get(kind)


def interval_group(job, gpu_type) -> str:
    """The residual group of a profiled prediction: FP8 where the job's GEMMs run in FP8 on this GPU type (an FP8
    job on a GPU without FP8 tensor cores runs them in bf16), else 16-bit."""
    return FP8 if fp8_gemms(job, gpu_type) else SIXTEEN_BIT


def stack_name(job) -> str:
    """The stack the instance named (an unmodelled name included)."""
    return job.unmodelled_stack or job.software_stack


def regimes(job, model, gpu_type, p) -> tuple[str, ...]:
    """The REGIMES a placement is in."""
    flags = (fp8_gemms(job, gpu_type), p.pp >= 16, p.cp >= 8, p.dp >= 64 and model.total_params < SMALL_MODEL_PARAMS,
             p.ep > 1)
    return tuple(name for name, on in zip(REGIMES, flags) if on)


_FABRICS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def fabric(cluster) -> tuple[str, float | None]:
    """(intra-node link class, median inter-node bandwidth per GPU in GB/s or None on one node) of a cluster."""
    if cluster not in _FABRICS:
        intra = cluster.intra_gb_per_s[0]
        link = float(np.median(intra[~np.eye(len(intra), dtype=bool)])) if len(intra) > 1 else math.inf
        inter = cluster.inter_gb_per_s
        across = None if len(inter) < 2 else float(np.median(np.delete(inter[0], 0)))
        _FABRICS[cluster] = ("NVLink" if link >= NVLINK_MIN_GB_PER_S else "PCIe", across)
    return _FABRICS[cluster]


def fabric_covered(mine: tuple[str, float | None], seen: list) -> bool:
    """Whether a measured run's fabric (seen: [link class, inter GB/s or None]) stands for this one."""
    for link, across in seen:
        if link != mine[0]:
            continue
        if mine[1] is None or (across is not None and abs(math.log(mine[1] / across)) <= math.log(FABRIC_FACTOR)):
            return True
    return False


def evidence(job, model, cluster, gpu_type, p) -> tuple[str, tuple[str, ...]]:
    """(interval group, what has no measured runs) of an estimate: a precision group where everything has
    measured runs of its stack, else NEW_SETUP or UNPROFILED with the missing pieces named. Without stored
    evidence (no intervals file, or one written before evidence was stored), the precision group alone."""
    profiles = stored().get("evidence")
    group = interval_group(job, gpu_type)
    if not profiles:
        return group, ()
    stack = stack_name(job)
    seen = profiles.get(stack)
    if not seen:
        return f"{UNPROFILED}+{group}", (f"no measured runs of {stack}",)
    gaps = []
    if not any(abs(gpu_type.peak_tflops / peak - 1) <= CHIP_MATCH for peak in seen["gpu_peak_tflops"].values()):
        gaps.append(f"no measured run of {stack} on {gpu_type.name}")
    elif not chip_measured_in(seen, gpu_type, group) and (group != FP8 or REGIMES[0] in seen["regimes"]):
        # (an FP8 estimate of a stack never measured in FP8 is named once, by its regime below)
        gaps.append(f"no measured {group} run of {stack} on {gpu_type.name}")
    mine = fabric(cluster)
    if not fabric_covered(mine, seen["fabrics"]):
        across = "one node" if mine[1] is None else f"{mine[1]:g} GB/s per GPU between nodes"
        gaps.append(f"no measured run of {stack} on {mine[0]} with {across}")
    kind = getattr(cluster, "inter_fabric", "infiniband")
    if len(cluster.nodes) > 1 and fabrics()["inter"][kind] is not fabrics()["inter"]["infiniband"]:
        # the published runs name no fabric and are read as InfiniBand (the default): another named fabric has none
        gaps.append(f"no measured run of {stack} on {kind} (the published runs are read as InfiniBand)")
    gaps += [f"no measured run of {stack} with {r}" for r in regimes(job, model, gpu_type, p) if r not in seen["regimes"]]
    return (f"{NEW_SETUP}+{group}", tuple(gaps)) if gaps else (group, ())


def chip_measured_in(seen: dict, gpu_type, group: str) -> bool:
    """Whether a stack's evidence has a run on this GPU's chip in this precision group (a chip measured only in FP8
    says nothing measured of its 16-bit GEMMs). Evidence stored before it was kept per precision: the chip alone."""
    by_precision = seen.get("gpu_peak_tflops_by_precision")
    if by_precision is None:
        return True
    return any(abs(gpu_type.peak_tflops / peak - 1) <= CHIP_MATCH for peak in by_precision.get(group, {}).values())


def stored() -> dict:
    """What `solve validate --write-intervals` stored; empty without the file (read once per path: every
    evaluation asks for the evidence)."""
    return _read(INTERVALS_PATH)


@functools.cache
def _read(path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


@functools.cache
def _quantiles() -> dict[str, tuple[float, float]]:
    """Group -> (p10, p90) of log(predicted / measured); empty without a stored file."""
    data = stored()
    if not data:
        return {}
    out = {POOLED: (data["log_residual_p10"], data["log_residual_p90"])}
    for group, q in (data.get("by_precision", {}) | data.get("levels", {})).items():
        if q["runs"] >= MIN_GROUP_RUNS:
            out[group] = (q["log_residual_p10"], q["log_residual_p90"])
    return out


def interval_basis(group: str) -> str | None:
    """The residuals a prediction of `group` takes its interval from: the group's own where enough are stored,
    else the pooled ones; None without stored residuals. A level beyond profiled is written `level+precision`
    (evidence): its basis is the level's."""
    quantiles = _quantiles()
    level = group.partition("+")[0]
    return level if level in quantiles else POOLED if quantiles else None


def prediction_interval(iteration_time_s: float, group: str = POOLED) -> tuple[float, float] | None:
    """(p10, p90) of the measured iteration time for this prediction (interval_basis(group)'s quantiles); None
    without stored residuals. A level beyond profiled never ends inside its precision group's profiled band on
    either side (the slow-leaning unprofiled band's fast end takes the profiled band's)."""
    basis = interval_basis(group)
    if basis is None:
        return None
    quantiles = _quantiles()
    lo, hi = quantiles[basis]
    precision = group.partition("+")[2]
    if precision:
        inner = quantiles[interval_basis(precision)]
        lo, hi = min(lo, inner[0]), max(hi, inner[1])
    return iteration_time_s * math.exp(-hi), iteration_time_s * math.exp(-lo)


def _half_width_pct(q: dict | None) -> str:
    return "?" if not q else f"{100 * (math.exp((q['log_residual_p90'] - q['log_residual_p10']) / 2) - 1):.0f}"


def interval_note(group: str, gaps: tuple[str, ...]) -> str | None:
    """One line: the basis of an estimate's interval and what would narrow it; None without stored residuals."""
    basis = interval_basis(group)
    if basis is None:
        return None
    full, group = group, group.partition("+")[0]
    data = stored()
    after = _half_width_pct(data.get("after_two_runs"))
    calibrate = (f"`solve calibrate --runs yours.csv --output cal.json` on 2 runs, then `--calibration cal.json`, "
                 f"narrows this to about +-{after} %")
    if group == UNPROFILED and basis == group:
        spread = data["levels"][UNPROFILED].get("stack_spread")
        lo, hi = prediction_interval(1.0, full)
        return (f"{gaps[0]}: Megatron-Core efficiency assumed; measured stacks predicted so, with nothing fitted on "
                f"them, were off by up to {100 * spread:.0f} % (median per stack), and the band leans slow "
                f"(T x {lo:.2f} to T x {hi:.2f}): the stacks measured so far run slower than Megatron-Core; "
                f"{calibrate}")
    if group == NEW_SETUP and basis == group:
        return (f"{'; '.join(gaps)}: band of runs predicted with nothing fitted on their source nor on their "
                f"stack's runs on their GPU; {calibrate}")
    what = {FP8: "FP8 runs", SIXTEEN_BIT: "16-bit runs"}.get(basis, "runs")
    return (f"measured runs of this stack on this GPU, fabric and regime: band of the model's errors on other "
            f"sources' published {what}" + (f" ({'; '.join(gaps)})" if gaps else ""))


def intervals_overlap(best, other) -> bool:
    """Whether a runner-up's interval reaches into the best plan's: the two are then a tie (`--top K`)."""
    return bool(best and other and other[0] <= best[1])
