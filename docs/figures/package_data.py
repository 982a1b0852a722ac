"""Tables computed from the package data alone (seconds): the GPU catalog, the model presets, the fitted
efficiencies and the stored prediction intervals."""

from __future__ import annotations

import json
import math

from registry import figure

from formulation.data import DATA_DIR, MODELS_DIR
from formulation.inputs.gpus import CALIBRATION_PATH, gpu_catalog
from formulation.inputs.model import model_from_dict, preset_names
from formulation.inputs.moe import parameter_counts


def table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _num(x: float, digits: int = 0) -> str:
    return f"{x:,.{digits}f}" if x else "-"


@figure("gpu-catalog", doc="docs/model.md")
def gpu_catalog_table() -> str:
    megatron, torchtitan, llm_foundry = (gpu_catalog(s) for s in ("megatron", "torchtitan", "llm-foundry"))
    rows = []
    for name, g in megatron.items():
        if name.startswith("__"):
            continue
        rows.append([f"`{name}`", f"{g['memory_gib']:g}", _num(g["peak_tflops"]), _num(g["peak_fp8_tflops"]),
                     _num(g["hbm_gb_per_s"]), f"{g['efficiency_half_gflop']:g}", f"{g['attention_efficiency']:g}",
                     f"{g['matmul_efficiency']:g}", f"{torchtitan[name]['matmul_efficiency']:g}",
                     f"{llm_foundry[name]['matmul_efficiency']:g}"])
    overhead = megatron["__default__"]["iteration_overhead_s"]
    return (table(["catalog name", "memory GiB", "bf16 peak TFLOP/s", "FP8 peak TFLOP/s", "HBM GB/s",
                   "W_half GFLOP (C1)", "attention efficiency (C2)", "GEMM efficiency, megatron",
                   "torchtitan", "llm-foundry"], rows)
            + f"\n\nOne `iteration_overhead_s` shared by every chip and stack (C14): {overhead:g} s. GEMM efficiencies are "
              "fitted (`solve calibrate --write`, formulation/data/calibration.json); a GPU type or stack without a "
              "fit takes the GPU's Megatron fit, then the default "
              f"{megatron['__default__']['matmul_efficiency']:g}. Everything else is a data-sheet or kernel figure "
              "(formulation/data/gpu_types.json).")


@figure("model-presets", doc="docs/model.md")
def model_presets_table() -> str:
    rows = []
    for name in preset_names():
        data = json.loads((MODELS_DIR / f"{name}.json").read_text())
        m = model_from_dict(data, name, "")
        counts = parameter_counts(m)
        moe = m.moe
        experts = f"{moe.num_experts} (top {moe.topk})" if moe else "-"
        attention = "MLA" if m.mla else (f"{m.num_attention_heads} / {m.num_kv_heads}")
        active = f"{counts.active / 1e9:.1f}" if moe else "-"
        rows.append([f"`{name}`", m.num_layers, m.hidden_size, attention, m.ffn_hidden_size, m.vocab_size, experts,
                     f"{counts.total / 1e9:.1f}", active])
    return table(["preset", "layers", "hidden", "heads / kv heads", "ffn", "vocabulary", "routed experts",
                  "parameters (B)", "active (B)"], rows)


@figure("fitted-efficiencies", doc="docs/validation.md")
def fitted_efficiencies_table() -> str:
    calibration = {k: v for k, v in json.loads(CALIBRATION_PATH.read_text()).items() if not k.startswith("_")}
    rows, seen = [], set()
    for key, entry in calibration.items():
        if key == "default" or "matmul_efficiency" not in entry:
            continue
        fitted_on = entry.get("fitted_on", "")
        basis = fitted_on.split(" rows")[0] if fitted_on else ""
        if (basis, entry["matmul_efficiency"]) in seen:  # A100 sizes share one fit, H100 / H200 another
            continue
        seen.add((basis, entry["matmul_efficiency"]))
        runs = fitted_on.count(",") + 1 if "[" in fitted_on else 0
        gpu, _, stack = (basis or key).partition("+")
        rows.append([f"`{gpu}`", stack or "megatron", f"{entry['matmul_efficiency']:g}", runs])
    return (table(["fitted on GPU type", "stack", "GEMM efficiency (C1)", "calibration-split runs"], rows)
            + f"\n\nShared per-iteration overhead (C14): {calibration['default']['iteration_overhead_s']:g} s.")


@figure("stored-intervals", doc="docs/validation.md")
def stored_intervals_table() -> str:
    stored = json.loads((DATA_DIR / "intervals.json").read_text())
    rows = []
    for group, q in [("pooled", stored), *stored["by_precision"].items()]:
        rows.append([group, q["runs"], f"{q['log_residual_p10']:+.3f}", f"{q['log_residual_p90']:+.3f}",
                     f"[T x {math.exp(-q['log_residual_p90']):.2f}, T x {math.exp(-q['log_residual_p10']):.2f}]"])
    shares = ", ".join(f"{stack} {share:.0%}" for stack, share in stored["slower_than_p90_by_stack"].items())
    return (table(["group", "runs", "p10 of log(pred / meas)", "p90", "interval of an estimate T"], rows)
            + f"\n\nShare of each stack kind's runs measured slower than the slow end (held out by source, "
              f"`iteration_time_slow_tail_share` in a plan file): {shares}.")
