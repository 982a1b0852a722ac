"""Measured peak memory (formulation/data/reference/published_memory_peaks.csv): each row a run, the counter it read
(allocated_peak, reserved_peak, nvidia_smi) and on which pipeline stage, predicted by the memory model and scored
leave-one-source-out (docs/memory.md).

A row either names a packaged reference run (`run_row`, the numbering of `solvers/validation/crossval.py`) whose
instance and placement it takes, or spells the run out in its own columns (model shape, parallel sizes, micro-batch,
sequence, recompute, zero stage, precision, stack, attention, sequence parallelism, dropout).

Nothing in the memory model is fitted on these rows, so a source held out is predicted exactly as it is in
sample: the leave-one-source-out figure is the plain prediction, grouped by source.
"""

from __future__ import annotations

import csv
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from formulation.data import REFERENCE_DIR
from formulation.errors import InputError
from formulation.evaluate import evaluate
from formulation.inputs.instance import Instance, instance_from_dict
from formulation.placement import Placement, even_split

MEMORY_PEAKS = REFERENCE_DIR / "published_memory_peaks.csv"
COUNTERS = ("allocated_peak", "reserved_peak", "nvidia_smi")
STAGES = ("max", "first", "last")
TARGET_MEDIAN_ABS_ERROR = 0.08  # held out, per source and pooled


@dataclass
class MemoryRow:
    row: int
    source: str
    url: str
    counter: str
    stage: str
    measured_gib: float | None  # None: the run measured out of memory (`measured_gib` OOM)
    instance: Instance
    placement: Placement
    notes: str


def _int(r: dict, key: str, default: int | None = None) -> int:
    text = (r.get(key) or "").strip()
    if not text:
        if default is None:
            raise ValueError(f"{key}: required")
        return default
    return int(text)


def _flag(r: dict, key: str) -> bool:
    return (r.get(key) or "").strip().lower() == "true"


def _explicit(index: int, r: dict) -> tuple[Instance, Placement]:
    """The run a row spells out: a uniform cluster of its GPU type, its model and job as the source ran it."""
    tp, pp, dp, cp, vpp, mbs = (_int(r, k, d) for k, d in (("tp", None), ("pp", None), ("dp", None), ("cp", 1),
                                                               ("vp", 1), ("mbs", None)))
    hidden, heads, ffn = _int(r, "hidden"), _int(r, "heads"), _int(r, "ffn")
    n_gpus = tp * pp * dp * cp
    recompute = (r.get("recompute") or "none").strip()
    data = {
        "name": f"memory row {index}",
        "model": {"name": r["model"], "num_hidden_layers": _int(r, "layers"), "hidden_size": hidden,
                  "intermediate_size": ffn, "num_attention_heads": heads,
                  "num_key_value_heads": _int(r, "kv_heads", heads), "vocab_size": _int(r, "vocab"),
                  "hidden_act": (r.get("hidden_act") or "silu").strip(), "dropout": _flag(r, "dropout"),
                  **({"head_dim": _int(r, "head_dim")} if (r.get("head_dim") or "").strip() else {})},
        "training": {"global_batch_size": _int(r, "gbs"), "seq_length": _int(r, "seq"),
                     "precision": r["precision"].strip(), "recompute": [recompute], "zero_stage": [_int(r, "zero")],
                     "max_micro_batch_size": mbs, "context_parallel_sizes": [cp], "virtual_pipeline_sizes": [vpp],
                     "flash_attention": _flag(r, "flash_attention"), "sequence_parallel": _flag(r, "sequence_parallel"),
                     "software_stack": r["software_stack"].strip(), "memory_limit_fraction": 1.0,
                     "fused_cross_entropy": r["software_stack"].strip() not in ("torchtitan",),
                     # torchtitan rows say whether the blocks and the loss were compiled
                     **{k: _flag(r, k) for k in ("torch_compile", "compiled_loss") if (r.get(k) or "").strip()}},
        "cluster": {"gpu_types": {r["gpu_type"]: {"preset": r["gpu_type"]}},
                    "nodes": [{"count": max(1, math.ceil(n_gpus / 8)), "prefix": "n", "gpu_type": r["gpu_type"],
                               "gpus": min(8, n_gpus)}],
                    "network": {"intra_node_gb_per_s": 300, "inter_node_gb_per_s": 25}},
    }
    instance = instance_from_dict(data, f"memory row {index}")
    layers = instance.model.num_layers
    placement = Placement(tp=tp, pp=pp, cp=cp, dp=dp, vpp=vpp, micro_batch_size=mbs, recompute=recompute,
                          zero_stage=_int(r, "zero"), layers_per_stage=even_split(layers, pp),
                          gpus=tuple(range(n_gpus)))
    return instance, placement


def load_memory_rows(path: Path = MEMORY_PEAKS) -> list[MemoryRow]:
    """Every row of a memory CSV as a run to predict; a row that cannot be built is an `InputError` naming it."""
    from solvers.validation.crossval import reference_runs

    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in ("source", "url", "counter", "measured_gib") if c not in (reader.fieldnames or [])]
        if missing:
            raise InputError(str(path), "<header>", f"missing columns: {', '.join(missing)} (docs/memory.md)")
        raw = list(reader)
    runs = None
    out = []
    for i, r in enumerate(raw):
        counter, stage = r["counter"].strip(), (r.get("stage") or "max").strip()
        if counter not in COUNTERS or stage not in STAGES:
            raise InputError(str(path), f"row {i}", f"counter must be one of {COUNTERS} and stage one of {STAGES}")
        if not r["source"].strip() or not r["url"].strip():
            raise InputError(str(path), f"row {i}", "every row names its source and URL")
        try:
            if (r.get("run_row") or "").strip():
                runs = runs if runs is not None else {run.row: run for run in reference_runs()}
                run = runs[int(r["run_row"])]
                instance, placement = run.instance, run.placement
            else:
                instance, placement = _explicit(i, r)
        except (ValueError, KeyError, TypeError) as exc:
            raise InputError(str(path), f"row {i}", f"cannot build the run: {exc}") from None
        try:
            measured = None if r["measured_gib"].strip().upper() == "OOM" else float(r["measured_gib"])
        except ValueError:
            raise InputError(str(path), f"row {i}.measured_gib", f"expected GiB, got {r['measured_gib']!r}") from None
        out.append(MemoryRow(i, r["source"].strip(), r["url"].strip(), counter, stage, measured, instance, placement,
                             r.get("notes", "")))
    return out


def predicted_gib(row: MemoryRow) -> float:
    """The model's figure for the row's counter on the stage the source logged (the largest stage by default)."""
    stages = [s.memory for s in evaluate(row.instance, row.placement, check=False).stages]
    if row.stage == "first":
        return stages[0].counter_gib(row.counter)
    if row.stage == "last":
        return stages[-1].counter_gib(row.counter)
    return max(m.counter_gib(row.counter) for m in stages)


def validate_memory_peaks(path: Path = MEMORY_PEAKS) -> dict:
    """Predicted / measured - 1 per row, and the median |error| per source, per counter and pooled. Held out by
    source: nothing is fitted on these rows (module docstring), so each source's figure is out of sample."""
    rows, ooms = [], []
    for r in load_memory_rows(path):
        if r.measured_gib is None:  # an out-of-memory run: right if some stage's nvidia-smi figure exceeds the GPU
            stages = [s.memory for s in evaluate(r.instance, r.placement, check=False).stages]
            worst = max(stages, key=lambda m: m.total_gib - m.capacity_gib)
            ooms.append({"row": r.row, "source": r.source, "model": r.instance.model.name,
                         "predicted_gib": worst.total_gib, "capacity_gib": worst.capacity_gib,
                         "predicted_to_fit": worst.total_gib <= worst.capacity_gib})
            continue
        predicted = predicted_gib(r)
        rows.append({"row": r.row, "source": r.source, "counter": r.counter, "stage": r.stage,
                     "model": r.instance.model.name, "measured_gib": r.measured_gib, "predicted_gib": predicted,
                     "error": predicted / r.measured_gib - 1})

    def stats(items: list[dict]) -> dict:
        errors = [abs(x["error"]) for x in items]
        return {"rows": len(items), "median_abs_error": statistics.median(errors) if errors else None,
                "median_error": statistics.median(x["error"] for x in items) if items else None,
                "max_abs_error": max(errors) if errors else None}

    by = lambda key: {k: stats([x for x in rows if x[key] == k]) for k in sorted({x[key] for x in rows})}  # noqa: E731
    return {"rows": rows, "by_source": by("source"), "by_counter": by("counter"), "pooled": stats(rows),
            "sources": len({x["source"] for x in rows}), "target_median_abs_error": TARGET_MEDIAN_ABS_ERROR,
            "measured_oom": ooms}


def over_capacity_runs(path: Path = MEMORY_PEAKS) -> list[dict]:
    """Measured memory rows (the runs ran) whose nvidia-smi figure the model puts over the GPU's memory."""
    out = []
    for r in load_memory_rows(path):
        if r.measured_gib is None:
            continue
        stages = [s.memory for s in evaluate(r.instance, r.placement, check=False).stages]
        worst = max(stages, key=lambda m: m.total_gib - m.capacity_gib)
        if worst.total_gib > worst.capacity_gib:
            out.append({"row": r.row, "source": r.source, "predicted_gib": worst.total_gib,
                        "capacity_gib": worst.capacity_gib})
    return out
