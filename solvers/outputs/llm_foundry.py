"""The plan's data parallelism as llm-foundry's `fsdp_config` (Composer's FSDPConfig on PyTorch FSDP1).

FSDP1's sharding strategies are points of the planner's sharding space (docs/model.md (C11)-(C12)):
- FULL_SHARD: zero_stage 3, resharded after the forward;
- SHARD_GRAD_OP: zero_stage 3 kept unsharded from the forward to the backward (reshard_after_forward false);
- HYBRID_SHARD / _HYBRID_SHARD_ZERO2: the same with replicas (dp_replicate > 1), sharded inside a group of
  dp_shard ranks (FSDP1 builds it of torch.cuda.device_count() GPUs, one node, without an explicit mesh; Composer's
  `data_parallel_shard_degree` / `data_parallel_replicate_degree` set other sizes);
- NO_SHARD: zero_stage 0.
llm-foundry has no optimizer-only sharding (zero_stage 1) nor gradient-only sharding (2): those plans are written
as the nearest strategy with a note.
"""

from __future__ import annotations

import json


def sharding_strategy(p) -> str:
    """FSDP1's ShardingStrategy name for placement `p` (zero 1 and 2: the nearest, see `fsdp_config`)."""
    if p.zero_stage == 0:
        return "NO_SHARD"
    if p.dp_replicate > 1:
        return "HYBRID_SHARD" if p.reshard_after_forward else "_HYBRID_SHARD_ZERO2"
    return "FULL_SHARD" if p.reshard_after_forward else "SHARD_GRAD_OP"


def fsdp_config(instance, p) -> tuple[dict, list[str]]:
    """(llm-foundry's fsdp_config keys, notes) of placement `p`."""
    notes = []
    if p.zero_stage in (1, 2):
        notes.append(f"llm-foundry has no {'optimizer' if p.zero_stage == 1 else 'gradient'}-only sharding: the plan's "
                     f"zero_stage {p.zero_stage} is written as {sharding_strategy(p)}, which also shards the "
                     "parameters (re-plan with zero_stage 3 for a plan it runs as planned)")
    config = {"sharding_strategy": sharding_strategy(p), "mixed_precision": "PURE",
              "activation_checkpointing": p.recompute == "full", "limit_all_gathers": True,
              "backward_prefetch": "BACKWARD_POST" if instance.training.fsdp_backward_prefetch == "post"
              else "BACKWARD_PRE"}
    if p.dp_replicate > 1:
        config["data_parallel_shard_degree"] = p.dp_shard
        config["data_parallel_replicate_degree"] = p.dp_replicate
    if p.tp * p.pp * p.cp > 1:
        notes.append(f"llm-foundry trains with data parallelism only: tp={p.tp} pp={p.pp} cp={p.cp} cannot be written")
    return config, notes


def fsdp_config_yaml(instance, p) -> str:
    """The fsdp_config block of an llm-foundry training YAML (JSON values are valid YAML), notes as comments."""
    config, notes = fsdp_config(instance, p)
    lines = [f"# {note}" for note in notes] + ["fsdp_config:"]
    lines += [f"  {key}: {json.dumps(value)}" for key, value in config.items()]
    return "\n".join(lines) + "\n"
