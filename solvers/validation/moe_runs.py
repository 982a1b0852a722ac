"""Measured mixture-of-experts training runs (formulation/data/reference/published_runs_moe.csv) as instances +
placements.

MoE models cannot be described by the dense columns of a runs CSV, so a row names a model preset
(`model_preset`, formulation/data/models/) or gives the model itself in a `model_config` column: the instance's
`model` fields as a JSON object (a Hugging Face config's fields, e.g. `{"num_hidden_layers": 24, ...,
"num_experts": 64}`), or the path of a Hugging Face config.json (relative to the CSV); the row then needs no
preset. A row carries the expert fields: `ep`, `etp`, `dispatcher` (`alltoall`,
`allgather` or `deepep`: the modelled ones; HybridEP rows say so in `flagged` and are scored as `alltoall`),
`load_imbalance` (blank: the job default, docs/moe.md; 1.0 where the run forced balanced routing) and
`layers_per_stage` (comma-separated; Megatron-Core's embedding- and loss-accounting splits give the first and last
stage fewer layers). `recompute` is the mapped granularity (none / selective / full), `recompute_published` what
the source ran: under `selective` its words name Megatron-Core's recompute modules (`norm` and `act` as the ModelZoo
abbreviates layernorm and moe_act), which become the job's `recompute_modules`; `moe_a2a_overlap` (true or blank)
whether the run overlapped the all-to-all with the other micro-batch's compute (`--overlap-moe-expert-parallel-comm
--delay-wgrad-compute`, docs/moe.md (E10)); `flagged` lists the features the model does not have (the row is still scored, and reported
apart from the clean rows). Measured time: `iter_s`, else the published TFLOP/s per GPU with Megatron-LM's MoE
FLOP count (docs/moe.md (E8)), full or with causal attention as `flop_count` says. Every row is predicted and never fitted (`Run.fitted` is False).
"""

from __future__ import annotations

import json
from pathlib import Path

from formulation.inputs.instance import instance_from_dict
from formulation.physics.moe_cost import model_flops
from formulation.placement import Placement
from solvers.validation.run_cluster import cluster_section

MOE_COLUMNS = ("model_preset", "ep", "etp", "dispatcher", "layers_per_stage")
MODEL_COLUMNS = ("model_preset", "model_config")  # either names a row's model; a file with one is in this format
# MoE rows are numbered from 2000 (torchtitan's from 1000), so that no row number of the dense reference files
# (e.g. runs.EXCLUDED's SC21 rows 10-15) names one of them.
MOE_ROW_OFFSET = 2000
# The ModelZoo's abbreviations of Megatron-Core's --recompute-modules
MODULE_ALIASES = {"norm": "layernorm", "act": "moe_act"}


def recompute_modules(r: dict) -> list[str] | None:
    """The recompute modules a selective row ran (None: Megatron-Core's default, core_attn)."""
    words = (r.get("recompute_published") or "").replace(",", " ").split()
    if r["recompute"] != "selective" or not words:
        return None
    return [MODULE_ALIASES.get(word, word) for word in words]


def _training(r: dict) -> dict:
    training = {"global_batch_size": int(r["gbs"]), "seq_length": int(r["seq"]), "precision": r["precision"],
                "recompute": [r["recompute"] or "none"], "zero_stage": [int(r["zero"] or 1)],
                "max_micro_batch_size": int(r["mbs"] or 1), "context_parallel_sizes": [int(r["cp"] or 1)],
                "virtual_pipeline_sizes": [int(r["vp"] or 1)], "flash_attention": True, "sequence_parallel": True,
                "memory_limit_fraction": 1.0, "software_stack": "megatron",
                "expert_parallel_sizes": [int(r["ep"])], "expert_tensor_parallel_sizes": [int(r["etp"] or 1)],
                "moe_token_dispatcher": r["dispatcher"] or "alltoall"}
    modules = recompute_modules(r)
    if modules:
        training["recompute_modules"] = modules
    if (r.get("load_imbalance") or "").strip():
        training["moe_load_imbalance"] = float(r["load_imbalance"])
    return training


def model_section(r: dict) -> dict:
    """The instance's `model` section of a row: `model_config` (a JSON object of model fields, or the path of a
    Hugging Face config.json) where given, else the preset `model_preset` names."""
    config = (r.get("model_config") or "").strip()
    if not config:
        preset = (r.get("model_preset") or "").strip()
        if not preset:
            raise ValueError("column model_preset: expected a preset name, or the model in a model_config column")
        return {"preset": preset}
    if not config.startswith("{"):
        return {"hf_config": config}
    try:
        fields = json.loads(config)
    except json.JSONDecodeError as exc:
        raise ValueError(f"column model_config: not a JSON object ({exc.msg} at character {exc.pos})") from None
    if not isinstance(fields, dict):
        raise ValueError("column model_config: expected a JSON object of model fields or a config.json path")
    return fields


def model_name(r: dict) -> str:
    """What a row's run is called: its preset, else its config's name or path."""
    config = (r.get("model_config") or "").strip()
    if (r.get("model_preset") or "").strip() or not config:
        return (r.get("model_preset") or "").strip()
    if config.startswith("{"):
        try:
            fields = json.loads(config)
        except json.JSONDecodeError:
            return "model_config"
        return str(fields.get("name") or fields.get("_name_or_path") or "model_config") if isinstance(fields, dict) \
            else "model_config"
    return config


def instance_data(index: int, r: dict) -> dict:
    """The row's instance: its model (model_section), the job as the source ran it, a uniform cluster of its GPU
    type."""
    n_gpus, per_node = int(r["n_gpus"]), int(r["gpus_per_node"] or 8)
    return {
        "name": f"moe-row{index}", "description": model_name(r), "model": model_section(r),
        "training": _training(r),
        "cluster": cluster_section(r["gpu_type"], n_gpus, per_node, float(r["intra_node_gb_per_s"]),
                                   float(r["inter_node_gb_per_s"]), int(r.get("nvlink_domain_gpus") or 0) or None),
    }


def moe_run_from_row(index: int, r: dict, base_dir: Path | None = None):
    """A row as a Run; `base_dir`: where a model_config path is relative to (the CSV's folder)."""
    from solvers.validation.runs import Run  # runs.py dispatches here: imported late to keep the cycle open

    base = dict(row=index, name=model_name(r), source=r["source"], gpu_type=r["gpu_type"], instance=None,
                placement=None, measured_iter_s=None, measured_how="", measured_peak_memory_gb=None,
                measured_oom=False, fitted=False, flags=tuple(f.strip() for f in (r.get("flagged") or "").split(";") if f.strip()))
    try:
        instance = instance_from_dict(instance_data(index, r), f"moe runs row {index}", base_dir)
    except ValueError as exc:  # an InputError too: a model_config whose fields or file the model loader refused
        return Run(**base, skipped_reason=f"cannot build the instance: {exc}")
    tp, pp, dp, cp = (int(r[k] or 1) for k in ("tp", "pp", "dp", "cp"))
    n_gpus = int(r["n_gpus"])
    if tp * pp * cp * dp != n_gpus:
        return Run(**base, skipped_reason=f"tp x pp x cp x dp = {tp * pp * cp * dp} differs from n_gpus = {n_gpus}")
    layers = tuple(int(x) for x in r["layers_per_stage"].split(","))
    if len(layers) != pp or sum(layers) != instance.model.num_layers:
        return Run(**base, skipped_reason=f"layers_per_stage {layers} is not {pp} stages of "
                                          f"{instance.model.num_layers} layers")
    overlap = (r.get("moe_a2a_overlap") or "").strip().lower() in ("true", "1")
    placement = Placement(tp=tp, pp=pp, cp=cp, dp=dp, vpp=int(r["vp"] or 1), micro_batch_size=int(r["mbs"] or 1),
                          recompute=r["recompute"] or "none", zero_stage=int(r["zero"] or 1),
                          layers_per_stage=layers, gpus=tuple(range(n_gpus)), ep=int(r["ep"]), etp=int(r["etp"] or 1),
                          moe_a2a_overlap=overlap)
    measured, how = measured_time(r, instance)
    return Run(**base | {"instance": instance, "placement": placement, "measured_iter_s": measured,
                         "measured_how": how})


def source_flops(instance, flop_count: str) -> float:
    """One iteration's FLOPs as the source counted them: Megatron-LM's MoE count (E8), with `causal` half the
    attention core (newer Megatron-LM; the ModelZoo's Qwen3 H100 table agrees with it within 0.7%)."""
    if flop_count not in ("causal", "full"):
        raise ValueError(f"flop_count {flop_count!r}: expected causal or full")
    training = instance.training
    return model_flops(instance.model, training.global_batch_size, training.seq_length, causal=flop_count == "causal")


def measured_time(r: dict, instance) -> tuple[float, str]:
    """The published step time, else the published TFLOP/s per GPU converted with the source's own count."""
    if (r.get("iter_s") or "").strip():
        return float(r["iter_s"]), "iter_s"
    flops = source_flops(instance, r["flop_count"])
    return flops / (float(r["tflops_per_gpu"]) * 1e12 * int(r["n_gpus"])), f"from TFLOP/s ({r['flop_count']} count)"
