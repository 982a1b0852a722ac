"""The measured peak-memory table of docs/memory.md: each source's rows predicted (nothing of the memory model is
fitted on them, so every source is held out), per source and counter, then pooled (seconds)."""

from __future__ import annotations

from statistics import median

from registry import figure

from solvers.validation.memory_runs import validate_memory_peaks


def _pct(x: float, signed: bool = False) -> str:
    return f"{100 * x:+.1f} %" if signed else f"{100 * x:.1f} %"


@figure("memory-peaks-per-source", doc="docs/memory.md",
        command="solve validate --memory-only (or python docs/figures/render.py memory-peaks-per-source)")
def memory_peaks_table() -> str:
    result = validate_memory_peaks()
    groups: dict[tuple[str, str], list[float]] = {}
    for r in result["rows"]:
        groups.setdefault((r["source"], r["counter"]), []).append(r["error"])
    lines = ["| source | counter | rows | median signed | median \\|error\\| | max \\|error\\| |",
             "| --- | --- | --- | --- | --- | --- |"]
    for (source, counter), errors in sorted(groups.items()):
        lines.append(f"| {source} | {counter} | {len(errors)} | {_pct(median(errors), True)} | "
                     f"{_pct(median(abs(e) for e in errors))} | {_pct(max(abs(e) for e in errors))} |")
    for counter, st in [*result["by_counter"].items(), ("all", result["pooled"])]:
        lines.append(f"| pooled | {counter} | {st['rows']} | {_pct(st['median_error'], True)} | "
                     f"{_pct(st['median_abs_error'])} | {_pct(st['max_abs_error'])} |")
    return "\n".join(lines)
