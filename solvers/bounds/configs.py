"""Lower bounds on a configuration's iteration time, valid for every layer partition and every GPU map.

(B1) `fast_bound`: the stage composition of formulation/physics/stage.py with every group at its best shape over
the fastest links anywhere in the cluster.

(B2) `cut_bound`: every GPU of the cluster holds a rank, and the tp, cp and dp groups together with the
pipeline's stage-to-stage pairs connect all ranks. So for any cut of the nodes into two sides, some group
(or some pipeline pair) has members on both sides, and its slowest inter-node pair is no faster than the
fastest link across the cut. The strongest such cut is found from a maximum spanning tree of the node graph
(edge = fastest GPU pair between two nodes): removing its weakest edge splits the nodes so that no link
across is faster than that edge. The bound is the smallest over which group crosses (tp, cp, dp or a pipeline
boundary) and which stage holds it of (B1) with that one group forced across the cut; for dp the stage's
layer count is chosen jointly with the pipeline (fewer layers shrink the gradient message but load the other
stages). On h100_128 this is what makes the node with the half-speed NIC count.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from formulation.physics import cost
from formulation.physics.stage import stage_constants
from formulation.space import Config

from solvers.bounds.levels import level_units, weakest_cuts
from solvers.bounds.parts import INF, Parts, best_group_time, expert_layer_floor, shard_layer_floor, stage_parts


def _chain_split(w: Parts, b: Parts, us: list[float], split: set, floor: float, fixed: float,
                 exact: bool = True) -> float:
    """(B1) for stage times `us` when every stage outside `split` keeps its tp
    groups inside nodes (`w` = `stage_parts(whole_tp=True)`, `b` the unrestricted parts, `floor` a floor of the dp
    exposure), with a split on the chain: either no boundary between two such stages has all its pairs inside
    nodes, and each of those sends crosses nodes (c_inter), or some boundary (j, j') does. Its pairs are a
    bijection between the two stages' ranks, so every node then holds as many ranks of j as of j', at most
    cap // 2 of each, in whole tp groups: at most cap // 2 // tp members of any dp group of j or j' on a node.
    Either stage's dp exposure at that width is then taken jointly with its layer count in the pipeline (few
    layers expose little but load the others).

    The boundaries touching `split` send at the fastest pair. `exact`: `split` is where those stages sit;
    otherwise it stands for any stages of the same kinds (`_kind`), and the bound holds wherever they sit: as
    many boundaries as they could touch, the regular ones (weight vpp) before the wrap (vpp - 1), and an
    intra-node boundary elsewhere is bounded by one of its stages."""
    config = w.config
    P, v = config.pp, config.vpp
    pairs = w.boundaries()

    def sends(c: float) -> list[float]:
        if exact:
            return [b.c_min if split & set(pair) else c for pair in pairs]
        touching = min(len(pairs), sum(sum(t in pair for pair in pairs) for t in split))
        return [b.c_min] * touching + [c] * (len(pairs) - touching)

    pipe = w.pipeline(us)
    near = pipe + w.chain_of(sends(w.c_min)) + floor + fixed
    pair_cap = w.per_node_cap // 2 // config.tp
    if P == 1 or w.c_inter <= w.c_min or pair_cap < 1 or pipe == INF:  # (c_min = c_inter: one tp group a node)
        return near
    apart = pipe + w.chain_of(sends(w.c_inter)) + floor + fixed
    narrow: dict = {}

    def paired(t: int) -> float:
        # middle stages differ only in their cap and time
        key = t if t in (0, P - 1) or t in split else ("middle", w.caps[t], us[t])
        if key not in narrow:
            narrow[key] = min((w.pipeline(us, {t: q}) + max(floor, w.dp_exposure(t, q, w.inter, 1, pair_cap))
                               for q in range(v, max(w.caps[t], 0) + 1, v)), default=INF)
        return narrow[key]

    if exact:
        together = min((max(paired(j), paired(k)) for j, k in pairs if not split & {j, k}), default=INF)
    else:
        together = min((paired(t) for t in range(P) if t not in split), default=INF)
    return max(near, min(apart, together + w.chain_of(sends(w.c_min)) + fixed))


def _kind(parts: Parts, stage: int):
    """Stages of one kind are interchangeable in the bounds: the first, the last, and middle ones by cap."""
    return stage if stage in (0, parts.config.pp - 1) else ("middle", parts.caps[stage])


def _split_tp_bound(b: Parts, w: Parts, u_split: float, fixed: float) -> float:
    """(B1) case (ii), some tp group across nodes: the set S of stages with one is not empty, and each runs at
    `u_split` per layer. S = {s}: every other stage keeps its tp groups inside nodes, so its dp groups are
    narrow (`w`) and `_chain_split` applies to the boundaries between them; some stage h holds at least the
    average layer count, either h = s (which then holds that many) or another stage, whose narrow dp exposure at
    that many layers counts. S = {s, s'} likewise (without h). |S| >= 3: the pipeline with three slow stages.
    Pairs and triples range over kinds of stages (`_kind`); beyond 12 kinds, |S| >= 2 is bounded by pairs'
    pipelines alone."""
    config = b.config
    P, v = config.pp, config.vpp
    base = b.dp_floor()
    rest = b.chain() + base + fixed
    floors = [w.stage_dp_floor(i) for i in range(P)]
    heavy = math.ceil(b.instance.model.num_layers / P / v) * v
    loaded = _loaded_exposures(w, P, v, heavy)
    representative: dict = {}
    for i in range(P):
        representative.setdefault(_kind(b, i), []).append(i)

    def slow(S) -> list[float]:
        return [u_split if i in S else w.u for i in range(P)]

    best = INF
    for members in representative.values():
        s = members[0]
        others = [i for i in range(P) if i != s]
        delta = max([base] + [floors[i] for i in others])
        h_other = min((loaded[i] for i in others), default=INF)
        if h_other < INF:
            best = min(best, _chain_split(w, b, slow({s}), {s}, max(delta, h_other), fixed, len(members) == 1))
        # s touches the same boundaries (of the same weights) wherever a stage of its kind sits
        near = w.chain_of([b.c_min if s in pair else w.c_min for pair in w.boundaries()]) + delta + fixed
        for q in range(heavy, max(b.caps[s], 0) // v * v + 1, v):
            best = min(best, w.pipeline(slow({s}), {s: q}) + near)
    kinds = list(representative)
    best = min(best, _several_slow_stages(b, representative, u_split, rest))
    if len(kinds) > 12:
        return best
    for k1, k2 in itertools.combinations_with_replacement(range(len(kinds)), 2):
        if k1 == k2 and len(representative[kinds[k1]]) < 2:
            continue
        S = {representative[kinds[k1]][0], representative[kinds[k2]][-1]}
        delta = max([base] + [floors[i] for i in range(P) if i not in S])
        alone = all(len(representative[_kind(b, i)]) == 1 for i in S)
        best = min(best, _chain_split(w, b, slow(S), S, delta, fixed, alone))
    return best


def _loaded_exposures(w: Parts, P: int, v: int, heavy: int) -> list[float]:
    """Stage i's least narrow dp exposure when it holds at least `heavy` layers (INF where it cannot)."""
    loaded = [INF] * P
    for i in range(P):
        most = max(w.caps[i], 0) // v * v
        if most >= heavy:
            loaded[i] = w.dp_range_floor(i, heavy, most)
    return loaded


def _several_slow_stages(b: Parts, representative: dict, u_split: float, rest: float) -> float:
    """(B1) case (ii) with |S| >= 3, by kinds of stages: the pipeline with three slow stages. Beyond 12 kinds,
    |S| >= 2 by pairs' pipelines alone (the caller then skips the pairs' chain refinement)."""
    P, kinds, best = b.config.pp, list(representative), INF

    def pipeline_with(S) -> float:
        return b.pipeline([u_split if i in S else b.u for i in range(P)]) + rest

    if len(kinds) > 12:
        for s in (m[0] for m in representative.values()):
            for s2 in (m[0] if m[0] != s else (m[1] if len(m) > 1 else None) for m in representative.values()):
                if s2 is not None:
                    best = min(best, pipeline_with((s, s2)))
        return best
    for combo in itertools.combinations_with_replacement(range(len(kinds)), 3):
        S = set()
        for k in set(combo):
            pool = representative[kinds[k]]
            if combo.count(k) > len(pool):
                break
            S.update(pool[:combo.count(k)])
        else:
            best = min(best, pipeline_with(S))
    return best


def fast_bound(instance, config: Config, caps: list[int] | None = None, refined: bool = False) -> float:
    """(B1) pipeline + chain + dp sync + optimizer + overhead, each at its best over partitions and maps: the
    smaller of (i) every tp group inside a node (`stage_parts(whole_tp=True)`) and (ii) some tp group across nodes,
    whose stage then runs at that tp group's time (everything else at its unrestricted best). With experts, the
    larger of that and the same split on the ep groups (`_expert_split`).

    `refined` (part of (B2), costlier): (i) with the chain split of `_chain_split`, and (ii) by how many stages
    have a tp group across nodes (`_split_tp_bound`)."""
    return max(tp_split_bound(instance, config, caps, refined), _expert_split(instance, config, caps, refined))


def _expert_split(instance, config: Config, caps: list[int] | None, refined: bool) -> float:
    """(B3) A case split on the expert-parallel groups, each case bounded from below: (i) every ep group lies
    inside a node, so a node holds whole ep groups: at most cap // ep members of an expert-dp group (its members
    lie in distinct ep groups) and, when cap < 2 ep, the ranks of one stage only, so every stage-to-stage send
    crosses nodes (`tp_split_bound` on `stage_parts(whole_ep=True)`); (ii) the set S of stages with an ep group across
    nodes is not empty: each runs no faster than the least ep time over shapes of two or more nodes, on every
    layer, and every other stage keeps its ep groups inside nodes, so (i) holds for it: by |S| = k, the
    pipeline with k slow stages anywhere (`_pipeline_any`), at most 2k boundaries touching S at the fastest
    pair and the others as in (i), and a dp exposure at least the (k + 1)-th largest of the stages' narrow
    floors (some stage outside S has one at least that large); and some stage h holds at least ceil(L / pp)
    layers: h in S (the slowest stage then takes at least m x that many slow layers) or h outside S (its
    narrow exposure at that many layers counts). -INF where there is nothing to split."""
    nodes, cap = level_units(instance.cluster)
    if config.ep <= 1 or nodes == 1:
        return -INF
    inside = tp_split_bound(instance, config, caps, refined, whole_ep=True) if config.ep <= cap else INF
    b = stage_parts(instance, config, caps=caps)
    w = stage_parts(instance, config, caps=b.caps, whole_ep=True)
    slow = b.unit(b.tp, b.cp, b.ag, b.rs, expert_layer_floor(instance, b.placement, b.intra, b.inter, b.max_nodes,
                                                             b.per_node_cap, b.span, ep_min_nodes=2))
    P, pairs = config.pp, len(b.boundaries())
    floors = sorted((w.stage_dp_floor(i) for i in range(P)), reverse=True) if config.ep <= cap else [0.0] * P
    base, fixed = b.dp_floor(), b.optimizer + b.gpu_type.iteration_overhead_s
    heavy = math.ceil(instance.model.num_layers / P / config.vpp) * config.vpp
    loaded = min(_loaded_exposures(w, P, config.vpp, heavy)) if config.ep <= cap else 0.0
    if b.kinds is not None:  # (E1) h: a stage with at least the average number of MoE layers, each >= slow
        heavy = math.ceil(instance.model.moe.num_moe_layers / P)
        loaded = min(w.moe_loaded_floor(i) for i in range(P)) if config.ep <= cap else 0.0
    across = INF
    for k in range(1, P + 1):
        touching = min(pairs, 2 * k)
        rest = w.chain_of([b.c_min] * touching + [w.c_min] * (pairs - touching)) + fixed
        pipe, dp = b.pipeline_any(k, slow), max(base, floors[k] if k < P else 0.0)
        across = min(across, pipe + rest + max(dp, loaded), max(pipe, b.m * heavy * slow) + rest + dp)
    return min(inside, across)


def tp_split_bound(instance, config: Config, caps: list[int] | None, refined: bool, whole_ep: bool = False) -> float:
    """`fast_bound`'s split on the tp groups; `whole_ep`: over the placements whose ep groups lie inside nodes."""
    b = stage_parts(instance, config, caps=caps, whole_ep=whole_ep)
    fixed = b.optimizer + b.gpu_type.iteration_overhead_s
    rest = b.chain() + b.dp_floor() + fixed
    P = config.pp
    if config.tp > b.per_node_cap or b.max_nodes == 1:
        return b.pipeline([b.u] * P) + rest  # (ii) is certain, or there are no nodes to span: (B1) as is
    if config.tp == 1:  # (i) is certain
        return _chain_split(b, b, [b.u] * P, set(), b.dp_floor(), fixed) if refined else b.pipeline([b.u] * P) + rest
    whole = stage_parts(instance, config, whole_tp=True, caps=b.caps, whole_ep=whole_ep)
    model, job, p, cluster = instance.model, instance.training, b.placement, instance.cluster
    split = best_group_time(lambda lk: cost.tp_layer_comm(model, job, p, lk, cluster), config.tp, b.intra, b.inter,
                            b.max_nodes, b.per_node_cap, 2, b.span)
    u_split = b.unit(split, b.cp, b.ag, b.rs)
    stages = b.distinct_stages()
    if refined:
        within = _chain_split(whole, b, [whole.u] * P, set(), whole.dp_floor(), fixed)
        across = _split_tp_bound(b, whole, u_split, fixed)
    else:
        within = whole.pipeline([whole.u] * P) + whole.chain() + whole.dp_floor() + fixed
        across = INF
        for s in stages:
            us = [b.u] * P
            us[s] = u_split
            across = min(across, b.pipeline(us) + rest)
    # Second split of the same space, on a stage h holding at least the average layer count (one exists):
    # its tp groups inside nodes, so its dp groups narrow (A), or one across nodes, so h runs slow with at
    # least that many layers (B). The bound is the larger of the two splits' minima.
    v = config.vpp
    heavy = math.ceil(instance.model.num_layers / config.pp / v) * v
    loaded = INF
    for i in range(config.pp):
        most = max(b.caps[i], 0) // v * v
        if most >= heavy:
            loaded = min(loaded, whole.dp_range_floor(i, heavy, most))
    narrow_h = b.pipeline([b.u] * config.pp) + b.chain() + max(b.dp_floor(), loaded) + fixed
    first = min(within, across)
    slow_h = INF
    for s in stages:
        us = [b.u] * config.pp
        us[s] = u_split
        for q in range(heavy, max(b.caps[s], 0) // v * v + 1, v):
            if min(narrow_h, slow_h) <= first:  # the second split can no longer raise the bound: it is `first`
                return first
            slow_h = min(slow_h, b.pipeline(us, {s: q}) + rest)
    return max(first, min(narrow_h, slow_h))


def cut_bound(instance, config: Config) -> float:
    """(B2) the largest over the weakest cuts of `cut_bound_at`; (B1) for a single node."""
    base = fast_bound(instance, config, refined=True)
    world = instance.cluster.num_gpus
    cuts = weakest_cuts(instance.cluster)
    parts = stage_parts(instance, config) if cuts else None
    return max([base] + [cut_bound_at(instance, config, bw, (side, world - side), parts) for bw, side in cuts])


def cut_bound_at(instance, config: Config, cut: float, sides: tuple[int, int], parts: Parts | None = None) -> float:
    """(B2) for one cut: (B1) with one group across it, the smallest over which kind of group crosses.

    A kind of group need not be considered when the others alone cannot connect the two sides: if only the
    kinds in R cross, each side is a union of classes of ranks that differ only in R's coordinates, each of
    prod_{k in R} size_k ranks. So a set D of kinds is left out when some side is not a multiple of the
    product over the rest; the bound is the largest over such D of the smallest over the rest.
    """
    b = parts or stage_parts(instance, config)
    if cut >= b.inter:
        return -INF
    cases = _crossing_cases(instance, config, cut, b)
    if not cases:
        return -INF
    size = {"tp": config.tp, "cp": config.cp, "dp": config.dp, "pp": config.pp,
            "shard": config.dp // config.dp_replicate, "replicate": config.dp_replicate}
    kinds = sorted(cases)
    best = min(cases.values())
    for mask in range(1, 2 ** len(kinds) - 1):  # R = the kinds kept, a proper non-empty subset
        rest = [kind for i, kind in enumerate(kinds) if mask >> i & 1]
        block = math.prod(size[kind] for kind in rest)
        if any(side % block for side in sides):
            best = max(best, min(cases[kind] for kind in rest))
    return best


@dataclass(frozen=True)
class _CutContext:
    """What every crossing case of one cut shares: the parts, the cut's bandwidth and the fixed floors."""

    b: Parts
    cut: float
    stages: list
    dp_floor: float
    fixed_part: float

    def with_slow_stage(self, u_slow: float, dp_slow: bool, dp_cap: int) -> float:
        """(B1) with one stage's per-layer unit slowed to `u_slow` (its dp group too, when `dp_slow`)."""
        b, best = self.b, INF
        v = b.config.vpp
        for s in self.stages:
            us = [b.u] * b.config.pp
            us[s] = u_slow
            if not dp_slow:
                best = min(best, b.pipeline(us) + self.dp_floor)
                continue
            for q in range(v, max(b.caps[s], 0) + 1, v):
                best = min(best, b.pipeline(us, {s: q}) + max(self.dp_floor, b.dp_exposure(s, q, self.cut, 2, dp_cap)))
        return best + b.chain() + self.fixed_part


def _crossing_cases(instance, config: Config, cut: float, b: Parts) -> dict[str, float]:
    """(B2) The bound of one cut when a group of each kind (tp, cp, dp, pp) is the one that crosses it."""
    cluster, model, job = instance.cluster, instance.model, instance.training
    p = b.placement
    ctx = _CutContext(b, cut, b.distinct_stages(), b.dp_floor(), b.optimizer + b.gpu_type.iteration_overhead_s)
    cases = {}
    if config.tp > 1:
        cases["tp"] = ctx.with_slow_stage(b.unit(_tp_time(instance, b, cut), b.cp, b.ag, b.rs), False,
                                          b.per_node_cap)
    if config.dp * config.cp > 1:
        cases.update(_dp_crossing_cases(instance, config, ctx))
    if config.pp > 1:
        sp = job.sequence_parallel_size(config.tp)
        slow = cost.p2p_time(cost.activation_message_bytes(model, job, p) / sp, cut, False, cluster)
        cases["pp"] = b.pipeline([b.u] * config.pp) + b.chain(max(0.0, slow - b.c_min)) + ctx.dp_floor + ctx.fixed_part
    return cases


def _tp_time(instance, b: Parts, bandwidth: float) -> float:
    """The least per-layer tp communication of a tp group whose links across nodes run at `bandwidth`."""
    model, job, cluster = instance.model, instance.training, instance.cluster
    return best_group_time(lambda lk: cost.tp_layer_comm(model, job, b.placement, lk, cluster), b.config.tp,
                           b.intra, bandwidth, b.max_nodes, b.per_node_cap, 2, b.span)


def _dp_crossing_cases(instance, config: Config, ctx: _CutContext) -> dict[str, float]:
    """(B2) A cp ring or a dp group across the cut (a cp ring across puts its shard group, dp x cp without
    replicas, across too); with replicas a shard group or a replicate group, the kinds "shard" and "replicate"
    (their sizes dp / dp_replicate and dp_replicate multiply to dp's), each pricing its own collectives at the cut.

    Such a group has at most one member per tp group of its stage. Either every node it spans holds at most
    cap / tp of its members (a), or some node holds more, and then a tp group of the same stage spans nodes (b):
    that stage pays both. (b) does not exist when tp > cap: then every tp group spans nodes already in (B1)."""
    cluster, model, job = instance.cluster, instance.model, instance.training
    b, cut = ctx.b, ctx.cut
    narrow = b.per_node_cap // config.tp if config.tp <= b.per_node_cap else b.per_node_cap
    # zero 1 with replicas: the dp sync's shard and replica collectives are counted at their least
    dp_slow = config.zero_stage < 3 and config.dp_replicate == 1
    split_tp = config.tp > 1 and config.tp <= b.per_node_cap
    tp_split = _tp_time(instance, b, b.inter) if split_tp else b.tp

    # a layer's parameters, as stage_parts takes them (once per call, not per crossing case)
    params = stage_constants(instance, b.placement, 0, b.gpu_type).layer_params if config.zero_stage >= 2 else 0.0

    def per_layer(group: str, cap: int) -> tuple[float, float]:
        """Per-layer gathers and reduces of zero 2 and 3 (C12) with `group` across the cut, `cap` of it a node."""
        if config.zero_stage < 2:
            return b.ag, b.rs
        caps = (cap, b.per_node_cap) if group == "shard" else (b.per_node_cap, cap)
        return shard_layer_floor(instance, b.placement, params, (b.intra, b.inter, b.max_nodes, b.span), *caps,
                                 crossing=(group, cut))

    def across(cp_time: float, group: str = "shard") -> float:
        value = ctx.with_slow_stage(b.unit(b.tp, cp_time, *per_layer(group, narrow)), dp_slow, narrow)  # (a)
        if split_tp:  # (b)
            value = min(value, ctx.with_slow_stage(b.unit(tp_split, cp_time, *per_layer(group, b.per_node_cap)),
                                                   dp_slow, b.per_node_cap))
        return value

    cases = {}
    if config.cp > 1:
        cases["cp"] = across(cost.cp_layer_comm(model, job, b.placement, min(b.intra, cut), False, cluster))
    if config.dp_replicate > 1:
        if config.dp > config.dp_replicate:
            cases["shard"] = across(b.cp)
        cases["replicate"] = across(b.cp, "replicate")
    elif config.dp > 1:
        cases["dp"] = across(b.cp)
    return cases


def lower_bound(instance, config: Config, caps: list[int] | None = None) -> float:
    """A time no partition and no GPU map of `config` can beat: (B1), cheap, for every configuration. `caps`:
    the stages' layer capacities when the caller has them (`partition_fits`)."""
    return fast_bound(instance, config, caps)
