"""Tables of `solve validate` (leave-one-source-out over the packaged reference runs), computed once per run of
render.py: about a minute on 2 cores, so these are `slow` figures (checked by the slow suite)."""

from __future__ import annotations

import functools
from package_data import table
from registry import figure

from solvers.validation import crossval

COMMAND = "solve validate --json"


@functools.lru_cache(maxsize=1)
def predictions() -> list:
    return crossval.cross_validate(crossval.reference_runs())


@functools.lru_cache(maxsize=1)
def summary() -> dict:
    return crossval.summarize(predictions())


def _pct(x: float, signed: bool = False) -> str:
    return f"{100 * x:+.1f}%" if signed else f"{100 * x:.1f}%"


@figure("lsos-per-source", doc="docs/validation.md", cost="slow", command=COMMAND)
def per_source() -> str:
    s = summary()
    rows = [[family, v["runs"], _pct(v["median_error"], True), _pct(v["median_abs_error"]),
             f"{v['worst_row']} {_pct(v['worst_error'], True)} ({v['worst_model']})"]
            for family, v in sorted(s["sources"].items(), key=lambda kv: kv[0].lower())]
    for label, key in (("**pooled**", "pooled"), ("FP8 runs", "fp8")):
        v = s[key]
        rows.append([label, v["runs"], _pct(v["median_error"], True), f"**{_pct(v['median_abs_error'])}**"
                     if key == "pooled" else _pct(v["median_abs_error"]), ""])
    return table(["source family", "runs", "median signed", "median abs", "worst row"], rows)


@figure("lsos-largest-errors", doc="docs/validation.md", cost="slow", command="solve validate --json")
def largest_errors() -> str:
    """Every run the held-out model gets 15% or more wrong, by source."""
    rows = []
    for p in sorted((p for p in predictions() if p.timed and abs(p.error) >= 0.15), key=lambda p: (p.family, p.run.row)):
        rows.append([p.family, p.run.row, p.run.name, p.run.gpu_type, f"{p.run.placement.describe()}", p.instance.training.precision,
                     _pct(p.error, True)])
    return table(["source family", "row", "model", "GPU", "configuration", "precision", "error"], rows)


@figure("lsos-memory-rank", doc="docs/validation.md", cost="slow", command=COMMAND)
def memory_and_rank() -> str:
    s = summary()
    memory = s["memory"]
    below = sorted((r for r in memory["rows"] if r["error"] < 0), key=lambda r: r["error"])
    groups = "; ".join(f"{g['group'][0]} on {g['group'][2]} {g['group'][1]}, {g['runs']} runs, Spearman "
                       f"{g['spearman']:.2f}" for g in s["sweep_groups"])
    return "\n".join([
        f"- Peak memory, against the {len(memory['rows'])} runs that measured it: median |error| "
        f"{_pct(memory['median_abs_error'])}, median signed {_pct(memory['median_error'], True)}; below the "
        f"measurement on {len(below)} rows (" + ", ".join(f"{r['row']} {_pct(r['error'], True)}" for r in below) + ").",
        f"- Runs that ran but are predicted above their GPU's memory: {len(s['ran_predicted_oom'])} "
        f"(rows {', '.join(str(r) for r in s['ran_predicted_oom'])}); runs that measured out-of-memory: "
        f"{len(s['measured_oom'])}.",
        f"- Rank correlation inside sweep groups (same model, GPU type and count, sequence and global batch; at "
        f"least 4 runs): {groups or 'none'}.",
    ])


@figure("interval-coverage", doc="docs/validation.md", cost="slow", command=COMMAND)
def interval_coverage() -> str:
    coverage = summary()["interval_coverage"]
    labels = {"pooled": "one pooled band", "by_precision": "band per precision (shipped)",
              "by_stack": "band per precision, by stack kind"}
    rows = []
    for mode in ("pooled", "by_precision", "by_stack"):
        for group, c in coverage[mode].items():
            rows.append([labels[mode], group, c["runs"], f"{c['faster_than_p10']:.0%}", f"{c['inside']:.0%}",
                         f"{c['slower_than_p90']:.0%}"])
    return table(["band", "group", "runs", "faster than p10", "inside", "slower than p90"], rows)


@figure("few-shot-quartile-pair", doc="docs/validation.md", cost="slow", command="solve validate --few-shot")
def few_shot_quartile_pair() -> str:
    from solvers.validation import fewshot

    rows = []
    for r in fewshot.few_shot_table(predictions()):
        after = _pct(r["median_abs_error_after"])
        rows.append([r["source"], r["predicted_runs"], ", ".join(str(x) for x in r["calibrated_on"]),
                     _pct(r["median_abs_error_before"]), f"**{after}**" if r["median_abs_error_after"] > 0.05 else after])
    return table(["cluster", "runs predicted", "calibrated on rows", "before", "after two runs"], rows)


@figure("physics-ablation", doc="docs/physics.md", cost="expensive", command="solve validate --ablation")
def ablation() -> str:
    from formulation.physics.cost import PHYSICS_TERMS

    rows = []
    for r in crossval.ablation(crossval.reference_runs(), PHYSICS_TERMS):
        flipped = "-" if r["flipped_to"] is None else ("on" if r["flipped_to"] else "off")
        rows.append([f"`{r['term']}`" if r["flipped_to"] is not None else r["term"], flipped,
                     _pct(r["pooled_median_abs_error"]), _pct(r["fp8_median_abs_error"]),
                     _pct(r["memory_median_abs_error"]), r["ran_predicted_oom"],
                     ", ".join(r["sources_beyond_10_percent"]) or "none"])
    return table(["term", "flipped to", "pooled median abs", "FP8 median abs", "memory median abs",
                  "ran, called OOM", "sources with abs(median signed) > 10%"], rows)


@figure("in-sample-rows", doc="docs/validation.md", command="solve validate --rows")
def in_sample_rows() -> str:
    """The stored calibration on published_runs.csv (in-sample, its row % 3 split) and Korthikanti's memory
    components: seconds, so a cheap figure."""
    from solvers.validation.runs import DEFAULT_RUNS
    from solvers.validation.validate import validate_memory, validate_runs

    result = validate_runs(DEFAULT_RUNS)
    s, rows = result["summary"], {r["row"]: r for r in result["rows"]}
    labels = {"held_out": "held out (row % 3 == 0)", "calibration_split": "calibration split (row % 3 != 0)",
              "all_scored": "every scored row of published_runs.csv"}
    lines = [[labels[k], s[k]["count"], _pct(s[k]["median_abs_error"]),
              f"{_pct(s[k]['max_abs_error'])} (row {s[k]['worst_row']}, {rows[s[k]['worst_row']]['model']})"]
             for k in labels]
    memory = validate_memory()
    worst = max(memory, key=lambda m: abs(m["relative_error"]))
    called_oom = [r["row"] for r in result["rows"] if r["skipped_reason"] is None and r["predicted_oom"]]
    return (table(["set (calibrated GPU types)", "runs", "median abs error", "max abs error"], lines)
            + f"\n\nSpearman rank correlation over every scored run: {s['spearman_all']:.3f}. Memory components "
              f"(Korthikanti et al. 2022 Fig. 1, first stage): {sum(abs(m['relative_error']) <= 0.10 for m in memory)} "
              f"of {len(memory)} within 10%, {sum(m['relative_error'] > 0 for m in memory)} over-estimated, the "
              f"largest {_pct(worst['relative_error'], True)} ({worst['model']}, {worst['component']}). Rows that ran "
              f"but are predicted above their GPU's memory: {len(called_oom)} ({', '.join(map(str, called_oom))}); "
              f"rows not scored: {s['skipped']}.")
