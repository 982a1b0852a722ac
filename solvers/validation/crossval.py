"""Leave-one-source-out cross-validation: for each source (the paper, repository or document rows come from),
refit whatever is fitted on the other sources only, then predict that source.

Rows of one source share hardware, software, flags and authors, so a random split measures interpolation;
predicting a source that never took part in the fit is what a new user's cluster looks like. What is fitted
is what `calibrate` fits (solvers/validation/joint_fit.py): the per-chip, per-stack GEMM efficiency (C1) and
the per-iteration overhead every run shares (C14), by least squares of the log errors on the fold's own rows.
Nothing a fold uses has seen the held-out source. A chip and stack with no rows outside the held-out source
falls back to the chip's Megatron fit of the fold, else the catalog's uncalibrated default efficiency (with the
fold's overhead): what a new user gets.

The same folds held out by cluster (a source's runs on one chip, with its stack's other runs on that chip) and
by stack (every run of one software stack) measure what a new GPU or an unprofiled stack costs in accuracy
(HOLDOUTS; the bands built from them: solvers/validation/evidence.py, formulation/intervals.py).
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
from solvers.validation.calibrate import calibration_key, chip_of, votes_on_overhead, with_parameters
from solvers.validation.joint_fit import TimeTables, joint_fit
from solvers.validation.runs import Run, load_runs

# Source families: one family per document (or set of documents) written by one team for one stack and era.
FAMILIES = (("Megatron-Bridge", "Megatron-Bridge performance summary"), ("SC21", "Megatron-LM SC21 paper"), ("Korthikanti", "Korthikanti et al. 2022"),
            ("Sept 2020", "Megatron-LM README 2020"), ("Training Speed", "Megatron-LM README 2024"),
            ("strong scaling", "Megatron-LM README 2024"), ("examples/llama", "Megatron-LM Llama examples"),
            ("performance_summary", "NeMo performance summary"),
            ("performance_long_sequence", "NeMo long-sequence performance"),
            ("dgxc-benchmarking", "NVIDIA DGX Cloud benchmarking"), ("llm-foundry", "MosaicML llm-foundry"),
            ("trainy-whitefiber", "Trainy H200 (torchtitan)"), ("torchtitan", "torchtitan benchmarks"),
            ("fms-fsdp", "IBM fms-fsdp"), ("Zero Bubble Pipeline Parallelism", "Qi et al. 2024 (zero bubble)"),
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
# Megatron-Bridge's published Blackwell (B200, GB200, GB300) rows, in a file of our own
MEGATRON_BRIDGE_ROW_OFFSET = 1400


def source_family(source: str) -> str:
    return next((name for key, name in FAMILIES if key in source), source.split(" (")[0].strip())


def reference_runs() -> list[Run]:
    """Every packaged reference run: the main file, torchtitan's benchmarks (rows offset by 1000), their float8
    rows (offset by 1100), the community benchmark files of torchtitan's repository (offset by 1200), IBM's
    fms-fsdp benchmarks (offset by 1300) and Megatron-Bridge's Blackwell rows (offset by 1400)."""
    runs = load_runs(REFERENCE_DIR / "published_runs.csv")
    for name, offset in (("published_runs_torchtitan.csv", TORCHTITAN_ROW_OFFSET),
                         ("published_runs_torchtitan_float8.csv", TORCHTITAN_FLOAT8_ROW_OFFSET),
                         ("published_runs_torchtitan_community.csv", TORCHTITAN_COMMUNITY_ROW_OFFSET),
                         ("published_runs_fms_fsdp.csv", FMS_FSDP_ROW_OFFSET),
                         ("published_runs_megatron_bridge.csv", MEGATRON_BRIDGE_ROW_OFFSET)):
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
    interval_s: tuple | None = None  # the p10-p90 the estimate carries (formulation/intervals.py)

    @property
    def timed(self) -> bool:
        return self.run.measured_iter_s is not None

    @property
    def error(self) -> float:
        return self.iteration_time_s / self.run.measured_iter_s - 1


# How a fold is held out (`cross_validate(by=...)`): `source`, every run of one source family; `cluster`, one source's
# runs on one GPU type, with nothing fitted on that source nor on that stack's runs on that chip (a stack the model
# knows on GPUs, or at a scale, it has not seen); `stack`, every run of one software stack, nothing fitted on it
# (a stack the model has no measured runs of: formulation/intervals.py).
HOLDOUTS = ("source", "cluster", "stack")


def run_stack(run: Run) -> str:
    """The stack a run names (an unmodelled name included: it is planned as megatron)."""
    job = run.instance.training
    return job.unmodelled_stack or job.software_stack


def fold_of(by: str, run: Run) -> tuple:
    family = source_family(run.source)
    if by == "stack":
        return (run_stack(run),)
    if by == "cluster":
        return family, run_stack(run), chip_of(run.gpu_type) or run.gpu_type
    return (family,)


def outside_fold(by: str, fold: tuple, run: Run) -> bool:
    """Whether `run` may take part in the fit of the fold that holds out `fold`."""
    mine = fold_of(by, run)
    if by == "cluster":
        return mine[0] != fold[0] and mine[1:] != fold[1:]
    return mine != fold


def fold_efficiency(fit, run: Run, default: float, by: str = "source") -> float:
    """The efficiency a fold gives a run, as the planner would without its rows: its chip and stack's fit, else
    the chip's Megatron fit (a stack without a fit of its own), else the catalog's uncalibrated default (a chip
    without a fit). Held out by stack, the Megatron stack itself takes the geometric mean of the chip's other
    stacks' fits instead of the default: what another stack's efficiency says of it."""
    key = calibration_key(run)
    chip = key.partition("+")[0]
    if key in fit.efficiency or chip in fit.efficiency:
        return fit.efficiency.get(key, fit.efficiency.get(chip))
    others = [e for k, e in fit.efficiency.items() if k.partition("+")[0] == chip] if by == "stack" else []
    return math.exp(statistics.fmean(math.log(e) for e in others)) if others else default


def cross_validate(runs: list[Run], in_sample: bool = False, progress=None, adjust=None, by: str = "source",
                   tables: TimeTables | None = None) -> list[Prediction]:
    """Predict every scored run with parameters fitted outside its fold (`by`: HOLDOUTS; `in_sample`: the stored
    calibration, fitted on all of them), and the memory of every run that measured out-of-memory.
    `adjust(instance)` is applied last (a user's calibration knobs); `tables` may be shared between calls."""
    ooms = measured_oom(runs)
    runs = scored(runs)
    fitted = [r for r in runs if r.fitted and chip_of(r.gpu_type)]
    tables = None if in_sample else tables or TimeTables(fitted, with_parameters)
    default_efficiency = gpu_catalog()["__default__"]["matmul_efficiency"]
    folds = sorted({fold_of(by, r) for r in runs + ooms}, key=str)
    out = []
    for k, fold in enumerate(folds):
        held = [r for r in runs + ooms if fold_of(by, r) == fold]
        fit = None if in_sample else joint_fit([r for r in fitted if outside_fold(by, fold, r)], calibration_key,
                                               tables, votes_on_overhead)
        for run in held:
            # the fold's overhead for every run, those of a chip without a fit (B200) included
            params = None if fit is None else {"iteration_overhead_s": fit.overhead_s}
            if params is not None and chip_of(run.gpu_type):
                # no rows of this chip and stack outside the fold: never the stored fit (which saw this fold)
                params["matmul_efficiency"] = fold_efficiency(fit, run, default_efficiency, by)
            instance = with_parameters(run, params) if params else run.instance
            instance = adjust(instance) if adjust else instance
            est = evaluate(instance, run.placement, check=False)
            out.append(Prediction(run, instance, source_family(run.source), est.iteration_time_s,
                                  est.peak_memory_gib, min(s.memory.capacity_gib for s in est.stages),
                                  min(s.memory.limit_gib for s in est.stages), est.iteration_time_interval_s))
        if progress:
            progress(k + 1, len(folds), " ".join(fold))
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


def prediction_rows(predictions: list[Prediction], bands: dict | None = None) -> list[dict]:
    """Per scored run: configuration, measured and predicted time, error, memory, unmodelled features, and the
    p10-p90 of its measured time where `bands` (row -> (p10, p90) in seconds) has one."""
    bands = bands or {}
    out = []
    for p in predictions:
        if not p.timed:
            continue
        pl = p.run.placement
        out.append({"row": p.run.row, "family": p.family, "model": p.run.name, "gpu_type": p.run.gpu_type,
                    "config": f"{pl.sizes()} vpp={pl.vpp} mbs={pl.micro_batch_size} {pl.recompute}{pl.schedule_text}",
                    "precision": p.run.instance.training.precision, "measured_s": p.run.measured_iter_s,
                    "measured_how": p.run.measured_how, "predicted_s": p.iteration_time_s, "error": p.error,
                    "peak_memory_gib": p.peak_memory_gib, "capacity_gib": p.capacity_gib,
                    "flags": list(p.run.flags), "predicted_p10_s": bands.get(p.run.row, (None, None))[0],
                    "predicted_p90_s": bands.get(p.run.row, (None, None))[1]})
    return out


def log_residual(p: Prediction) -> float:
    return math.log(p.iteration_time_s / p.run.measured_iter_s)


def log_residuals(predictions: list[Prediction]) -> list[float]:
    return [log_residual(p) for p in predictions if p.timed]


def residual_group(p: Prediction) -> str:
    """The interval group of a run (formulation/intervals.py): FP8 GEMMs or 16-bit."""
    cluster = p.instance.cluster
    return interval_group(p.instance.training, cluster.gpu_types[cluster.nodes[0].gpu_type])


def p10_p90(residuals: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(residuals, n=10, method="inclusive")
    return q[0], q[-1]


def other_units_bands(timed: list[tuple], band_of, min_group: float | None = None) -> dict:
    """`timed`: (unit, group, log residual, key) per run. Per key: band_of(the other units' residuals of its group),
    all of the other units' residuals where the group has fewer than `min_group` (MIN_GROUP_RUNS); no band for
    a run whose unit is the only one."""
    min_group = MIN_GROUP_RUNS if min_group is None else min_group
    out = {}
    for unit in sorted({u for u, *_ in timed}, key=str):
        others = [(g, r) for u, g, r, _ in timed if u != unit]
        for u, group, _, key in timed:
            if u != unit:
                continue
            same = [r for g, r in others if g == group]
            pool = same if len(same) >= min_group else [r for _, r in others]
            if len(pool) >= 2:
                out[key] = band_of(pool)
    return out


def interval_coverage(predictions: list[Prediction]) -> dict:
    """How the stored kind of interval fares on sources it was not derived from: for each source, the p10-p90 of
    the other sources' log residuals of the run's group (pooled where the group has fewer than MIN_GROUP_RUNS);
    per group, the share of runs measured faster than the band (below), inside it, and slower (above): 10%,
    80%, 10% if the band is right. `pooled` is the same with one band for all runs, for comparison; `by_stack`
    scores the per-precision bands again, counted by stack kind (formulation/intervals.py: the bands are shared
    by the stacks, their tails are not)."""
    timed = [(p.family, residual_group(p), log_residual(p), k) for k, p in enumerate(predictions) if p.timed]
    kinds = {k: stack_kind(p.instance.training) for k, p in enumerate(predictions) if p.timed}
    counts: dict[str, dict[str, list[int]]] = {"by_precision": {}, POOLED: {}, "by_stack": {}}
    for mode in ("by_precision", POOLED):
        bands = other_units_bands(timed, p10_p90, None if mode == "by_precision" else math.inf)
        for _, group, r, k in timed:
            if k not in bands:  # no band without the source (a one-source file)
                continue
            lo, hi = bands[k]
            side = 0 if r > hi else 2 if r < lo else 1  # r > p90: predicted too slow, measured faster
            counts[mode].setdefault(group, [0, 0, 0])[side] += 1
            if mode == "by_precision":
                counts["by_stack"].setdefault(kinds[k], [0, 0, 0])[side] += 1
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
