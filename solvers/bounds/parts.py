"""The pieces of the lower bounds (solvers/bounds/configs.py): the cluster's link levels (solvers/bounds/levels.py), the
best time of a group over its possible shapes, the least slowest stage under memory caps, and `Parts`,
one configuration's stage composition at its best shapes and links (formulation/physics/stage.py encoded as numbers).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from formulation.physics import collectives, cost, layer_kinds, moe_cost, sharding
from formulation.physics.cost import GroupLinks
from formulation.physics.schedules import weight_grad_ceiling
from formulation.physics.v_schedules import V_FAMILIES, output_stage
from formulation.placement import even_split
from formulation.space import Config, partition_fits, placement_for
from formulation.physics.sharding import layer_replica_bytes, replica_messages
from formulation.physics.stage import (dp_part_exposed, dp_sync_parts, expert_dp_messages, expert_only_parts,
                                       layer_time, mixed_constants, stage_constants)

from solvers.bounds.levels import cluster_extremes, level_units, span_bandwidth
from solvers.bounds.kinds import KindBounds, dense_saving, kind_parts, kind_unit, least_optimizer_step
from solvers.bounds.slowest import least_slowest_stage

INF = float("inf")


def best_group_time(fn, size: int, intra: float, inter: float, max_nodes: int, per_node_cap: int,
                    min_nodes: int = 1, span: np.ndarray | None = None, part=None) -> float:
    """The smallest time any placement of a group of `size` can have over every shape (nodes spanned,
    fewest members per node) with at least `min_nodes` nodes, at the given links (`span[N]` caps the
    inter-node figure of a group over N nodes, see `span_bandwidth`). `part(links)`: where fn depends on k (for
    k >= 2) only through it, nondecreasing (collectives.level_part for the least option), fn is called only at
    k = 1 and at the k of least part for each N: the same minimum, found in O(log) part evaluations."""
    if size <= 1:
        return 0.0 if min_nodes <= 1 else INF
    best = INF
    for N in range(max(1, min_nodes), min(size, max_nodes) + 1):
        if N * per_node_cap < size:  # the nodes cannot hold the group
            continue
        bw = inter if span is None or N == 1 else min(inter, float(span[N]))
        if N == 1:
            shapes = [size]
        elif part is None:
            shapes = range(1, size // N + 1)
        else:
            shapes = least_part_shapes(lambda k: part(GroupLinks(size, intra, bw, N, k)), min(size // N,
                                                                                            per_node_cap))
        for k in shapes:
            if k > per_node_cap:
                continue
            best = min(best, fn(GroupLinks(size, intra, bw, N, k)))
    return best


def least_part(cluster):
    """`best_group_time`'s `part` for the least option of NCCL's model (`least=True`): its time depends on the
    fewest members per node k (k >= 2) only through the rail ring's level part, nondecreasing in it
    (formulation/physics/collectives.py `level_part`); None where that does not hold (NCCL's model or the
    concurrent levels turned off: the latency then grows with k)."""
    if not (cost.term("nccl_algorithms") and cost.levels_concurrent()):
        return None
    efficiency = cost.collective_efficiency(cluster)
    return lambda links: collectives.level_part(links, cluster, efficiency)


def least_part_shapes(part, top: int) -> list[int]:
    """k = 1 and the k in 2..top of least `part(k)` = max(a(k), b(k)), a increasing (the NVLink share
    (k - 1) / k) and b decreasing then constant (the NICs' 1 / min(k, C)): quasi-convex, so the least is at the
    first k whose successor is no smaller (top if none), found by bisection."""
    if top < 2:
        return list(range(1, top + 1))
    lo, hi = 2, top
    while lo < hi:
        mid = (lo + hi) // 2
        if part(mid + 1) >= part(mid):
            hi = mid
        else:
            lo = mid + 1
    return [1, lo]


def expert_layer_floor(instance, p, intra: float, inter: float, max_nodes: int, per_node_cap: int,
                       span: np.ndarray | None = None, ep_min_nodes: int = 1) -> float:
    """(B3) The least forward expert communication of one MoE layer any placement of `p`'s configuration can
    have: the least dispatch and combine of an ep group + the least gather and scatter of an expert-tp group,
    each over every group shape at the cluster's fastest links (`best_group_time`). The evaluator adds
    slowest ep + slowest etp per MoE layer (layer_time's `ep`), which is at least this (0 for a dense model).
    `ep_min_nodes`: only ep groups over at least that many nodes (a stage with an ep group across nodes)."""
    model, job, cluster = instance.model, instance.training, instance.cluster
    if moe_cost.moe_fraction(model) == 0:
        return 0.0
    ep = best_group_time(lambda lk: moe_cost.ep_layer_comm(model, job, p, lk, cluster), p.ep, intra, inter,
                         max_nodes, per_node_cap, ep_min_nodes, span=span)
    etp = best_group_time(lambda lk: moe_cost.etp_layer_comm(model, job, p, lk, cluster), p.etp, intra, inter,
                          max_nodes, per_node_cap, span=span)
    return ep + etp


@dataclass
class Parts(KindBounds):
    """The pieces of (B1) for one configuration, and what (B2) needs to redo them with one slow group."""

    instance: object
    config: Config
    placement: object
    gpu_type: object
    intra: float
    inter: float
    max_nodes: int
    per_node_cap: int
    caps: list[int]
    extras: list[float]
    m: int
    tp: float
    cp: float
    ag: float
    rs: float
    u: float
    c_min: float
    rounds: int
    optimizer: float
    span: np.ndarray = None  # see span_bandwidth
    ep: float = 0.0  # (B3) least forward expert communication of one layer (mixture-of-experts)
    dp_cap: int = 0  # most members of one dp group on a node (0: per_node_cap)
    edp_cap: int = 0  # most members of one expert-dp group on a node (0: per_node_cap)
    c_inter: float = 0.0  # one send over the fastest inter-node pair (c_min when that is the fastest pair)
    # dense and MoE layers (docs/moe.md (E1)): per-layer times are an MoE layer's (KindUnit), stage i's time
    # taken at dense_layers[i] x what a dense layer saves less (solvers/bounds/kinds.py); () for one kind
    dense_layers: tuple = ()
    kinds: object = None  # KindPartitions (models with both kinds): the least slowest stage by layer kind
    _constants: dict = field(default_factory=dict)
    _group_times: dict = field(default_factory=dict)

    def unit(self, tp: float, cp: float, ag: float, rs: float, ep: float | None = None) -> float:
        """One layer's time with these slowest groups: an MoE layer's, with the dense layer's saving, where the
        model has both kinds (E1)."""
        ep = self.ep if ep is None else ep
        if self.dense_layers:
            return kind_unit(self.instance, self.placement, self.gpu_type, tp, cp, ag, rs, ep)
        lt = layer_time(stage_constants(self.instance, self.placement, 0, self.gpu_type),
                        self.instance.training.tp_comm_overlap, tp, cp, ag, rs, ep)
        return lt.forward + lt.backward

    def pipeline(self, us: list[float], fixed: dict[int, int] | None = None) -> float:
        """(C9) m M + (S - M) / vpp grows with M and S: M the least slowest stage, S the least stage sum."""
        L, v = self.instance.model.num_layers, self.config.vpp
        if self.kinds is None:
            M, saved = least_slowest_stage(us, self.extras, self.caps, L, v, fixed), 0.0
        else:  # (E1) each stage's layers by kind; the model's dense layers save at most their count x the most
            M = self.kinds.least_slowest_stage(us, self.extras, fixed)
            saved = (L - self.instance.model.moe.num_moe_layers) * max(dense_saving(u) for u in us)
        u_min = min(us)
        least = {i: (fixed or {}).get(i, v) for i in range(len(us))}
        S = u_min * L + sum(self.extras) - saved + sum((us[i] - u_min) * least[i] for i in range(len(us)))
        return self.schedule(M, S)

    def schedule(self, M: float, S: float) -> float:
        """(C9) m M + (S - M) / vpp from a least slowest stage M and a least stage sum S; INF where M is."""
        if M == INF:
            return INF
        if self.config.schedule in V_FAMILIES:  # (S3): every row is at least m t_k (its other terms >= 0)
            return self.m * M
        if self.config.schedule == "zero_bubble":  # (S1): every stage off the critical one saves 2 W_j <= 2 W_total
            return self.m * M + max(0.0, max(S, M) - M - 2 * weight_grad_ceiling(self.instance, self.placement)) \
                / self.config.vpp
        return self.m * M + (max(S, M) - M) / self.config.vpp

    def pipeline_any(self, k: int, slow: float) -> float:
        """(C9) with k of the stages at `slow` per layer, wherever they sit: a lower bound that forgets which (every
        stage at the largest memory cap and no extra in the slowest stage, which only lowers M; S counts the
        extras and each slow stage's least layers). With dense and MoE layers: `KindBounds.slowest_anywhere`."""
        P, v, L = self.config.pp, self.config.vpp, self.instance.model.num_layers
        us = [max(slow, self.u)] * k + [self.u] * (P - k)
        if self.kinds is None:
            M, saved = least_slowest_stage(us, [0.0] * P, [max(self.caps)] * P, L, v), 0.0
        else:  # (E1)
            M, saved = self.slowest_anywhere(k, slow)
        S = self.u * L + sum(self.extras) - saved + (us[0] - self.u) * v * k
        return self.schedule(M, S)

    def chain(self, slow_extra: float = 0.0) -> float:
        """(C10) every boundary at the fastest pair; `slow_extra` is one boundary's excess over that."""
        P, v = self.config.pp, self.config.vpp
        if P == 1:
            return 0.0
        return self.chain_of([self.c_min] * P) + self.rounds * 2 * v * slow_extra

    def chain_of(self, sends: list[float]) -> float:
        """(C10) with one send time per boundary: sends[j] between stages j and j + 1, sends[P - 1] the wrap
        (if interleaved)."""
        P, v = self.config.pp, self.config.vpp
        wrap = sends[P - 1] if len(sends) >= P and self.config.schedule not in V_FAMILIES else 0.0
        return self.rounds * 2 * (v * sum(sends[:P - 1]) + (v - 1) * wrap) if P > 1 else 0.0

    def boundaries(self) -> list[tuple[int, int]]:
        """The stage pairs that send to each other: (j, j + 1), and (P - 1, 0) when interleaved (the wrap)."""
        P = self.config.pp
        wraps = self.config.vpp > 1 and self.config.schedule not in V_FAMILIES  # a V sends no wrap (S3)
        return [(j, j + 1) for j in range(P - 1)] + ([(P - 1, 0)] if wraps and P > 1 else [])

    def distinct_stages(self) -> list[int]:
        """One stage per kind: the first, the last, and per distinct memory cap one of the stages between (they
        differ only in their cap, through the micro-batches in flight)."""
        P = self.config.pp
        middle = {}
        for i in range(1, P - 1):
            middle.setdefault(self.caps[i], i)
        return sorted({0, P - 1, *middle.values()})

    def constants(self, stage: int):
        """The stage's constants for its dp sync (MixedConstants with dense and MoE layers: the sync is then
        bounded per layer mix)."""
        if stage not in self._constants:
            make = mixed_constants if self.kinds is not None else stage_constants  # (E1) each kind's own
            self._constants[stage] = make(self.instance, self.placement, stage, self.gpu_type)
        return self._constants[stage]

    def dp_part_times(self, stage: int, layers: int, inter: float, min_nodes: int,
                      per_node_cap: int | None = None) -> list[tuple[float, float, bool]]:
        """(C11) per collective (reduce-scatter, all-gather, or all-reduce) of `stage` holding `layers`: the
        smallest time over group shapes at these links with at most `per_node_cap` members on a node, the
        compute window that hides it, and whether it is overlapped."""
        n = self.config.dp * self.config.cp
        if self.config.zero_stage >= 3 and self.config.dp_replicate == 1:
            return []
        cap = per_node_cap or self.dp_cap or self.per_node_cap
        replicas = {}
        if self.config.dp_replicate > 1:  # a shard group (part of the dp group) and a replicate group at any place
            n, inter, min_nodes = self.config.shard_size, self.inter, 1
            replicas = replica_messages(self.instance, self.placement, self.constants(stage).stage_params(layers))
        k = self.constants(stage)
        # (B3) mixture-of-experts: the experts' gradients add the same collective over an expert-dp group, at
        # its least time over every shape (any placement: the fastest links, not the cut's)
        experts = expert_dp_messages(self.instance, self.placement, k, layers)
        parts = dp_sync_parts(self.instance, self.placement, k, layers) if n > 1 or self.config.dp_replicate > 1 else \
            expert_only_parts(self.instance, k, layers, experts)
        out = []
        for kind, message, overlapped, window in parts:
            time = self._least(kind, message, n, inter, min_nodes, cap) if message > 0 else 0.0
            if kind in experts:
                time += self._least(kind, experts[kind], self.placement.expert_dp, self.inter, 1,
                                    self.edp_cap or self.per_node_cap)
            if kind in replicas:  # the replicas' all-reduce of the gradient shard, at its least over every shape
                time += self._least("all_reduce", replicas[kind], self.config.dp_replicate, self.inter, 1,
                                    self.per_node_cap)
            out.append((time, window, overlapped))
        return out

    def _least(self, kind: str, message: float, n: int, inter: float, min_nodes: int, cap: int) -> float:
        key = (kind, message, n, inter, min_nodes, cap)
        if key not in self._group_times:
            def one(lk):  # the least option at these links: concave in the message (dp_floor)
                return cost.collective_time(kind, message, lk, self.instance.cluster, least=True)

            self._group_times[key] = best_group_time(one, n, self.intra, inter, self.max_nodes, cap, min_nodes,
                                                     self.span, least_part(self.instance.cluster))
        return self._group_times[key]

    def dp_part_exposures(self, stage: int, layers: int, inter: float, min_nodes: int,
                          per_node_cap: int | None = None) -> list[float]:
        """(C11) per collective the smallest exposed time of `stage` holding `layers` (see `dp_part_times`)."""
        return [dp_part_exposed(*part) for part in self.dp_part_times(stage, layers, inter, min_nodes, per_node_cap)]

    def dp_exposure(self, stage: int, layers: int, inter: float, min_nodes: int, per_node_cap: int | None = None
                    ) -> float:
        if self.kinds is not None:  # (E1) the least over the layer mixes of that count the stage can hold
            return self.mix_floor(stage, lambda mix: mix.total == layers, inter, min_nodes, per_node_cap)
        return sum(self.dp_part_exposures(stage, layers, inter, min_nodes, per_node_cap))

    def dp_range_floor(self, stage: int, fewest: int, most: int) -> float:
        """The least exposed dp sync of `stage` over layer counts from `fewest` to `most` (see `dp_floor`): per
        collective, its time and its time less the window are each smallest at an end of the range, and the
        exposure max(t - window, share x t, 0) is at least the larger of their least values. With dense and MoE
        layers (E1), the least over the stage's layer mixes of those counts, each exactly."""
        if self.kinds is not None:
            return self.mix_floor(stage, lambda mix: fewest <= mix.total <= most, self.inter, 1)
        num, den = cost.dp_overlap_exposed()
        total = 0.0
        for (ta, wa, overlapped), (tb, wb, _) in zip(self.dp_part_times(stage, fewest, self.inter, 1),
                                                     self.dp_part_times(stage, most, self.inter, 1)):
            total += max(num * min(ta, tb) / den, min(ta - wa, tb - wb), 0.0) if overlapped else min(ta, tb)
        return total

    def stage_dp_floor(self, stage: int) -> float:
        """The least exposed dp sync of `stage` over the layer counts memory allows (see `dp_floor`)."""
        v = self.config.vpp
        most = max(self.caps[stage], 0) // v * v
        return self.dp_range_floor(stage, v, most) if most >= v else 0.0

    def dp_floor(self) -> float:
        """delta >= E_i for every stage i, and E_i >= the sum over its collectives of each one's smallest exposure
        over the layer counts memory allows; some stage holds at least ceil(L / pp) layers (rounded up to whole
        vpp chunks), so delta is also at least the smallest such exposure over the stages that can. Each
        collective's time is the minimum over group shapes of functions affine in the message, which is affine
        in the layer count, as is the window that hides it: so the time and the time less the window (both
        concave) are smallest at the fewest or the most layers, and two evaluations bound the exposure
        (`dp_range_floor`)."""
        best = 0.0
        v, P = self.config.vpp, self.config.pp
        heavy = math.ceil(self.instance.model.num_layers / P / v) * v  # some stage holds at least this many
        loaded = INF
        for i in range(P):
            most = max(self.caps[i], 0) // v * v
            if most < v:
                continue
            best = max(best, self.stage_dp_floor(i))
            if self.kinds is not None:  # (E1) some stage holds at least the average number of MoE layers
                loaded = min(loaded, self.moe_loaded_floor(i))
            elif most >= heavy:
                loaded = min(loaded, self.dp_range_floor(i, heavy, most))
        # ... and the stage holding at least the average number of layers is one of them
        return max(best, loaded if loaded < INF else 0.0)


def shard_layer_floor(instance, p, layer_params: float, links: tuple, dp_cap: int, cap: int,
                      crossing: tuple[str, float] | None = None) -> tuple[float, float]:
    """(C12) The least per-layer gather and reduce-scatter of zero 2 and 3 (0, 0 below): in a shard group with at
    most `dp_cap` members a node, the reduce-scatter followed by the replicas' all-reduce of the layer's shard (at
    most `cap` a node); `links` = (intra, inter, max_nodes, span) as best_group_time takes them. `crossing` =
    (group, bandwidth) for (B2): that group ("shard" or "replicate") spans two nodes or more, its links across
    nodes no faster than `bandwidth` (a group across a cut); the other at its least."""
    intra, inter, max_nodes, span = links
    cluster, w_bytes, g_bytes = (instance.cluster, instance.training.bytes_per_param_state[0],
                                 instance.training.grad_reduce_bytes)

    def least(kind: str, message: float, size: int, group: str, most: int) -> float:
        across = crossing is not None and crossing[0] == group
        return best_group_time(lambda lk: cost.collective_time(kind, message, lk, cluster), size, intra,
                               crossing[1] if across else inter, max_nodes, most, 2 if across else 1, span)

    ag = rs = 0.0
    n = p.shard_size  # the evaluator's conditions (links_from_groups): a reduce once a step is not counted here
    if p.zero_stage >= 3 and n > 1:
        ag = least("all_gather", layer_params * w_bytes, n, "shard", dp_cap)
    if sharding.per_layer_reduce_scatter(p):
        rs = least("reduce_scatter", layer_params * g_bytes, n, "shard", dp_cap) if n > 1 else 0.0
        replica = layer_replica_bytes(instance, p, layer_params)  # then across replicas, at its least
        if replica:
            rs += least("all_reduce", replica, p.dp_replicate, "replicate", cap)
    return ag, rs


def stage_parts(instance, config: Config, whole_tp: bool = False, caps: list[int] | None = None,
                whole_ep: bool = False) -> Parts:
    """The pieces of (B1). `whole_tp`: under the assumption that every tp group lies inside one node (so a node
    holds whole tp groups: at most gpus-per-node / tp members of any dp or cp group, and no two pipeline stages
    when it holds a single tp group). `whole_ep` likewise for the expert-parallel groups (B3): a node holds whole
    ep groups, at most gpus-per-node / ep members of any expert-dp group (whose members lie in distinct ep
    groups), and no two pipeline stages when it cannot hold two ep groups."""
    model, job, cluster = instance.model, instance.training, instance.cluster
    p = placement_for(config, even_split(model.num_layers, config.pp), range(cluster.num_gpus))
    gpu_type = min(cluster.gpu_types.values(), key=lambda g: cost.layer_compute(model, job, p, g).forward)
    intra, inter = cluster_extremes(cluster)
    max_nodes, cap = level_units(cluster)
    first = stage_constants(instance, p, 0, gpu_type)
    out_stage = output_stage(config.schedule, config.pp)  # the output layer's rank: 0 in a V (S3)
    last = stage_constants(instance, p, out_stage, gpu_type)
    span = span_bandwidth(cluster)
    whole_tp = whole_tp and config.tp <= cap
    dp_cap = cap // config.tp if whole_tp else cap  # members of one dp (or cp) group on a node
    whole_ep = whole_ep and 1 < config.ep <= cap
    edp_cap = cap // config.ep if whole_ep else cap  # members of one expert-dp group on a node
    tp = best_group_time(lambda lk: cost.tp_layer_comm(model, job, p, lk, cluster), config.tp, intra, inter,
                         1 if whole_tp else max_nodes, cap, span=span)
    cp = 0.0
    if config.cp > 1:
        best_bw = max(intra, inter) if intra != INF else inter
        if whole_tp and config.cp > dp_cap:  # the ring cannot fit on one node
            cp = cost.cp_layer_comm(model, job, p, min(intra, inter), False, cluster)
        else:
            cp = cost.cp_layer_comm(model, job, p, best_bw, config.cp <= cap, cluster)
    ag, rs = shard_layer_floor(instance, p, first.layer_params, (intra, inter, max_nodes, span), dp_cap, cap)
    ep = expert_layer_floor(instance, p, intra, inter, max_nodes, cap, span)
    lt = layer_time(first, job.tp_comm_overlap, tp, cp, ag, rs, ep)
    mixed = layer_kinds.is_mixed(model)  # (E1) an MoE layer's time, with what a dense layer saves against it
    u = kind_unit(instance, p, gpu_type, tp, cp, ag, rs, ep) if mixed else lt.forward + lt.backward
    dense_layers, kinds = kind_parts(instance, p)
    P, v = config.pp, config.vpp
    m = job.global_batch_size // (config.micro_batch_size * config.dp)
    if caps is None:
        caps = partition_fits(instance, config, max(cluster.gpu_types.values(), key=lambda g: g.memory_gib))[1]
    c_min, c_inter, rounds = 0.0, 0.0, 0
    if P > 1:
        sp = job.sequence_parallel_size(config.tp)
        message = cost.activation_message_bytes(model, job, p) / sp
        c_inter = cost.p2p_time(message, inter, False, cluster) if inter != INF else INF
        if whole_tp and dp_cap < 2 or whole_ep and edp_cap < 2 or intra == INF:  # one tp (ep) group a node
            c_min = c_inter
        else:  # the faster of an intra-node and an inter-node send, each with its own latency
            c_min = min(c_inter, cost.p2p_time(message, intra, True, cluster))
        rounds = math.ceil(m / P) if v == 1 else 1
    return Parts(instance=instance, config=config, placement=p, gpu_type=gpu_type, intra=intra, inter=inter,
                  max_nodes=max_nodes, per_node_cap=cap, caps=caps, extras=[3 * last.output_fwd if i == out_stage else 0.0 for i in range(P)],
                  m=m, tp=tp, cp=cp, ag=ag, rs=rs, u=u, c_min=c_min, rounds=rounds,
                  optimizer=least_optimizer_step(instance, p, gpu_type), span=span, dp_cap=dp_cap, c_inter=c_inter,
                  ep=ep, edp_cap=edp_cap, dense_layers=dense_layers, kinds=kinds)
