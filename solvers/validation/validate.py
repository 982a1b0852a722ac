"""`solve validate` (predicted vs measured runs and memory) and `solve calibrate` (fit efficiencies).

    solve validate [--runs FILE.csv] [--in-sample] [--few-shot] [--calibration CAL.json] [--rows] [--json]
                   [--write-intervals] [--memory-only] [--as-1f1b]
    solve calibrate --runs MINE.csv --output CAL.json    (three knobs fitted on your own runs)
    solve calibrate [--write]                             (the packaged per-chip efficiencies)

By default `validate` is leave-one-source-out: each source (paper, repository or document) is predicted with
parameters fitted on the other sources only; the reference is also held out by cluster and by stack, which gives
each level of evidence its band, their coverage per stack and per source, and the regret of the model's first
choice inside each sweep group (docs/uncertainty.md). Minimal columns of a runs CSV: docs/validation.md.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import sys
from pathlib import Path

from formulation.errors import InputError
from formulation.evaluate import evaluate
from formulation.inputs.instance import instance_from_dict
from formulation.physics.memory import GIB
from formulation.placement import Placement, even_split

from formulation.inputs.user_calibration import apply_user_calibration, load_user_calibration
from formulation.intervals import INTERVALS_PATH
from formulation.physics.cost import PHYSICS_TERMS
from solvers.outputs.arguments import OneLineParser
from solvers.outputs.files import save_figure_atomic, write_json_atomic
from solvers.validation import crossval, evidence, fewshot, schedule_pairs
from solvers.validation.calibrate import chip_of
from solvers.validation.crossval import spearman
from solvers.validation.crossval import prediction_rows
from solvers.validation.memory_runs import over_capacity_runs, validate_memory_peaks
from solvers.validation.report import (mode_label, print_ablation, print_few_shot, print_few_shot_pairs,
                                       print_memory_peaks, print_predicted_rows, print_rows, print_speedups,
                                       print_summary)
from solvers.validation.runs import DEFAULT_MEMORY, DEFAULT_RUNS, is_test_row, load_runs, resolve_runs_path

GB = 1e9


def validate_runs(path: Path, as_1f1b: bool = False) -> dict:
    """Per row of a runs file: predicted against measured, the row % 3 split (`as_1f1b`: the schedule terms off)."""
    rows, groups = [], {}
    runs = load_runs(path)
    for run in schedule_pairs.as_1f1b(runs) if as_1f1b else runs:
        item = {"row": run.row, "model": run.name, "gpu_type": run.gpu_type, "predicted_iter_s": None,
                "measured_iter_s": run.measured_iter_s, "measured_how": run.measured_how, "relative_error": None,
                "predicted_peak_memory_gb": None, "predicted_oom": None, "measured_oom": run.measured_oom,
                "measured_peak_memory_gb": run.measured_peak_memory_gb, "skipped_reason": run.skipped_reason,
                "split": "test" if is_test_row(run.row) else "fit"}
        if run.skipped_reason is None:
            est = evaluate(run.instance, run.placement, check=False)
            capacity = min(m.memory.capacity_gib for m in est.stages)
            item.update(predicted_iter_s=est.iteration_time_s,
                        relative_error=est.iteration_time_s / run.measured_iter_s - 1,
                        predicted_peak_memory_gb=est.peak_memory_gib * GIB / GB,
                        predicted_oom=est.peak_memory_gib > capacity,
                        calibrated=chip_of(run.gpu_type) is not None)
            if item["skipped_reason"] is None:
                groups.setdefault(run.group, []).append(item)
        rows.append(item)
    return {"rows": rows, "summary": _summary(rows, groups)}


def _summary(rows: list[dict], groups: dict) -> dict:
    def stats(items):
        errs = [abs(r["relative_error"]) for r in items]
        if not errs:
            return {"count": 0}
        worst = max(items, key=lambda r: abs(r["relative_error"]))
        return {"count": len(errs), "median_abs_error": statistics.median(errs), "max_abs_error": max(errs),
                "worst_row": worst["row"]}
    scored = [r for r in rows if r["skipped_reason"] is None]
    calibrated = [r for r in scored if r.get("calibrated")]
    confusion = {"predicted_oom_and_oom": 0, "predicted_oom_but_ran": 0, "predicted_fit_but_oom": 0,
                 "predicted_fit_and_ran": 0}
    for r in scored:
        key = ("predicted_oom" if r["predicted_oom"] else "predicted_fit") + (
            "_and_oom" if r["measured_oom"] and r["predicted_oom"] else "_but_oom" if r["measured_oom"]
            else "_but_ran" if r["predicted_oom"] else "_and_ran")
        confusion[key] += 1
    group_rank = [{"group": list(k), "runs": len(v),
                   "spearman": spearman([r["predicted_iter_s"] for r in v], [r["measured_iter_s"] for r in v])}
                  for k, v in groups.items() if len(v) >= 2]
    mem = [abs(r["predicted_peak_memory_gb"] / r["measured_peak_memory_gb"] - 1) for r in scored
           if r["measured_peak_memory_gb"]]
    return {
        "held_out": stats([r for r in calibrated if r["split"] == "test"]),
        "calibration_split": stats([r for r in calibrated if r["split"] == "fit"]),
        "all_scored": stats(scored),
        "uncalibrated_gpu_types": sorted({r["gpu_type"] for r in scored if not r.get("calibrated")}),
        "skipped": sum(1 for r in rows if r["skipped_reason"]),
        "spearman_all": spearman([r["predicted_iter_s"] for r in scored], [r["measured_iter_s"] for r in scored]),
        "groups": group_rank,
        "memory_abs_error_median": statistics.median(mem) if mem else None,
        "oom_confusion": confusion,
        "split": "held out: rows with row % 3 == 0; fitted on the others",
    }


def validate_memory(path: Path = DEFAULT_MEMORY) -> list[dict]:
    """Korthikanti et al. Fig. 1 components against the memory model, first pipeline stage.

    The published weights+grads+optimizer figures equal 18 bytes per parameter (2 + 4 + 12, our bf16 /
    fp32-main-grad accounting); the runs predate flash attention and carry dropout (GPT-style).
    """
    out = []
    with open(path, newline="", encoding="utf-8") as handle:
        for i, r in enumerate(csv.DictReader(handle)):
            layers, hidden, heads = int(r["layers"]), int(r["hidden"]), int(r["heads"])
            tp, pp, dp, vp, mbs = (int(r[k]) for k in ("tp", "pp", "dp", "vp", "mbs"))
            m = 8 * pp  # enough micro-batches that every stage holds its full 1F1B/interleaved window
            data = {
                "name": f"memory row {i}",
                "model": {"name": r["model"], "num_hidden_layers": layers, "hidden_size": hidden,
                          "intermediate_size": 4 * hidden, "num_attention_heads": heads, "vocab_size": int(r["vocab"]),
                          "hidden_act": "gelu", "dropout": True},
                "training": {"global_batch_size": m * mbs * dp, "seq_length": int(r["seq"]), "precision": "bf16",
                             "flash_attention": False, "sequence_parallel": r["sequence_parallel"] == "true",
                             "recompute": [r["recompute"]], "zero_stage": [0]},
                "cluster": {"gpu_types": {"a100-sxm-80gb": {}},
                            "nodes": [{"count": math.ceil(tp * pp * dp / 8), "gpu_type": "a100-sxm-80gb", "gpus": 8}],
                            "network": {"intra_node_gb_per_s": 300, "inter_node_gb_per_s": 25}},
            }
            inst = instance_from_dict(data, str(path))
            if layers % (pp * vp):
                split = even_split(layers, pp)
            else:
                split = tuple([layers // pp] * pp)
            p = Placement(tp=tp, pp=pp, cp=1, dp=dp, vpp=vp, micro_batch_size=mbs, recompute=r["recompute"],
                          zero_stage=0, layers_per_stage=split, gpus=tuple(range(tp * pp * dp)))
            stage = evaluate(inst, p).stages[0].memory
            predicted = (stage.weights_gib + stage.gradients_gib + stage.optimizer_gib
                         if r["component"].startswith("weights") else stage.activations_gib)
            published = float(r["gib"])
            out.append({"row": i, "model": r["model"], "component": r["component"], "recompute": r["recompute"],
                        "published_gib": published, "predicted_gib": predicted,
                        "relative_error": predicted / published - 1})
    return out


def _plot(result: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 6))
    for split, marker in (("fit", "o"), ("test", "s")):
        pts = [(r["measured_iter_s"], r["predicted_iter_s"]) for r in result["rows"]
               if not r["skipped_reason"] and r["split"] == split]
        if pts:
            ax.scatter(*zip(*pts), marker=marker, label=f"{'held out' if split == 'test' else 'calibration'} "
                                                        f"({len(pts)})", alpha=0.75)
    lo = min(min(r["measured_iter_s"], r["predicted_iter_s"]) for r in result["rows"] if not r["skipped_reason"])
    hi = max(max(r["measured_iter_s"], r["predicted_iter_s"]) for r in result["rows"] if not r["skipped_reason"])
    xs = [lo * 0.8, hi * 1.25]
    ax.plot(xs, xs, "k-", lw=1, label="exact")
    for f in (0.9, 1.1):
        ax.plot(xs, [x * f for x in xs], "k:", lw=0.8)
    ax.set(xscale="log", yscale="log", xlabel="measured iteration time [s]", ylabel="predicted iteration time [s]",
           title="Predicted vs measured (dotted: +-10 %)")
    ax.legend()
    fig.tight_layout()
    fig.set_dpi(120)
    try:
        save_figure_atomic(fig, path)
    finally:
        plt.close(fig)


def main(command: str, argv: list[str]) -> int:
    parser = OneLineParser(prog=f"solve {command}", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=Path, default=None, help="measured runs CSV (published_runs format; "
                        "default: the packaged reference runs, torchtitan's included)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    if command == "validate":
        parser.add_argument("--in-sample", action="store_true", help="the stored calibration (fitted on every "
                            "source) instead of leave-one-source-out")
        parser.add_argument("--rows", action="store_true", help="also the per-row table and the older row %% 3 split")
        parser.add_argument("--few-shot", action="store_true", help="per source and GPU type with >= 4 runs: "
                            "calibrate on 2 of its runs (solve calibrate --output), predict the rest; the quartile "
                            "pair, and the median over every pair")
        parser.add_argument("--calibration", type=Path, help="a user calibration (solve calibrate --output) to apply")
        parser.add_argument("--ablation", action="store_true", help="also leave-one-source-out with each physics "
                            "term flipped in turn (one full cross-validation per term: several minutes)")
        parser.add_argument("--write-intervals", action="store_true", help="store the bands of every level of "
                            "evidence (held out by source, cluster and stack) and what each stack was measured on, "
                            "as the prediction interval every estimate carries (package data; reference runs only)")
        parser.add_argument("--as-1f1b", action="store_true", help="score every run as 1F1B without the MoE "
                            "all-to-all overlap: the schedule terms off (the figures before them, docs/schedules.md)")
        parser.add_argument("--memory", type=Path, default=DEFAULT_MEMORY, help="memory components CSV")
        parser.add_argument("--memory-only", action="store_true", help="only the measured peak memory per source "
                            "and counter (published_memory_peaks.csv; seconds, no cross-validation of times)")
        parser.add_argument("--plot", metavar="FILE.png", help="write predicted-vs-measured plot (with --rows)")
    else:
        parser.add_argument("--output", type=Path, metavar="CAL.json", help="fit the three user knobs (compute "
                            "scale, network scale, per-iteration overhead) on --runs and write them here")
        parser.add_argument("--write", action="store_true", help="refit the per-chip efficiencies on the "
                            "reference runs and rewrite formulation/data/calibration.json")
    args = parser.parse_args(argv)
    args.runs = None if args.runs is None else resolve_runs_path(args.runs)
    for flag, target in (("--output", getattr(args, "output", None)), ("--plot", getattr(args, "plot", None))):
        if target is not None and Path(target).is_dir():  # before minutes of work, not after
            print(f"error: {flag}: {target} is a directory; expected a file path", file=sys.stderr)
            return 2
    try:
        if command == "calibrate":
            return _calibrate(args)
        return _validate(args)
    except InputError as exc:  # names its file
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # an output that cannot be written
        print(f"error: {exc.filename2 or exc.filename}: cannot write: {exc.strerror or exc}", file=sys.stderr)
        return 2


def users_runs(path: Path) -> list:
    """A runs file given with --runs: its rows that cannot be scored are named on stderr, with the reason; a file
    with none that can is an `InputError` naming the first few."""
    runs = load_runs(path)
    skipped = [r for r in runs if r.skipped_reason is not None and not r.measured_oom]
    usable = len(runs) - len(skipped)
    if not usable:
        reasons = "; ".join(f"row {r.row}: {r.skipped_reason}" for r in skipped[:3])
        raise InputError(str(path), "<rows>", f"no run can be scored ({len(runs)} rows" +
                         (f": {reasons}{'; ...' if len(skipped) > 3 else ''})" if runs else ")"))
    for r in skipped[:10]:
        print(f"warning: {path}: row {r.row} not scored: {r.skipped_reason}", file=sys.stderr)
    if len(skipped) > 10:
        print(f"warning: {path}: {len(skipped) - 10} more rows not scored", file=sys.stderr)
    return runs


def _validate(args) -> int:
    from rich.console import Console

    console = Console(width=max(Console().width, 120))
    if args.memory_only:
        return _memory_only(args, console)
    runs = _runs_of(args)
    adjust, cal = None, None
    if args.calibration:
        cal = load_user_calibration(args.calibration)
        adjust = lambda instance: apply_user_calibration(instance, cal)  # noqa: E731
    # Your own runs file was never part of any fit: the stored calibration predicts it out of sample.
    in_sample = args.in_sample or args.runs is not None
    if in_sample and args.write_intervals:
        raise InputError(None, "--write-intervals", "the intervals are derived from the reference runs held out "
                                                    "(no --runs, no --in-sample)")
    mode = mode_label(args.runs is not None, args.in_sample, cal, args.calibration, args.as_1f1b)
    progress = None if args.json else (lambda k, n, fold: print(f"  fold {k}/{n}: {fold}", file=sys.stderr))
    # the reference held out by source, by cluster and by stack: each level of evidence's band and its coverage
    by_holdout = None if in_sample else evidence.holdouts(runs, progress, adjust)
    predictions = by_holdout["source"] if by_holdout else crossval.cross_validate(runs, in_sample=True,
                                                                                   progress=progress, adjust=adjust)
    summary, bands = _held_out_summary(predictions, by_holdout)
    few = fewshot.few_shot_table(predictions) if args.few_shot else []
    few_pairs = fewshot.every_pair_table([p for p in predictions if p.timed]) if args.few_shot else []
    if args.write_intervals:
        path = write_intervals(by_holdout, summary, mode, runs)
        print(f"prediction interval written to {path}", file=sys.stderr)  # stdout may carry --json
    ablated = crossval.ablation(runs, PHYSICS_TERMS, progress) if args.ablation else []
    rows = validate_runs(args.runs or DEFAULT_RUNS, args.as_1f1b) if args.rows else None
    memory = validate_memory(args.memory) if args.rows and args.memory and args.memory.is_file() else []
    # measured peaks (published_memory_peaks.csv): nothing of the memory model is fitted on them, so each source's
    # figure is held out; and the runs that ran but are put over their GPU's memory (must be none)
    peaks = {**validate_memory_peaks(), "ran_over_capacity": over_capacity_runs()} if args.runs is None else None
    if args.json:
        print(json.dumps({"mode": mode, "summary": summary, "predictions": prediction_rows(predictions, bands),
                          "few_shot": few, "few_shot_every_pair": few_pairs, "ablation": ablated, "rows": rows,
                          "memory": memory, "memory_peaks": peaks},
                         indent=2, default=str))
        return 0
    if rows:
        print_rows(rows, memory)
        if args.plot:
            _plot(rows, args.plot)
    print_summary(summary, mode, console)
    if peaks:
        print_memory_peaks(peaks, console)
    if any(not p.run.fitted for p in predictions):
        print_predicted_rows(predictions, console)
    print_speedups(summary["paired_speedups"]["pairs"], console)
    if few:
        print_few_shot(few, console)
        print_few_shot_pairs(few_pairs, console)
    if ablated:
        print_ablation(ablated, console)
    return 0


def _memory_only(args, console) -> int:
    """`validate --memory-only`: the measured peaks, held out by source, and the runs put over capacity."""
    peaks = {**validate_memory_peaks(), "ran_over_capacity": over_capacity_runs()}
    if args.json:
        print(json.dumps({"memory_peaks": peaks}, indent=2, default=str))
    else:
        print_memory_peaks(peaks, console)
    return 0


def _runs_of(args) -> list:
    """The runs `solve validate` scores: the reference or --runs, with --as-1f1b the schedule terms off."""
    runs = crossval.reference_runs() if args.runs is None else users_runs(args.runs)
    if not args.as_1f1b:
        return runs
    if args.write_intervals:
        raise InputError(None, "--write-intervals", "the intervals are the model's own: not with --as-1f1b")
    return schedule_pairs.as_1f1b(runs)


def _held_out_summary(predictions, by_holdout) -> tuple[dict, list]:
    """The accuracy summary with regret, interval coverage (per evidence level where held out) and the paired
    speed-ups of the schedule terms, and the band of every prediction."""
    summary = crossval.summarize(predictions)
    pairs = schedule_pairs.paired_speedups(predictions)
    summary["paired_speedups"] = {"by_source": schedule_pairs.speedup_summary(pairs), "pairs": pairs}
    bands = evidence.prediction_bands(predictions, held_out=by_holdout is not None)
    summary["regret"] = evidence.regret(predictions)
    summary["coverage_by_level"] = (evidence.level_coverage(by_holdout) if by_holdout else
                                    {"stored": evidence.band_coverage(predictions, bands)})
    if by_holdout:
        summary["stack_holdout_median_error"] = evidence.stack_spread(by_holdout["stack"])
    return summary, bands


def _calibrate(args) -> int:
    if args.output is None:  # the packaged efficiencies, refitted on the reference runs
        from solvers.validation.calibrate import fit, write_calibration
        fitted = fit(load_runs(args.runs) if args.runs else crossval.reference_runs())
        for key, values in fitted.items():
            print(f"{key}: " + ", ".join(f"{k} {v:.4g}" for k, v in values.items() if k != "fitted_on_rows")
                  + f" (on {len(values['fitted_on_rows'])} runs)")
        if args.write:
            write_calibration(fitted)
            print("written to formulation/data/calibration.json")
        return 0
    if args.runs is None:
        raise InputError(None, "--runs", "--output fits your own runs: give them with --runs FILE.csv")
    runs = [r for r in users_runs(args.runs) if r.skipped_reason is None]
    if len(runs) < 2:
        raise InputError(str(args.runs), "<rows>", f"at least 2 runs with a measured time are needed, got {len(runs)}")
    cases = [(r.instance, r.placement, r.measured_iter_s) for r in runs]
    cal, errors = fewshot.leave_one_out(cases, tuple(r.name for r in runs))
    write_json_atomic(args.output, cal.to_dict())
    print(f"fitted on {len(runs)} runs of {args.runs}: compute x{cal.compute_scale:.3f}, network "
          f"x{cal.network_scale:.3f}, +{cal.iteration_overhead_s:.3f} s per iteration")
    for r, e in zip(runs, errors):
        print(f"  leave-one-out: row {r.row} ({r.name}) predicted {100 * e:+.1f} %")
    if cal.leave_one_out_error is not None:
        print(f"median |error| predicting each run from the others: {100 * cal.leave_one_out_error:.1f} %")
    warning = fewshot.disagreement_warning(cal)
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    print(f"written to {args.output}; apply with --calibration {args.output}")
    return 0


def write_intervals(by_holdout: dict, summary: dict, mode: str, runs: list) -> Path:
    """Store the bands of every level of evidence (formulation/intervals.py): p10/p90 of log(predicted / measured)
    held out by source, pooled and per precision group (profiled); the symmetric band held out by cluster
    (NEW_SETUP) and the slow-leaning one held out by stack (UNPROFILED); the band after calibrating on 2 runs; what each stack was measured on."""
    predictions = by_holdout["source"]
    residuals = crossval.log_residuals(predictions)
    groups: dict[str, list[float]] = {}
    for p in predictions:
        if p.timed:
            groups.setdefault(crossval.residual_group(p), []).append(crossval.log_residual(p))
    quantiles = evidence.quantiles
    write_json_atomic(INTERVALS_PATH, {
        "_comment": f"Written by `solve validate --write-intervals` ({mode}, also held out by cluster and by stack, "
                    f"{len(residuals)} runs): quantiles of log(predicted / measured iteration time) per level of "
                    "evidence, and what each stack was measured on; formulation/intervals.py turns them into p10-p90 "
                    "(docs/uncertainty.md).",
        **quantiles(residuals),
        "by_precision": {g: quantiles(r) for g, r in sorted(groups.items()) if len(r) >= 2},
        "levels": evidence.level_quantiles(by_holdout),
        "after_two_runs": evidence.after_two_runs(by_holdout["stack"]),
        "evidence": evidence.evidence_profile(runs),
        # held out by source: how often each stack kind's runs measured slower than their band's slow end
        "slower_than_p90_by_stack": {kind: round(c["slower_than_p90"], 3) for kind, c in
                                     summary.get("interval_coverage", {}).get("by_stack", {}).items()},
        "pooled_median_abs_error": summary["pooled"].get("median_abs_error")})
    return INTERVALS_PATH
