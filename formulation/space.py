"""The discrete configuration space: parallel sizes, micro-batch, interleaving, recompute and sharding."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Iterator

from formulation.physics import layer_kinds, moe_overlap, v_schedules
from formulation.physics.schedules import allowed_families
from formulation.physics.memory import memory_coefficients, stage_memory
from formulation.inputs.frameworks import config_problem
from formulation.inputs.job import DATA_PARALLEL_ONLY
from formulation.placement import Config, Placement


def divisors(n: int) -> list[int]:
    """In increasing order, in O(sqrt n): batch sizes can be large."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def configurations(instance, world_size: int | None = None) -> Iterator[Config]:
    """Every configuration Megatron-LM can run on `world_size` GPUs (default: the whole cluster).

    tp within one node or NVLink domain (and at most `max_tensor_parallel_size`), dividing the query and kv heads;
    pp at most the layer count; cp from the allowed sizes, dividing the sequence; dp fills the world;
    micro-batch sizes dividing the per-replica batch; vpp > 1 only with pp > 1, m divisible by pp and
    the layers divisible into whole chunks of vpp per stage; recompute and zero_stage from the allowed choices.
    A data-parallel-only stack (llm-foundry) gets tp = pp = cp = 1. A job planned for a framework
    (`training.framework`) gets only the configurations it runs (formulation/inputs/frameworks.py).
    """
    model, job, cluster = instance.model, instance.training, instance.cluster
    world = world_size or cluster.num_gpus
    gpus_per_node = int(cluster.domain_gpus.min())  # a node's GPUs, or an NVLink domain's where declared
    max_tp = min(gpus_per_node, job.max_tensor_parallel_size or gpus_per_node)
    fsdp_only = job.software_stack in DATA_PARALLEL_ONLY  # llm-foundry: tp = pp = cp = 1
    for tp in divisors(world):
        if fsdp_only and tp > 1:
            break
        if tp > max_tp or model.num_attention_heads % tp or model.num_kv_heads % tp:
            continue
        for cp in job.context_parallel_sizes:
            if (world // tp) % cp or job.seq_length % cp or (fsdp_only and cp > 1):
                continue
            for pp in divisors(world // (tp * cp)):
                if pp > model.num_layers or (fsdp_only and pp > 1):
                    continue
                yield from schedules(instance, tp, pp, cp, world // (tp * cp * pp))


def schedules(instance, tp: int, pp: int, cp: int, dp: int) -> Iterator[Config]:
    """Every configuration with these parallel sizes: dp dividing the batch, micro-batch sizes dividing the
    per-replica batch, vpp > 1 only with pp > 1, m divisible by pp and the layers divisible into whole chunks
    of vpp per stage; recompute and zero_stage from the allowed choices; the pipeline schedule families of
    `training.pipeline_schedules` at that vpp (docs/schedules.md); those the job's framework runs."""
    model, job = instance.model, instance.training
    if job.global_batch_size % dp:
        return
    # a micro-batch divides the replica's batch: enumerate its divisors, not every size up to the limit
    for mbs in divisors(job.global_batch_size // dp):
        if mbs > job.max_micro_batch_size:
            break
        m = job.global_batch_size // (mbs * dp)
        for vpp in job.virtual_pipeline_sizes:
            # interleaving: some partition into whole chunks of vpp layers per stage must exist
            if vpp > 1 and (pp == 1 or m % pp or model.num_layers % vpp or model.num_layers // vpp < pp):
                continue
            # the schedule families the job allows at this vpp (1F1B alone without pipeline parallelism)
            families = allowed_families(job.pipeline_schedules, vpp) if pp > 1 else ["1f1b"]
            # (S3): m >= 2 pp, one layer kind, one GPU type on the cluster's nodes (the bounds of clusters of
            # several types, (B5), do not encode the V's chain and output layer); a type declared but on no node
            # (a re-plan's survivors) does not count
            if m < v_schedules.min_micro_batches(pp) or layer_kinds.is_mixed(model) or \
                    len(node_gpu_types(instance.cluster)) > 1:
                families = [f for f in families if f not in v_schedules.V_FAMILIES]
            for recompute in job.recompute:
                for zero in job.zero_stage:
                    if zero >= 2 and model.moe is not None:  # Megatron-Core shards experts with its
                        continue  # distributed optimizer (zero 1), not ZeRO-2/3
                    for ep, etp in expert_sizes(instance, tp * cp * dp):
                        for family in families:
                            for r, reshard in sharding_choices(instance, dp, cp, zero):
                                config = Config(tp, pp, cp, dp, vpp, mbs, recompute, zero, ep=ep, etp=etp,
                                                schedule=family, dp_replicate=r, reshard_after_forward=reshard)
                                if not config_problem(job.framework, job.seq_length, config):  # the framework runs it
                                    yield from overlap_choices(instance, config)


def node_gpu_types(cluster) -> set[str]:
    """The GPU types the cluster's nodes hold (`cluster.gpu_types` may declare more)."""
    return {n.gpu_type for n in cluster.nodes if n.num_gpus}


def overlap_choices(instance, config: Config) -> Iterator[Config]:
    """`config` without and (where the job allows it and Megatron-Core runs it) with the MoE all-to-all overlap
    (docs/moe.md (E10))."""
    job = instance.training
    if False in job.moe_a2a_overlap or instance.model.moe is None:
        yield config
    if True in job.moe_a2a_overlap and not moe_overlap.problem(instance.model, job, config):
        yield replace(config, moe_a2a_overlap=True)


def sharding_choices(instance, dp: int, cp: int, zero: int) -> list[tuple[int, bool]]:
    """(dp_replicate, reshard_after_forward) pairs of a configuration: replicas from the job's
    `dp_replicate_sizes` (0: every divisor of dp) dividing dp, only with sharded states (zero >= 1) of a dense
    model; reshard_after_forward from the job's choices with zero 3, else True. Default: (1, True) alone."""
    job = instance.training
    sizes = divisors(dp) if 0 in job.dp_replicate_sizes else [r for r in job.dp_replicate_sizes if dp % r == 0]
    if zero == 0 or instance.model.moe is not None:
        sizes = [1]
    reshard = job.reshard_after_forward if zero == 3 else (True,)
    return [(r, keep) for r in sizes for keep in reshard]


def expert_sizes(instance, ranks: int) -> list[tuple[int, int]]:
    """(ep, etp) pairs Megatron-Core accepts on a stage of `ranks` = tp x cp x dp ranks (docs/moe.md): ep divides
    the experts, etp the expert FFN width, ep x etp the ranks; restricted to the job's allowed sizes. Dense: (1, 1)."""
    moe, job = instance.model.moe, instance.training
    if moe is None:
        return [(1, 1)]
    out = []
    for etp in job.expert_tensor_parallel_sizes:
        if ranks % etp or moe.expert_ffn_hidden_size % etp:
            continue
        for ep in divisors(ranks // etp):
            if moe.num_experts % ep == 0 and (not job.expert_parallel_sizes or ep in job.expert_parallel_sizes):
                out.append((ep, etp))
    return out


def placement_for(config: Config, layers_per_stage, gpus) -> Placement:
    return Placement.of(config, layers_per_stage, gpus)


def layer_capacity(instance, placement: Placement, stage: int, gpu_type) -> int:
    """The most layers `stage` can hold within its memory limit. Memory is affine in the layer count (M1)-(M7):
    the capacity is read off the line and confirmed with the memory model at the boundary (float rounding)."""
    L = instance.model.num_layers
    c = memory_coefficients(instance, placement, stage)
    if layer_kinds.is_mixed(instance.model):
        return _mixed_capacity(instance, placement, stage, gpu_type, c)

    def fits(q: int) -> bool:
        return stage_memory(instance, placement, stage, q, gpu_type, c).fits

    empty = stage_memory(instance, placement, stage, 0, gpu_type, c)
    if not empty.fits:
        return -1
    slope = stage_memory(instance, placement, stage, 1, gpu_type, c).total_gib - empty.total_gib
    q = L if slope <= 0 else max(0, min(L, int((empty.limit_gib - empty.total_gib) / slope)))
    while q < L and fits(q + 1):
        q += 1
    while q > 0 and not fits(q):
        q -= 1
    return q


def _mixed_capacity(instance, placement: Placement, stage: int, gpu_type, c) -> int:
    """`layer_capacity` of a model with dense and MoE layers (docs/moe.md (E1)): the most layers of any range
    stage i can hold that fits. Memory is affine in (n_d, n_m) and grows with the range, so a count l fits iff
    it fits with the fewest or the most dense layers a range of l layers can have (binary search over l)."""
    extremes = layer_kinds.dense_extremes(instance.model, placement.pp, placement.vpp, stage)

    def fits(q: int) -> bool:
        return any(stage_memory(instance, placement, stage, q, gpu_type, c, dense_layers=d).fits
                   for d in set(extremes[q]))

    if not stage_memory(instance, placement, stage, 0, gpu_type, c).fits:
        return -1
    counts = sorted(extremes)
    lo, hi = 0, len(counts)  # counts[:lo] fit
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(counts[mid]):
            lo = mid + 1
        else:
            hi = mid
    return counts[lo - 1] if lo else 0


def partition_fits(instance, config: Config, gpu_type) -> tuple[bool, list[int]]:
    """Whether some layer partition fits: every stage can hold vpp layers and together they hold all."""
    p = placement_for(config, (1,) * config.pp, range(config.tp * config.pp * config.cp * config.dp))
    caps = [layer_capacity(instance, p, i, gpu_type) for i in range(config.pp)]
    return all(c >= config.vpp for c in caps) and sum(caps) >= instance.model.num_layers, caps


def memory_feasible(instance, placement: Placement) -> tuple[bool, float, int]:
    """Cheap memory check on the smallest GPU type of the cluster: (fits, worst excess GiB, worst stage); each
    stage with its own dense layers where the model has both kinds (docs/moe.md (E1))."""
    types = sorted(instance.cluster.gpu_types.values(), key=lambda g: g.memory_gib)
    gpu_type = types[0]
    worst, worst_stage = -float("inf"), 0
    mixed = layer_kinds.is_mixed(instance.model)
    mixes = layer_kinds.stage_mixes(instance.model, placement.layers_per_stage, placement.vpp) if mixed else None
    for i, layers in enumerate(placement.layers_per_stage):
        mem = stage_memory(instance, placement, i, layers, gpu_type, dense_layers=mixes[i].dense if mixed else 0)
        if mem.total_gib - mem.limit_gib > worst:
            worst, worst_stage = mem.total_gib - mem.limit_gib, i
    return worst <= 0, worst, worst_stage
