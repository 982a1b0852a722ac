"""The plan as torchtitan settings: `[training]`, `[parallelism]` and `[activation_checkpoint]` of its TOML config.

Degrees map one to one (torchtitan's mesh order pp, dp_replicate, dp_shard, cp, tp matches Megatron's tp-cp-dp-pp);
zero_stage 3 is FSDP, zero_stage 0 replicate (DDP), zero_stage 1 replicate when the replicated Adam state still
fits, else FSDP with parameters kept gathered."""

from __future__ import annotations

from formulation.placement import Placement
from solvers.outputs.report import comment_lines


def torchtitan_toml(instance, plan) -> str:
    p, e, job, model = plan.placement, plan.estimate, instance.training, instance.model
    m = e.num_micro_batches
    lines = [f"# torchtitan settings for the plan of {instance.name} ({instance.model.name}), llm-train-planner.",
             f"# plan: {p.summary()}",
             "# Merge into your torchtitan train config (model name/flavor, data and optimizer stay yours).",
             "# GPU placement is the launcher's job: start torchtitan with launch_torchrun.sh or launch_slurm.sh",
             "# (TRAIN_SCRIPT=-m torchtitan.train) so the ranks land on the plan's GPUs; torchtitan's mesh order",
             "# (pp, dp_replicate, dp_shard, cp, tp; tp fastest) matches Megatron's tp-cp-dp-pp for these degrees.",
             "", "[training]"]
    if p.pp > 1:
        lines.append(f"local_batch_size = {p.micro_batch_size * m}  # sequences per data-parallel rank, split into "
                     f"{m} micro-batches")
    else:
        lines.append(f"local_batch_size = {p.micro_batch_size}  # torchtitan accumulates gradients over {m} steps")
    lines += [f"global_batch_size = {job.global_batch_size}", f"seq_len = {job.seq_length}", "", "[parallelism]"]
    shard, notes = _sharding(p, e)
    lines += comment_lines(notes)
    lines += (["data_parallel_replicate_degree = 1", f"data_parallel_shard_degree = {p.dp}"] if shard else
              [f"data_parallel_replicate_degree = {p.dp}", "data_parallel_shard_degree = 1"])
    if shard and p.zero_stage == 1:
        lines.append('fsdp_reshard_after_forward = "never"')
    lines += [f"tensor_parallel_degree = {p.tp}", f"pipeline_parallel_degree = {p.pp}",
              f"context_parallel_degree = {p.cp}"]
    if p.pp > 1:
        schedule = "Interleaved1F1B" if p.vpp > 1 else "1F1B"
        lines += [f"pipeline_parallel_microbatch_size = {p.micro_batch_size}",
                  f'pipeline_parallel_schedule = "{schedule}"',
                  "# the plan's layer split, one model part per virtual stage (part k runs on stage k mod pp)",
                  "module_fqns_per_model_part = ["]
        parts = _model_parts(model.num_layers, p)
        lines += [f"  {part}," for part in parts] + ["]"]
    mode = {"none": "none", "selective": "selective", "full": "full"}[p.recompute]
    lines += ["", "[activation_checkpoint]", f'mode = "{mode}"']
    if p.recompute == "selective":
        lines.append('selective_ac_option = "op"  # recompute cheap ops, keep matmul outputs (close to Megatron\'s '
                     'selective recompute of the attention core)')
    return "\n".join(lines) + "\n"


def _model_parts(num_layers: int, p: Placement) -> list[str]:
    """torchtitan module names (Llama-family models) per virtual stage, in Megatron's chunk order."""
    starts, first = {}, 0
    chunk_layers = {}
    for chunk in range(p.vpp):
        for stage in range(p.pp):
            n = p.layers_per_stage[stage] // p.vpp
            starts[(chunk, stage)], chunk_layers[(chunk, stage)] = first, n
            first += n
    parts = []
    for chunk in range(p.vpp):
        for stage in range(p.pp):
            a = starts[(chunk, stage)]
            names = [f"layers.{i}" for i in range(a, a + chunk_layers[(chunk, stage)])]
            if a == 0:
                names.insert(0, "tok_embeddings")
            if a + chunk_layers[(chunk, stage)] == num_layers:
                names += ["norm", "output"]
            parts.append("[" + ", ".join(f'"{n}"' for n in names) + "]")
    return parts


def _sharding(p: Placement, e) -> tuple[bool, list[str]]:
    """Whether torchtitan shards (FSDP) or replicates (DDP) the data-parallel ranks, and why."""
    shard = p.zero_stage == 3
    if p.zero_stage == 3:
        notes = ["zero_stage 3: FSDP shards parameters, gradients and optimizer state over the data-parallel ranks."]
    else:
        notes = [f"zero_stage {p.zero_stage}: replicated data parallelism (DDP), the plan's gradient all-reduce."]
        if p.zero_stage == 1:
            # torchtitan has no optimizer-only sharding; replicating Adam state may not fit where the plan did
            extra = max(s.memory.optimizer_gib * (p.dp * p.cp - 1) for s in e.stages)
            over = max(s.memory.total_gib + s.memory.optimizer_gib * (p.dp * p.cp - 1) - s.memory.limit_gib
                       for s in e.stages)
            notes = [f"zero_stage 1: torchtitan has no optimizer-only sharding (Megatron's distributed optimizer); "
                     f"replicated Adam state would add up to {extra:.1f} GiB per GPU"]
            if over <= 0:
                notes[0] += ", which still fits: replicated data parallelism (DDP)."
            else:
                shard = True
                notes[0] += (f" and exceed the memory limit by {over:.1f} GiB, so FSDP instead (shards optimizer "
                             "state and gradients too; parameters kept gathered between forward and backward).")
        if not shard:
            notes.append("Older torchtitan refuses replicate with tp/pp/cp ('DDP has not supported > 1D "
                         f"parallelism'): there use data_parallel_shard_degree = {p.dp} instead.")
    if p.cp > 1:
        notes.append("With context_parallel_degree > 1 torchtitan shards parameters over the cp ranks as well "
                     "(its FSDP mesh is dp_shard x cp).")
    return shard, notes
