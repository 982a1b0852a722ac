"""Printed tables of `solve validate`: the cross-validated accuracy per source, pooled, per sweep group, memory
and out-of-memory calls, the intervals' coverage per level of evidence, the regret inside sweeps, and the few-shot
table."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from formulation.physics.memory import GIB
from solvers.outputs.plan_notes import calibration_text
from solvers.outputs.report import folding_table


def _pct(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "-"
    return f"{100 * value:+.1f} %" if signed else f"{100 * value:.1f} %"


def _table_of(title: str, columns: list[str]) -> Table:
    return folding_table(title, columns, left=("source", "group", "model", "term"))


def mode_label(runs_given: bool, in_sample: bool, calibration=None, calibration_path=None,
               as_1f1b: bool = False) -> str:
    """How `solve validate` predicted, as its table's title and its JSON's `mode` say it: the stored calibration
    or leave-one-source-out folds, and a user calibration applied on top of either (named, with its knobs);
    `as_1f1b`: every run scored with the schedule terms off."""
    base = ("stored calibration, fitted on the reference runs" if runs_given else
            "stored calibration (in-sample)" if in_sample else "leave-one-source-out")
    base += "; every run scored as 1F1B without the all-to-all overlap (--as-1f1b)" if as_1f1b else ""
    if calibration is None:
        return base
    return f"{base}, then your calibration {calibration_path or ''} ({calibration_text(calibration)})".replace("  ", " ")


def print_summary(summary: dict, mode: str, console: Console) -> None:
    """`mode` says how the parameters were fitted (leave-one-source-out or in-sample)."""
    table = _table_of(f"iteration time, {mode}: predicted / measured - 1",
                   ["source", "runs", "median signed", "median |error|", "worst row", "worst error"])
    for source, st in summary["sources"].items():
        if st["runs"]:
            table.add_row(source, str(st["runs"]), _pct(st["median_error"], True), _pct(st["median_abs_error"]),
                          f"{st['worst_row']} ({st['worst_model']})", _pct(st["worst_error"], True))
    pooled = summary["pooled"]
    if pooled["runs"]:
        table.add_row("pooled", str(pooled["runs"]), _pct(pooled["median_error"], True),
                      _pct(pooled["median_abs_error"]), str(pooled["worst_row"]), _pct(pooled["worst_error"], True),
                      style="bold")
    console.print(table)
    clean = summary.get("unflagged", {"runs": 0})
    if clean["runs"] < pooled["runs"] and clean["runs"]:
        console.print(f"runs using no feature the model lacks: {clean['runs']}, median |error| "
                      f"{_pct(clean['median_abs_error'])}, median signed {_pct(clean['median_error'], True)}")
    if summary["fp8"]["runs"]:
        fp8 = summary["fp8"]
        console.print(f"FP8 runs: {fp8['runs']}, median |error| {_pct(fp8['median_abs_error'])}, median signed "
                      f"{_pct(fp8['median_error'], True)}")
    if not summary["sweep_groups"]:
        console.print("no sweep group (same model, GPU, GPU count, sequence and batch) has 4 runs or more")
    if summary["sweep_groups"]:
        groups = _table_of("rank correlation inside measured sweeps (same model, GPU, GPU count, sequence, batch)",
                        ["group", "runs", "Spearman"])
        for g in summary["sweep_groups"]:
            groups.add_row(" ".join(str(x) for x in g["group"]), str(g["runs"]),
                           "-" if g["spearman"] is None else f"{g['spearman']:.2f}")
        console.print(groups)
    coverage = summary.get("interval_coverage", {}).get("by_precision")
    if coverage and len(summary["sources"]) > 1:
        console.print("p10-p90 prediction interval, each source's runs against the band of the other sources' "
                      "residuals of their precision (10 / 80 / 10 % if right): " + "; ".join(
                          f"{g} ({c['runs']} runs) {100 * c['faster_than_p10']:.0f} % faster, {100 * c['inside']:.0f} % "
                          f"inside, {100 * c['slower_than_p90']:.0f} % slower" for g, c in coverage.items()))
        by_stack = summary["interval_coverage"].get("by_stack", {})
        console.print("the same bands by stack kind: " + "; ".join(
            f"{kind} ({c['runs']} runs) {100 * c['faster_than_p10']:.0f} % faster, {100 * c['inside']:.0f} % inside, "
            f"{100 * c['slower_than_p90']:.0f} % slower" for kind, c in by_stack.items()))
    memory = summary["memory"]
    if memory["rows"]:
        console.print(f"peak memory where measured: {len(memory['rows'])} runs, median |error| "
                      f"{_pct(memory['median_abs_error'])}, median signed {_pct(memory['median_error'], True)} "
                      f"(GiB; measured figures converted from GB)")
    if summary.get("ran_predicted_oom") is not None:
        called = summary["ran_predicted_oom"]
        console.print(f"runs that ran but are predicted out of memory at full capacity: {len(called)} of "
                      f"{summary['pooled'].get('runs', 0)}" + (f" (rows {', '.join(map(str, called))})" if called else ""))
    for oom in summary["measured_oom"]:
        verdict = "predicted to FIT (a miss)" if oom["predicted_to_fit"] else "predicted out of memory (right)"
        console.print(f"row {oom['row']} ({oom['family']}) measured out of memory: {oom['predicted_gib']:.1f} GiB "
                      f"predicted against {oom['capacity_gib']:.1f} GiB, {verdict}")
    print_coverage(summary, console)
    print_regret(summary, console)


LEVEL_NAMES = {"profiled": "profiled stack (held out by source)",
               "new-setup": "new GPU or cluster (held out by cluster)",
               "unprofiled-stack": "unprofiled stack (held out by stack)", "stored": "the stored interval"}


def _cell(c: dict | None) -> str:
    if not c:
        return "-"
    return (f"{100 * c['inside']:.0f} % ({100 * c['faster_than_p10']:.0f} / {100 * c['slower_than_p90']:.0f}) "
            f"of {c['runs']}")


def print_coverage(summary: dict, console: Console) -> None:
    """The 80% interval of each level of evidence on runs it was not derived from: share inside (faster / slower
    than the band) per stack and per source."""
    levels = summary.get("coverage_by_level")
    if not levels:
        return
    table = _table_of("80 % interval: share of runs inside (faster than p10 / slower than p90), on runs the band "
                      "was not derived from; 80 % (10 / 10) if right", ["group", *(LEVEL_NAMES[k] for k in levels)])
    for kind in ("by_stack", "by_source"):
        keys = sorted({k for c in levels.values() for k in c[kind]})
        for key in keys:
            table.add_row(f"{'stack' if kind == 'by_stack' else 'source'} {key}",
                          *(_cell(c[kind].get(key)) for c in levels.values()))
    if all("all" in c for c in levels.values()):
        table.add_row("all runs", *(_cell(c["all"]) for c in levels.values()), style="bold")
    console.print(table)
    spread = summary.get("stack_holdout_median_error")
    if spread:
        console.print("held out by stack (nothing fitted on it: its chip's Megatron efficiency, for megatron the "
                      "other stacks'), median error per stack: " + ", ".join(f"{s} {_pct(e, True)}" for s, e in spread.items()))


def print_regret(summary: dict, console: Console) -> None:
    """Per sweep group: how much slower the configuration the model ranks first measured than the fastest."""
    regret = summary.get("regret")
    if not regret or not regret["groups"]:
        return
    table = _table_of("regret inside measured sweeps: measured time of the model's first choice / best measured - 1",
                      ["group", "runs", "model's first (row)", "best measured (row)", "regret"])
    for g in regret["groups"]:
        table.add_row(" ".join(str(x) for x in g["group"]), str(g["runs"]), str(g["chosen_row"]), str(g["best_row"]),
                      _pct(g["regret"]))
    console.print(table)
    console.print(f"regret over {len(regret['groups'])} sweep groups: median {_pct(regret['median'])}, worst "
                  f"{_pct(regret['worst'])}")


def print_predicted_rows(predictions: list, console: Console) -> None:
    """Per row: predicted vs measured time and memory, with the features the model does not have."""
    from solvers.validation.crossval import prediction_rows

    table = _table_of("per row: predicted vs measured", ["row", "model", "GPU", "configuration", "measured s",
                                                         "predicted s", "error", "memory GiB", "not modelled"])
    for r in prediction_rows(predictions):
        table.add_row(str(r["row"]), r["model"], r["gpu_type"], f"{r['config']} {r['precision']}",
                      f"{r['measured_s']:.2f}", f"{r['predicted_s']:.2f}", _pct(r["error"], True),
                      f"{r['peak_memory_gib']:.0f} / {r['capacity_gib']:.0f}", "; ".join(r["flags"]) or "-")
    console.print(table)


def print_speedups(pairs: list[dict], console: Console) -> None:
    """Runs of one source that differ only by a schedule term: measured against predicted speed-up (none: no
    table)."""
    if not pairs:
        return
    table = _table_of("paired speed-ups: the same configuration without / with a schedule term (baseline time / "
                      "time)", ["source", "model", "term", "rows", "measured", "predicted", "error"])
    for r in pairs:
        table.add_row(r["family"], r["model"], r["variant"], f"{r['baseline_row']} / {r['row']}",
                      f"{r['measured_speedup']:.3f}", f"{r['predicted_speedup']:.3f}", _pct(r["error"], True))
    console.print(table)


def print_few_shot(rows: list[dict], console: Console) -> None:
    table = _table_of("few-shot: calibrate on 2 runs of a source, predict the rest",
                   ["source", "runs", "calibrated on", "median |error| before", "median |error| after",
                    "Spearman after"])
    for r in rows:
        table.add_row(r["source"], str(r["predicted_runs"]), ", ".join(str(x) for x in r["calibrated_on"]),
                      _pct(r["median_abs_error_before"]), _pct(r["median_abs_error_after"]),
                      "-" if r["spearman_after"] is None else f"{r['spearman_after']:.2f}")
    console.print(table)


def print_few_shot_pairs(rows: list[dict], console: Console) -> None:
    """Every pair of each cluster (fewshot.every_pair_table): the figure the few-shot criterion is judged by."""
    from statistics import median

    table = _table_of("few-shot over every pair of each cluster: median |error| of the other runs",
                      ["cluster", "runs", "pairs", "median over pairs", "quartiles", "pairs above 5 %"])
    for r in rows:
        table.add_row(r["source"], str(r["runs"]), str(r["pairs"]), _pct(r["median_over_pairs"]),
                      f"{_pct(r['quartiles'][0])}-{_pct(r['quartiles'][1])}",
                      f"{100 * r['share_of_pairs_above_5_percent']:.0f} %")
    console.print(table)
    if rows:
        worst = max(rows, key=lambda r: r["median_over_pairs"])
        console.print(f"median over {len(rows)} clusters {_pct(median(r['median_over_pairs'] for r in rows))}; "
                      f"above 5 %: {sum(r['median_over_pairs'] > 0.05 for r in rows)}, above 8 %: "
                      f"{sum(r['median_over_pairs'] > 0.08 for r in rows)}; largest {worst['source']} "
                      f"{_pct(worst['median_over_pairs'])}")


def print_ablation(rows: list[dict], console: Console) -> None:
    table = _table_of("ablation: leave-one-source-out with one physics term flipped",
                   ["term", "flipped to", "pooled |error|", "FP8 |error|", "memory |error|", "ran, called OOM",
                    "sources > 10 %"])
    for r in rows:
        table.add_row(r["term"], "-" if r["flipped_to"] is None else ("on" if r["flipped_to"] else "off"),
                      _pct(r["pooled_median_abs_error"]), _pct(r["fp8_median_abs_error"]),
                      _pct(r["memory_median_abs_error"]), str(r["ran_predicted_oom"]),
                      ", ".join(r["sources_beyond_10_percent"]) or "none")
    console.print(table)


def print_memory_peaks(result: dict, console: Console) -> None:
    """Measured peak memory per source and counter (solvers/validation/memory_runs.py): held out by source."""
    from statistics import median

    table = _table_of("peak memory, each source held out: predicted / measured - 1 (docs/memory.md)",
                      ["source", "counter", "rows", "median signed", "median |error|", "max |error|"])
    groups: dict[tuple[str, str], list[float]] = {}
    for r in result["rows"]:
        groups.setdefault((r["source"], r["counter"]), []).append(r["error"])
    for (source, counter), errors in sorted(groups.items()):
        table.add_row(source, counter, str(len(errors)), _pct(median(errors), True),
                      _pct(median(abs(e) for e in errors)), _pct(max(abs(e) for e in errors)))
    for counter, st in [*result["by_counter"].items(), ("all", result["pooled"])]:
        table.add_row("pooled", counter, str(st["rows"]), _pct(st["median_error"], True), _pct(st["median_abs_error"]),
                      _pct(st["max_abs_error"]), style="bold")
    console.print(table)
    for oom in result.get("measured_oom", []):
        verdict = "predicted to FIT (a miss)" if oom["predicted_to_fit"] else "predicted out of memory (right)"
        console.print(f"memory row {oom['row']} ({oom['source']}) measured out of memory: "
                      f"{oom['predicted_gib']:.1f} GiB predicted against {oom['capacity_gib']:.1f} GiB, {verdict}")
    over = result.get("ran_over_capacity", [])
    console.print(f"measured runs (they ran) put over their GPU's memory: {len(over)}"
                  + (f" (rows {', '.join(str(o['row']) for o in over)})" if over else ""))


def print_rows(result: dict, memory: list[dict]) -> None:
    """`solve validate --rows`: every row predicted by the stored calibration, and the memory figures."""
    console = Console(width=max(Console().width, 150))
    table = Table(title="predicted vs measured iteration time")
    for col in ("row", "model", "GPU", "split", "measured [s]", "how", "predicted [s]", "error", "peak mem [GiB]",
                "OOM?"):
        table.add_column(escape(col), justify="right" if col not in ("model", "how", "GPU") else "left")
    for r in result["rows"]:
        if r["skipped_reason"]:
            continue
        table.add_row(str(r["row"]), r["model"][:30], r["gpu_type"], r["split"], f"{r['measured_iter_s']:.3f}",
                      r["measured_how"], f"{r['predicted_iter_s']:.3f}", f"{100 * r['relative_error']:+.1f} %",
                      f"{r['predicted_peak_memory_gb'] * 1e9 / GIB:.1f}", "yes" if r["predicted_oom"] else "no",
                      style="red" if abs(r["relative_error"]) > 0.25 else None)
    console.print(table)
    skipped = [r for r in result["rows"] if r["skipped_reason"]]
    if skipped:
        reasons = {}
        for r in skipped:
            reasons.setdefault(r["skipped_reason"], []).append(r["row"])
        console.print("[bold]skipped rows[/bold]")
        for reason, ids in reasons.items():
            console.print(f"  rows {ids}: {reason}")
    s = result["summary"]
    for key in ("held_out", "calibration_split", "all_scored"):
        st = s[key]
        if st["count"]:
            console.print(f"{key}: {st['count']} runs, median |error| {100 * st['median_abs_error']:.1f} %, "
                          f"max {100 * st['max_abs_error']:.1f} % (row {st['worst_row']})")
    rho = s["spearman_all"]  # None when undefined: fewer than two runs, or all predictions equal
    console.print(f"Spearman (all scored runs): {'n/a' if rho is None else f'{rho:.3f}'}; split: {s['split']}")
    if s["uncalibrated_gpu_types"]:
        console.print(f"GPU types with default (uncalibrated) efficiencies: {', '.join(s['uncalibrated_gpu_types'])}")
    if memory:
        mt = Table(title="memory per GPU, first stage, vs Korthikanti et al. 2022 Fig. 1 [GiB]")
        for col in ("model", "component", "recompute", "published", "predicted", "error"):
            mt.add_column(col)
        for m in memory:
            mt.add_row(m["model"], m["component"], m["recompute"], f"{m['published_gib']:.2f}",
                       f"{m['predicted_gib']:.2f}", f"{100 * m['relative_error']:+.1f} %")
        console.print(mt)
