"""Leave-one-source-out cross-validation: for each source (the paper, repository or document rows come from),
refit whatever is fitted on the other sources only, then predict that source.

Rows of one source share hardware, software, flags and authors, so a random split measures interpolation;
predicting a source that never took part in the fit is what a new user's cluster looks like. What is fitted
is what `calibrate` fits (solvers/validation/joint_fit.py): the per-chip, per-stack GEMM efficiency (C1) and
the per-iteration overhead every run shares (C14), by least squares of the log errors on the fold's own rows.
Nothing a fold uses has seen the held-out source. A chip and stack with no rows outside the held-out source
falls back to the chip's Megatron fit of the fold, else the catalog's uncalibrated default efficiency (with the
fold's overhead): what a new user gets.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import numpy as np

from formulation.data import REFERENCE_DIR
from formulation.evaluate import evaluate
from formulation.inputs.gpus import gpu_catalog
from formulation.intervals import MIN_GROUP_RUNS, POOLED, interval_group, stack_kind
from formulation.physics.memory import GIB
from solvers.validation.calibrate import calibration_key, chip_of, with_parameters
from solvers.validation.joint_fit import TimeTables, joint_fit
from solvers.validation.runs import Run, load_runs

# Source families: one family per document (or set of documents) written by one team for one stack and era.
FAMILIES = (("SC21", "Megatron-LM SC21 paper"), ("Korthikanti", "Korthikanti et al. 2022"),
            ("Sept 2020", "Megatron-LM README 2020"), ("Training Speed", "Megatron-LM README 2024"),
            ("strong scaling", "Megatron-LM README 2024"), ("examples/llama", "Megatron-LM Llama examples"),
            ("performance_summary", "NeMo performance summary"),
            ("performance_long_sequence", "NeMo long-sequence performance"),
            ("dgxc-benchmarking", "NVIDIA DGX Cloud benchmarking"), ("llm-foundry", "MosaicML llm-foundry"),
            ("trainy-whitefiber", "Trainy H200 (torchtitan)"), ("torchtitan", "torchtitan benchmarks"),
            ("fms-fsdp", "IBM fms-fsdp"),
            ("Megatron-MoE-ModelZoo", "Megatron MoE Model Zoo"),
            ("megatron/core/transformer/moe/README", "Megatron-LM MoE README"))
TORCHTITAN_ROW_OFFSET = 1000  # the torchtitan file's rows are numbered after the main file's
# the same benchmark page's float8 rows, in a file of our own (the two files above stay byte copies)
TORCHTITAN_FLOAT8_ROW_OFFSET = 1100
# benchmark files other teams submitted to torchtitan's benchmarks/ folder (another team's cluster: a source
# family of its own per team)
TORCHTITAN_COMMUNITY_ROW_OFFSET = 1200
# IBM's PyTorch FSDP benchmarks (foundation-model-stack/fms-fsdp), in a file of our own
FMS_FSDP_ROW_OFFSET = 1300


def source_family(source: str) -> str:
    return next((name for key, name in FAMILIES if key in source), source.split(" (")[0].strip())


def reference_runs() -> list[Run]:
    """Every packaged reference run: the main file, torchtitan's benchmarks (rows offset by 1000), their float8
    rows (offset by 1100), the community benchmark files of torchtitan's repository (offset by 1200) and IBM's
    fms-fsdp benchmarks (offset by 1300)."""
    runs = load_runs(REFERENCE_DIR / "published_runs.csv")
    for name, offset in (("published_runs_torchtitan.csv", TORCHTITAN_ROW_OFFSET),
                         ("published_runs_torchtitan_float8.csv", TORCHTITAN_FLOAT8_ROW_OFFSET),
                         ("published_runs_torchtitan_community.csv", TORCHTITAN_COMMUNITY_ROW_OFFSET),
                         ("published_runs_fms_fsdp.csv", FMS_FSDP_ROW_OFFSET)):
        for run in load_runs(REFERENCE_DIR / name):
            run.row += offset
            runs.append(run)
    return runs


def scored(runs: list[Run]) -> list[Run]:
    """Runs the model can score (a time and a configuration) and that no documented reason excludes."""
    return [r for r in runs if r.skipped_reason is None]


def measured_oom(runs: list[Run]) -> list[Run]:
    """Runs that measured out-of-memory (no time): scored on the memory call alone."""
    return [r for r in runs if r.measured_oom and r.instance is not None]


@dataclass
class Prediction:
    run: Run
    instance: object  # the run's instance with the fold's fitted parameters
    family: str
    iteration_time_s: float
    peak_memory_gib: float
    capacity_gib: float
    limit_gib: float

    @property
    def timed(self) -> bool:
        return self.run.measured_iter_s is not None

    @property
    def error(self) -> float:
        return self.iteration_time_s / self.run.measured_iter_s - 1


def cross_validate(runs: list[Run], in_sample: bool = False, progress=None, adjust=None) -> list[Prediction]:
    """Predict every scored run with parameters fitted on the other sources (`in_sample`: the stored
    calibration, fitted on all of them), and the memory of every run that measured out-of-memory.
    `adjust(instance)` is applied last (a user's calibration knobs)."""
    ooms = measured_oom(runs)
    runs = scored(runs)
    fitted = [r for r in runs if r.fitted and chip_of(r.gpu_type)]
    tables = None if in_sample else TimeTables(fitted, with_parameters)
    default_efficiency = gpu_catalog()["__default__"]["matmul_efficiency"]
    families = sorted({source_family(r.source) for r in runs} | {source_family(r.source) for r in ooms})
    out = []
    for k, family in enumerate(families):
        held = [r for r in runs + ooms if source_family(r.source) == family]
        fit = None if in_sample else joint_fit([r for r in fitted if source_family(r.source) != family],
                                               calibration_key, tables)
        for run in held:
            # the fold's overhead for every run, those of a chip without a fit (B200) included
            params = None if fit is None else {"iteration_overhead_s": fit.overhead_s}
            if params is not None and chip_of(run.gpu_type):
                key = calibration_key(run)
                # no rows of this chip elsewhere: the catalog's uncalibrated default efficiency, never the stored
                # fit (which saw this source)
                params["matmul_efficiency"] = fit.efficiency.get(key, fit.efficiency.get(key.partition("+")[0],
                                                                                         default_efficiency))
            instance = with_parameters(run, params) if params else run.instance
            instance = adjust(instance) if adjust else instance
            est = evaluate(instance, run.placement, check=False)
            out.append(Prediction(run, instance, family, est.iteration_time_s, est.peak_memory_gib,
                                  min(s.memory.capacity_gib for s in est.stages),
                                  min(s.memory.limit_gib for s in est.stages)))
        if progress:
            progress(k + 1, len(families), family)
    return out


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def spearman(xs: list[float], ys: list[float]) -> float | None:
    """Rank correlation (average ranks for ties); None below two points or with no spread."""
    if len(xs) < 2:
        return None
    rx, ry = (np.argsort(np.argsort(v, kind="stable")).astype(float) for v in (xs, ys))
    for ranks, v in ((rx, xs), (ry, ys)):  # ties share their average rank
        for value in set(v):
            idx = [i for i, x in enumerate(v) if x == value]
            ranks[idx] = ranks[idx].mean()
    if rx.std() == 0 or ry.std() == 0:
        return None
    return float(np.corrcoef(rx, ry)[0, 1])


def summarize(predictions: list[Prediction]) -> dict:
    """Per source and pooled: runs, median signed and absolute error, worst row; sweep-group rank
    correlations (groups of >= 4 runs); memory against measured peaks; out-of-memory calls."""
    def stats(items: list[Prediction]) -> dict:
        if not items:
            return {"runs": 0}
        worst = max(items, key=lambda p: abs(p.error))
        return {"runs": len(items), "median_error": _median([p.error for p in items]),
                "median_abs_error": _median([abs(p.error) for p in items]), "worst_row": worst.run.row,
                "worst_error": worst.error, "worst_model": worst.run.name}

    oom = [{"row": p.run.row, "family": p.family, "predicted_gib": p.peak_memory_gib, "capacity_gib": p.capacity_gib,
            "predicted_to_fit": p.peak_memory_gib <= p.capacity_gib}
           for p in predictions if p.run.measured_oom]
    predictions = [p for p in predictions if p.timed]
    families = sorted({p.family for p in predictions})
    groups: dict[tuple, list[Prediction]] = {}
    for p in predictions:
        groups.setdefault(p.run.group, []).append(p)
    sweeps = [{"group": list(g), "runs": len(items),
               "spearman": spearman([p.iteration_time_s for p in items], [p.run.measured_iter_s for p in items])}
              for g, items in sorted(groups.items(), key=lambda kv: str(kv[0])) if len(items) >= 4]
    memory = [{"row": p.run.row, "family": p.family, "predicted_gib": p.peak_memory_gib,
               "measured_gib": p.run.measured_peak_memory_gb * 1e9 / GIB,
               "error": p.peak_memory_gib / (p.run.measured_peak_memory_gb * 1e9 / GIB) - 1}
              for p in predictions if p.run.measured_peak_memory_gb]
    fp8 = [p for p in predictions if p.run.instance.training.precision == "fp8"]
    return {"sources": {f: stats([p for p in predictions if p.family == f]) for f in families},
            "pooled": stats(predictions), "fp8": stats(fp8),
            "unflagged": stats([p for p in predictions if not p.run.flags]), "sweep_groups": sweeps,
            "memory": {"rows": memory, "median_abs_error": _median([abs(m["error"]) for m in memory]),
                       "median_error": _median([m["error"] for m in memory])},
            "measured_oom": oom, "interval_coverage": interval_coverage(predictions),
            "ran_predicted_oom": sorted(p.run.row for p in predictions if p.peak_memory_gib > p.capacity_gib)}


def prediction_rows(predictions: list[Prediction]) -> list[dict]:
    """Per scored run: configuration, measured and predicted time, error, memory, unmodelled features."""
    out = []
    for p in predictions:
        if not p.timed:
            continue
        pl = p.run.placement
        out.append({"row": p.run.row, "family": p.family, "model": p.run.name, "gpu_type": p.run.gpu_type,
                    "config": f"{pl.sizes()} vpp={pl.vpp} mbs={pl.micro_batch_size} {pl.recompute}",
                    "precision": p.run.instance.training.precision, "measured_s": p.run.measured_iter_s,
                    "measured_how": p.run.measured_how, "predicted_s": p.iteration_time_s, "error": p.error,
                    "peak_memory_gib": p.peak_memory_gib, "capacity_gib": p.capacity_gib,
                    "flags": list(p.run.flags)})
    return out


def log_residuals(predictions: list[Prediction]) -> list[float]:
    return [math.log(p.iteration_time_s / p.run.measured_iter_s) for p in predictions if p.timed]


def residual_group(p: Prediction) -> str:
    """The interval group of a run (formulation/intervals.py): FP8 GEMMs or 16-bit."""
    cluster = p.instance.cluster
    return interval_group(p.instance.training, cluster.gpu_types[cluster.nodes[0].gpu_type])


def p10_p90(residuals: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(residuals, n=10, method="inclusive")
    return q[0], q[-1]


def interval_coverage(predictions: list[Prediction]) -> dict:
    """How the stored kind of interval fares on sources it was not derived from: for each source, the p10-p90 of
    the other sources' log residuals of the run's group (pooled where the group has fewer than MIN_GROUP_RUNS);
    per group, the share of runs measured faster than the band (below), inside it, and slower (above): 10%,
    80%, 10% if the band is right. `pooled` is the same with one band for all runs, for comparison; `by_stack`
    scores the per-precision bands again, counted by stack kind (formulation/intervals.py: the bands are shared
    by the stacks, their tails are not)."""
    timed = [(p.family, residual_group(p), stack_kind(p.instance.training),
              math.log(p.iteration_time_s / p.run.measured_iter_s)) for p in predictions if p.timed]
    counts: dict[str, dict[str, list[int]]] = {"by_precision": {}, POOLED: {}, "by_stack": {}}
    for mode in ("by_precision", POOLED):
        for family in sorted({f for f, *_ in timed}):
            others = [(g, r) for f, g, _, r in timed if f != family]
            for f, group, kind, r in timed:
                if f != family:
                    continue
                same = [x for g, x in others if g == group]
                band = same if mode != POOLED and len(same) >= MIN_GROUP_RUNS else [x for _, x in others]
                if len(band) < 2:  # no band without the source (a one-source file)
                    continue
                lo, hi = p10_p90(band)
                side = 0 if r > hi else 2 if r < lo else 1  # r > p90: predicted too slow, measured faster
                counts[mode].setdefault(group, [0, 0, 0])[side] += 1
                if mode == "by_precision":
                    counts["by_stack"].setdefault(kind, [0, 0, 0])[side] += 1
    return {mode: {g: {"runs": sum(c), "faster_than_p10": c[0] / sum(c), "inside": c[1] / sum(c),
                       "slower_than_p90": c[2] / sum(c)} for g, c in sorted(by.items())}
            for mode, by in counts.items()}


def ablation(runs: list[Run], terms: dict, progress=None) -> list[dict]:
    """Leave-one-source-out with each physics term of `terms` (a name -> on/off switch table) flipped in turn,
    the others as they are: what each term is worth across sources."""
    out = []
    for name in [None, *terms]:
        if name is not None:
            terms[name] = not terms[name]
        try:
            summary = summarize(cross_validate(runs))
        finally:
            if name is not None:
                terms[name] = not terms[name]
        biased = sorted(f for f, s in summary["sources"].items() if s["runs"] and abs(s["median_error"]) > 0.10)
        out.append({"term": name or "(defaults)", "flipped_to": None if name is None else not terms[name],
                    "pooled_median_abs_error": summary["pooled"].get("median_abs_error"),
                    "fp8_median_abs_error": summary["fp8"].get("median_abs_error"),
                    "memory_median_abs_error": summary["memory"]["median_abs_error"],
                    "ran_predicted_oom": len(summary["ran_predicted_oom"]),
                    "sources_beyond_10_percent": biased})
        if progress:
            progress(len(out), len(terms) + 1, name or "(defaults)")
    return out
