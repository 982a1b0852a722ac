"""A stage's links: what its GPUs and groups decide about its time, independent of its layer count (StageLinks),
and the pieces the evaluator, the fast scorer and the composition program share to price them: the slowest tp /
cp / ZeRO-3 / expert groups of a stage (C6), (C8), (C12), (E7), its dp and replicate groups' links, and one
pipeline send (C10). Split from formulation/evaluate.py, which scores whole placements with them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from formulation.physics import cost, layer_kinds, moe_cost, sharding
from formulation.physics.stage import layer_time, mixed_constants, stage_constants
from formulation.placement import Placement


def type_pace(model, job, p, gpu_type) -> float:
    """The key by which a stage runs at its slowest GPU type: one layer's forward compute on it (the bounds over
    several GPU types order the types by this same key, solvers/bounds/every_placement.py)."""
    return moe_cost.layer_compute(model, job, p, gpu_type).forward


def slowest_type(cluster, gpus: np.ndarray, model, job, p):
    types = {cluster.nodes[n].gpu_type for n in np.unique(cluster.gpu_node[gpus])}
    return max((cluster.gpu_types[t] for t in sorted(types)), key=lambda g: type_pace(model, job, p, g))


def _max_group(cluster, groups: np.ndarray, fn) -> float:
    """The largest `fn(links)` over the groups' links (cost.group_links), each distinct links costed once: a
    group's time depends on its GPUs only through them, and the groups of a large cluster share a few (the 1,152
    tp groups of a 4,608-GPU default map, one or two)."""
    n = np.shape(groups)[1] if np.ndim(groups) == 2 else 0
    return max((fn(cost.GroupLinks(n, *links)) for links in cluster.distinct_group_links(groups)), default=0.0)


@dataclass(frozen=True)
class StageLinks:
    """What a stage's GPUs decide about its time, independent of its layer count: the GPU type it runs at,
    its constants and one layer's time with its slowest tp / cp / ZeRO-3 groups, its dp groups' links, and
    its GPUs (their types decide its memory). A model with dense and MoE layers (docs/moe.md (E1)) has
    MixedConstants, `layer` its MoE layer's time and `dense_layer` its dense layer's."""

    gpu_type: object
    constants: object  # StageConstants, or MixedConstants for a model with both layer kinds
    layer: object  # LayerTime
    dp_links: tuple
    gpus: object = None  # np.ndarray of GPU indices
    edp_links: tuple = ()  # expert-data-parallel groups' links (mixture-of-experts)
    rep_links: tuple = ()  # replicate groups' links (dp_replicate > 1; dp_links are then the shard groups')
    dense_layer: object = None  # LayerTime of a dense layer (models with both layer kinds only)


def _distinct_links(cluster, groups: np.ndarray) -> tuple:
    """The distinct links (cost.GroupLinks) of a stage's groups, each once (every use takes the slowest), memoised
    by the groups: the 128 shard groups of a 1,024-GPU stage share a few, and many configurations share them all."""
    n = np.shape(groups)[1]
    return tuple(cost.GroupLinks(n, *links) for links in sorted(cluster.distinct_group_links(groups)))


def stage_links(instance, p: Placement, i: int) -> StageLinks:
    """(C6), (C8), (C12) for stage i of `p` (its GPUs are p.grid[i]); the layer count does not enter."""
    cluster = instance.cluster
    # (C6) slowest tp group, (C8) slowest cp ring, (C12) ZeRO-3 gathers of the slowest dp group
    tp = _max_group(cluster, p.tp_groups(i), lambda lk: group_comm(instance, p, "tp", lk)) if p.tp > 1 else 0.0
    cp = _max_group(cluster, p.cp_groups(i), lambda lk: group_comm(instance, p, "cp", lk)) if p.cp > 1 else 0.0
    dp_links = _distinct_links(cluster, p.shard_groups(i)) if p.shard_size > 1 else ()
    if not moe_cost.is_moe(instance.model):
        rep = _distinct_links(cluster, p.replicate_groups(i)) if p.dp_replicate > 1 else ()
        return links_from_groups(instance, p, i, p.stage_gpus(i), tp, cp, dp_links, rep_links=rep)
    # (E7) slowest expert-parallel group's dispatch and combine, slowest expert-tp group's gather and scatter
    ep = _max_group(cluster, p.moe_ep_groups(i), lambda lk: group_comm(instance, p, "ep", lk)) if p.ep > 1 else 0.0
    etp = _max_group(cluster, p.expert_tp_groups(i, p.ep, p.etp), lambda lk: group_comm(instance, p, "etp", lk)) if p.etp > 1 else 0.0
    edp = tuple(cost.group_links(cluster, g) for g in p.moe_expert_dp_groups(i)) if p.expert_dp > 1 else ()
    return links_from_groups(instance, p, i, p.stage_gpus(i), tp, cp, dp_links, ep + etp, edp)


def group_comm(instance, p: Placement, kind: str, links) -> float:
    """Forward communication per layer of one tp group (C6) or cp ring (C8, its slowest pair of either level)
    with these links (cost.group_links of its GPUs)."""
    model, job, cluster = instance.model, instance.training, instance.cluster
    if kind == "tp":
        return cost.tp_layer_comm(model, job, p, links, cluster)
    if kind == "ep":  # (E7) one MoE layer's dispatch and combine
        return moe_cost.ep_layer_comm(model, job, p, links, cluster)
    if kind == "etp":
        return moe_cost.etp_layer_comm(model, job, p, links, cluster)
    return cost.cp_layer_comm(model, job, p, min(links.intra_gb_per_s, links.inter_gb_per_s), links.nodes == 1,
                              cluster)


def pipeline_message(instance, p: Placement) -> float:
    """Bytes one pipeline send carries (a micro-batch's activations, split by tp under sequence parallelism)."""
    sp = instance.training.sequence_parallel_size(p.tp)
    return cost.activation_message_bytes(instance.model, instance.training, p) / sp


def pipeline_send(cluster, message: float, src: int, dst: int) -> float:
    """(C10) One send of `message` bytes from GPU src to GPU dst."""
    return cost.p2p_time(message, cluster.bandwidth(int(src), int(dst)), cluster.gpu_domain[src] == cluster.gpu_domain[dst],
                         cluster)


def links_from_groups(instance, p: Placement, i: int, gpus, tp: float, cp: float, dp_links: tuple,
                      moe_layer: float = 0.0, edp_links: tuple = (), rep_links: tuple = ()) -> StageLinks:
    """Stage i from what its groups measure: the forward communication of its slowest tp group and cp ring
    and the links of its dp groups (its shard groups, and `rep_links` its replicate groups', with dp_replicate >
    1); `gpus` are its GPUs (any GPUs of the same GPU types give the same).
    Mixture-of-experts: `moe_layer` the forward communication of one MoE layer over its slowest expert-parallel
    and expert-tp groups (a dense layer of a model with both kinds has none, (E1)), `edp_links` the
    expert-data-parallel groups' links."""
    model, job, cluster = instance.model, instance.training, instance.cluster
    gpu_type = slowest_type(cluster, gpus, model, job, p)
    if layer_kinds.is_mixed(model):  # (E1) ZeRO-3 is refused with experts: no per-layer gathers
        kk = mixed_constants(instance, p, i, gpu_type)
        return StageLinks(gpu_type, kk, layer_time(kk.moe, job.tp_comm_overlap, tp, cp, 0.0, 0.0, moe_layer),
                          dp_links, gpus, edp_links,
                          dense_layer=layer_time(kk.dense, job.tp_comm_overlap, tp, cp, 0.0, 0.0))
    k = stage_constants(instance, p, i, gpu_type)
    w_bytes, g_bytes = job.bytes_per_param_state[0], job.grad_reduce_bytes
    ag = rs = 0.0
    if p.zero_stage >= 3 and dp_links:
        ag = max(cost.collective_time("all_gather", k.layer_params * w_bytes, lk, cluster) for lk in dp_links)
    if sharding.per_layer_reduce_scatter(p) and dp_links:  # zero 2 and 3 (C12)
        rs = max(cost.collective_time("reduce_scatter", k.layer_params * g_bytes, lk, cluster) for lk in dp_links)
    replica = sharding.layer_replica_bytes(instance, p, k.layer_params) if rep_links else 0.0
    if replica:  # zero 2 and 3: then the layer's shard all-reduced across replicas (not Megatron-FSDP's, (C11))
        rs += max(cost.collective_time("all_reduce", replica, lk, cluster) for lk in rep_links)
    ep = moe_cost.moe_fraction(model) * moe_layer  # 1 or 0: a model of one kind
    return StageLinks(gpu_type, k, layer_time(k, job.tp_comm_overlap, tp, cp, ag, rs, ep), dp_links, gpus, edp_links,
                      rep_links=rep_links)


def replica_time(cluster, rep_links: tuple):
    """(C11) The slowest replicate group's all-reduce of a message, or None without replicas."""
    if not rep_links:
        return None
    return lambda message: max(cost.collective_time("all_reduce", message, lk, cluster) for lk in rep_links)
