"""Sharded data parallelism (ZeRO 1-3, FSDP, HSDP): what each rank keeps of the model's states and what the
shard and replicate groups exchange (docs/model.md (M1)-(M3), (M6), (C11)-(C12)).

dp = dp_shard x dp_replicate. A stage's states are sharded over its shard group (dp_shard x cp ranks) and
replicated across dp_replicate such groups:
- zero_stage 1 (Megatron's distributed optimizer, `num_distributed_optimizer_instances` = dp_replicate): the
  optimizer state / shard; after the last backward a reduce-scatter of the gradients inside the shard group, then
  an all-reduce of the gradient shard across replicas (Megatron-Core's `inter_distributed_optimizer_instance_group`,
  on the same stream), and after the step an all-gather of the parameters inside the shard group.
- zero_stage 2 (DeepSpeed ZeRO-2, Megatron-FSDP `optim_grads`): gradients sharded too, so every micro-batch's
  backward reduce-scatters each layer's gradients inside the shard group (the per-layer term of (C12), without
  gathers), with replicas followed by the all-reduce of the layer's gradient shard across them; after the step the
  all-gather.
- zero_stage 3 (FSDP, Megatron-FSDP `optim_grads_params`): parameters sharded; per layer and micro-batch an
  all-gather in the forward, another in the backward unless `reshard_after_forward` is False (FSDP2's False,
  FSDP1's SHARD_GRAD_OP: the forward's gathered parameters stay until the backward), and a reduce-scatter, with
  replicas followed by the all-reduce of the layer's gradient shard across them (FSDP1's HYBRID_SHARD and FSDP2's
  HSDP reduce each FSDP unit in its backward: `_post_backward_hook` reduce-scatters in the shard group, then
  all-reduces the shard in the replicate group), hidden behind the layer's backward as the reduce-scatter is.
  torchtitan's pipeline stages (pp > 1) instead gather in the step's first forward and reduce once after their last
  backward (`grad_sync_once_per_step`); Megatron-FSDP (zero 2 and 3 on the megatron stack) all-reduces across
  replicas once per step, after the last backward (`replica_reduce_once_per_step`).
"""

from __future__ import annotations


def state_divisors(p) -> tuple[int, int, int]:
    """(M1)-(M3) What the (weights, gradients, optimizer state) of a rank are divided by: the shard group's size
    for the states its zero stage shards, else 1."""
    shard = p.shard_size
    return (shard if p.zero_stage >= 3 else 1, shard if p.zero_stage >= 2 else 1, shard if p.zero_stage >= 1 else 1)


def per_layer_reduce_scatter(p) -> bool:
    """(C12) Whether each layer's gradients are reduce-scattered in every micro-batch's backward (zero 2 and 3)."""
    return p.zero_stage >= 2


def grad_sync_once_per_step(job, p) -> bool:
    """(C12) torchtitan with pipeline parallelism (pp > 1) and FSDP (zero 3, HSDP too): torch.distributed.
    pipelining's stage turns FSDP's gradient sync and its reshard after backward off for every backward
    (`backward_maybe_with_nosync`) and reduces once after the stage's last backward (`perform_reduce_grad`, the
    schedules' REDUCE_GRAD), so the reduce-scatters (and HSDP's replica all-reduces) run once per step; the
    parameters, gathered by the step's first forward, stay unsharded (torchtitan's default
    `fsdp_reshard_after_forward` with pp; resharded after each forward otherwise, and gathered again by each
    backward)."""
    return job.software_stack == "torchtitan" and p.pp > 1 and p.zero_stage >= 3


def replica_reduce_once_per_step(job, p) -> bool:
    """(C12) Megatron-FSDP (the megatron stack's zero 2 and 3) with replicas: each micro-batch's backward
    reduce-scatters in the shard group (`grad_reduce_every_bprop`), but the all-reduce across the outer (replica)
    group runs on the last micro-batch only (`outer_fsdp_group_grad_reduce` = use_hybrid_fsdp and
    is_last_microbatch, megatron_fsdp.py), after each bucket's reduce-scatter on its own stream, waited in
    `finish_grad_sync`: once per step, behind the last backward as zero 1's (`replica_messages`)."""
    return job.software_stack == "megatron" and p.zero_stage >= 2 and p.dp_replicate > 1


def backward_gathers(p) -> bool:
    """(C12) Whether the backward gathers each layer's parameters again (zero 3 resharded after the forward)."""
    return p.zero_stage >= 3 and p.reshard_after_forward


def sharding_buffer_bytes(p, layer_params: float, w_bytes: float, g_bytes: float, kept_unsharded: bool
                          ) -> tuple[float, float]:
    """(M6) (fixed, per layer) bytes of the sharding's transient buffers beyond ZeRO-3's gathers (memory.py):
    zero 2 holds one layer's unsharded gradients while they are reduce-scattered; zero 3 without resharding keeps
    every layer's gathered parameters from its forward to its backward (`kept_unsharded`: already counted, as
    torchtitan's pipeline stages keep them, memory.unsharded_pipeline_bytes)."""
    fixed = layer_params * g_bytes if p.zero_stage == 2 else 0.0
    per_layer = layer_params * w_bytes if p.zero_stage >= 3 and not p.reshard_after_forward and not kept_unsharded \
        else 0.0
    return fixed, per_layer


def extra_groups(p) -> int:
    """(M8) Communicators a rank holds beyond tp, cp and dp x cp: the shard and the replicate group with
    dp_replicate > 1."""
    return 2 if p.dp_replicate > 1 else 0


def replica_messages(instance, p, stage_params: float) -> dict:
    """(C11) The all-reduce across replicas of the stage's gradient shard after its last backward, by the part of the
    dp sync it belongs to: zero 1's follows its reduce-scatter and shares its window ({"reduce_scatter": bytes});
    Megatron-FSDP's (zero 2 and 3, `replica_reduce_once_per_step`) is a part of its own, {"all_reduce": bytes},
    behind the last backward; {} without replicas, and for the other zero 2 and 3 stacks, which all-reduce per
    layer (`layer_replica_bytes`)."""
    once = replica_reduce_once_per_step(instance.training, p)
    if p.dp_replicate == 1 or (p.zero_stage != 1 and not once):
        return {}
    g_bytes = instance.training.grad_reduce_bytes
    return {"all_reduce" if once else "reduce_scatter": stage_params * g_bytes / p.shard_size}


def layer_replica_bytes(instance, p, layer_params: float) -> float:
    """(C12) zero 2 and 3 with replicas: the all-reduce of one layer's gradient shard across replicas after its
    reduce-scatter, in every micro-batch's backward (bytes; 0 without replicas, and for Megatron-FSDP, which
    all-reduces once per step, `replica_messages`)."""
    if p.dp_replicate == 1 or p.zero_stage < 2 or replica_reduce_once_per_step(instance.training, p):
        return 0.0
    return layer_params * instance.training.grad_reduce_bytes / p.shard_size


def check_sharding(model, p, bad) -> None:
    """dp_replicate divides dp and needs sharded states (zero_stage >= 1; 0 replicates everything); a dense model
    (the experts' sharding over their own data-parallel group is Megatron-Core's, not modelled with replicas);
    reshard_after_forward False only with zero_stage 3. `bad(field, problem)` raises."""
    r = p.dp_replicate
    if isinstance(r, bool) or not isinstance(r, int) or r < 1 or p.dp % r:
        bad("dp_replicate", f"expected a positive integer dividing dp={p.dp}, got {r!r}")
    if r > 1 and p.zero_stage == 0:
        bad("dp_replicate", f"dp_replicate={r} needs sharded states (zero_stage 1, 2 or 3); zero_stage 0 replicates "
                            "everything: expected 1")
    if r > 1 and model.moe is not None:
        bad("dp_replicate", "sharding over part of dp is not modelled for mixture-of-experts models: expected 1")
    if not isinstance(p.reshard_after_forward, bool):
        bad("reshard_after_forward", f"expected true or false, got {p.reshard_after_forward!r}")
    if not p.reshard_after_forward and p.zero_stage != 3:
        bad("reshard_after_forward", f"false applies to zero_stage 3 (parameters sharded); got zero_stage "
                                     f"{p.zero_stage}")
