"""Lower bounds on a configuration's iteration time, valid for every layer partition and every GPU map.

(B1) `fast_bound`: the stage composition of formulation/stage.py with every group at its best shape over
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

import bisect
import functools
import itertools
import math
from dataclasses import dataclass, field

import numpy as np

from formulation import cost
from formulation.cost import GroupLinks
from formulation.memory import memory_coefficients
from formulation.placement import even_split
from formulation.space import Config, partition_fits, placement_for
from formulation.stage import dp_sync_parts, layer_time, stage_constants

INF = float("inf")


@functools.lru_cache(maxsize=2)
def node_links(cluster) -> np.ndarray:
    """N x N: the fastest GPU pair between two nodes (the node figure, or a faster measured GPU pair), -INF on
    the diagonal. The graph the cut and span bounds reason about. Cached per cluster."""
    W = np.array(cluster.inter_gb_per_s, dtype=float)
    for (a, b), value in cluster.gpu_pair_gb_per_s.items():
        i, j = int(cluster.gpu_node[a]), int(cluster.gpu_node[b])
        W[i, j] = W[j, i] = max(W[i, j], value)
    np.fill_diagonal(W, -INF)
    return W


def cluster_extremes(cluster) -> tuple[float, float]:
    """Fastest intra-node and inter-node GPU-pair bandwidth anywhere in the cluster (INF: no such pair)."""
    intra = max((float(m[~np.eye(m.shape[0], dtype=bool)].max()) for m in cluster.intra_gb_per_s if m.shape[0] > 1),
                default=INF)
    inter = float(node_links(cluster).max()) if len(cluster.nodes) > 1 else INF
    return intra, inter


def weakest_cuts(cluster, limit: int = 3) -> list[tuple[float, int]]:
    """Cuts of the nodes with no GPU pair across faster than a bandwidth: (bandwidth, GPUs on one side).

    Every edge of a maximum spanning tree of the node graph (edge = fastest GPU pair between two nodes)
    defines one: removing it splits the tree, and no link across is faster than the edge (else the tree
    would not be maximum). The `limit` weakest edges give the strongest cuts. Prim, O(N^2); [] for one node.
    """
    n = len(cluster.nodes)
    if n < 2:
        return []
    W = node_links(cluster)
    in_tree = np.zeros(n, dtype=bool)
    in_tree[0] = True
    reach, via = W[0].copy(), np.zeros(n, dtype=int)
    edges = []
    for _ in range(n - 1):
        reach[in_tree] = -INF
        j = int(np.argmax(reach))
        edges.append((float(reach[j]), int(via[j]), j))
        in_tree[j] = True
        closer = W[j] > reach
        reach[closer], via[closer] = W[j][closer], j
    children: dict[int, list[int]] = {}
    for _, parent, child in edges:
        children.setdefault(parent, []).append(child)
    gpus = [node.num_gpus for node in cluster.nodes]
    cuts = []
    for weight, _, child in sorted(edges)[:limit]:
        side, stack = 0, [child]  # the subtree below the edge
        while stack:
            v = stack.pop()
            side += gpus[v]
            stack.extend(children.get(v, []))
        cuts.append((weight, side))
    return cuts


@functools.lru_cache(maxsize=4)
def span_bandwidth(cluster) -> np.ndarray:
    """ub[N]: no group spanning N nodes has a slowest inter-node pair faster than this (N >= 2).

    In a set S of N nodes, every member v meets the others over at most its (N-1)-th fastest link, so the
    slowest pair of S is at most min over v in S of that; the best S can do is the N-th largest of these
    figures over all nodes. Exact for N = all nodes (the slowest pair anywhere). O(n^2 log n), cached."""
    n = len(cluster.nodes)
    ub = np.full(n + 1, INF)
    if n < 2:
        return ub
    W = node_links(cluster)
    rows = -np.sort(-W, axis=1)[:, :n - 1]  # each node's links, fastest first
    columns = -np.sort(-rows, axis=0)  # per rank of link, nodes fastest first
    ub[2:] = columns[np.arange(1, n), np.arange(0, n - 1)]
    return ub


def best_group_time(fn, size: int, intra: float, inter: float, max_nodes: int, per_node_cap: int,
                    min_nodes: int = 1, span: np.ndarray | None = None) -> float:
    """The smallest time any placement of a group of `size` can have over every shape (nodes spanned,
    fewest members per node) with at least `min_nodes` nodes, at the given links (`span[N]` caps the
    inter-node figure of a group over N nodes, see `span_bandwidth`)."""
    if size <= 1:
        return 0.0 if min_nodes <= 1 else INF
    best = INF
    for N in range(max(1, min_nodes), min(size, max_nodes) + 1):
        if N * per_node_cap < size:  # the nodes cannot hold the group
            continue
        bw = inter if span is None or N == 1 else min(inter, float(span[N]))
        for k in ([size] if N == 1 else range(1, size // N + 1)):
            if k > per_node_cap:
                continue
            best = min(best, fn(GroupLinks(size, intra, bw, N, k)))
    return best


def least_slowest_stage(us: list[float], extras: list[float], caps: list[int], layers: int, step: int,
                        fixed: dict[int, int] | None = None) -> float:
    """The smallest possible max_i (l_i u_i + extra_i) over partitions with l_i <= cap_i (memory), l_i a positive
    multiple of `step`, sum l_i = layers, and l_i = fixed[i] where given. INF if no partition exists.

    The most layers the stages can hold at a level grows with the level, so the answer is the smallest
    candidate level (some stage exactly at q u_i + extra_i) at which they hold all layers: binary search."""
    fixed = fixed or {}
    P = len(us)
    if sum(fixed.get(i, step) for i in range(P)) > layers or any(fixed.get(i, step) > caps[i] for i in range(P)):
        return INF
    if any(f % step for f in fixed.values()):
        return INF
    # the answer is some stage's time at a layer count it can hold; stages alike give the same candidates
    shapes = {(us[i], extras[i], fixed[i], fixed[i]) if i in fixed else (us[i], extras[i], step, min(caps[i], layers))
              for i in range(P)}
    levels = sorted({q * u + e for u, e, lo, hi in shapes for q in range(lo, hi + 1, step)})

    def holds(level: float) -> bool:
        room = 0
        for i in range(P):
            if i in fixed:
                if fixed[i] * us[i] + extras[i] > level * (1 + 1e-12):
                    return False
                room += fixed[i]
                continue
            fit = min(caps[i], int((level - extras[i]) / us[i] + 1e-9)) if us[i] > 0 else caps[i]
            fit = fit // step * step
            if fit < step:
                return False
            room += fit
        return room >= layers

    at = bisect.bisect_left(range(len(levels)), True, key=lambda idx: holds(levels[idx]))
    return levels[at] if at < len(levels) else INF


@dataclass
class _Parts:
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
    dp_cap: int = 0  # most members of one dp group on a node (0: per_node_cap)
    c_inter: float = 0.0  # one send over the fastest inter-node pair (c_min when that is the fastest pair)
    _constants: dict = field(default_factory=dict)
    _group_times: dict = field(default_factory=dict)

    def unit(self, tp: float, cp: float, ag: float, rs: float) -> float:
        lt = layer_time(stage_constants(self.instance, self.placement, 0, self.gpu_type),
                        self.instance.training.tp_comm_overlap, tp, cp, ag, rs)
        return lt.forward + lt.backward

    def pipeline(self, us: list[float], fixed: dict[int, int] | None = None) -> float:
        """(C9) m M + (S - M) / vpp grows with M and S: M the least slowest stage, S the least stage sum."""
        L, v = self.instance.model.num_layers, self.config.vpp
        M = least_slowest_stage(us, self.extras, self.caps, L, v, fixed)
        if M == INF:
            return INF
        u_min = min(us)
        least = {i: (fixed or {}).get(i, v) for i in range(len(us))}
        S = u_min * L + sum(self.extras) + sum((us[i] - u_min) * least[i] for i in range(len(us)))
        return self.m * M + (max(S, M) - M) / v

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
        wrap = sends[P - 1] if len(sends) >= P else 0.0
        return self.rounds * 2 * (v * sum(sends[:P - 1]) + (v - 1) * wrap) if P > 1 else 0.0

    def boundaries(self) -> list[tuple[int, int]]:
        """The stage pairs that send to each other: (j, j + 1), and (P - 1, 0) when interleaved (the wrap)."""
        P = self.config.pp
        return [(j, j + 1) for j in range(P - 1)] + ([(P - 1, 0)] if self.config.vpp > 1 and P > 1 else [])

    def distinct_stages(self) -> list[int]:
        """One stage per kind: the first, the last, and per distinct memory cap one of the stages between (they
        differ only in their cap, through the micro-batches in flight)."""
        P = self.config.pp
        middle = {}
        for i in range(1, P - 1):
            middle.setdefault(self.caps[i], i)
        return sorted({0, P - 1, *middle.values()})

    def constants(self, stage: int):
        if stage not in self._constants:
            self._constants[stage] = stage_constants(self.instance, self.placement, stage, self.gpu_type)
        return self._constants[stage]

    def dp_part_exposures(self, stage: int, layers: int, inter: float, min_nodes: int,
                          per_node_cap: int | None = None) -> list[float]:
        """(C11) per collective (reduce-scatter, all-gather, or all-reduce) the smallest exposed time of `stage`
        holding `layers`, over group shapes at these links with at most `per_node_cap` members on a node."""
        n = self.config.dp * self.config.cp
        if n == 1 or self.config.zero_stage >= 3:
            return []
        cluster, cap = self.instance.cluster, per_node_cap or self.dp_cap or self.per_node_cap
        out = []
        for kind, message, overlapped, window in dp_sync_parts(self.instance, self.placement, self.constants(stage),
                                                               layers):
            key = (kind, message, inter, min_nodes, cap)
            if key not in self._group_times:
                def one(lk, kind=kind, message=message):
                    return cost.collective_time(kind, message, lk, cluster)

                self._group_times[key] = best_group_time(one, n, self.intra, inter, self.max_nodes, cap, min_nodes,
                                                         self.span)
            t = self._group_times[key]
            out.append(max(0.0, t - window) if overlapped else t)
        return out

    def dp_exposure(self, stage: int, layers: int, inter: float, min_nodes: int, per_node_cap: int | None = None
                    ) -> float:
        return sum(self.dp_part_exposures(stage, layers, inter, min_nodes, per_node_cap))

    def stage_dp_floor(self, stage: int) -> float:
        """The least exposed dp sync of `stage` over the layer counts memory allows (see `dp_floor`)."""
        v = self.config.vpp
        most = max(self.caps[stage], 0) // v * v
        if most < v:
            return 0.0
        fewest_parts = self.dp_part_exposures(stage, v, self.inter, 1)
        most_parts = self.dp_part_exposures(stage, most, self.inter, 1)
        return sum(min(a, b) for a, b in zip(fewest_parts, most_parts))

    def dp_floor(self) -> float:
        """delta >= E_i for every stage i, and E_i >= the sum over its collectives of each one's smallest exposure
        over the layer counts memory allows; some stage holds at least ceil(L / pp) layers (rounded up to whole
        vpp chunks), so delta is also at least the smallest such exposure over the stages that can. Each collective's time is the minimum over group shapes of functions
        affine in the message, which is affine in the layer count, as is the window that hides it: so the
        exposure max(0, concave) is smallest at the fewest or the most layers, and two evaluations suffice."""
        best = 0.0
        v, P = self.config.vpp, self.config.pp
        heavy = math.ceil(self.instance.model.num_layers / P / v) * v  # some stage holds at least this many
        loaded = INF
        for i in range(P):
            most = max(self.caps[i], 0) // v * v
            if most < v:
                continue
            most_parts = self.dp_part_exposures(i, most, self.inter, 1)
            best = max(best, self.stage_dp_floor(i))
            if most >= heavy:
                heavy_parts = self.dp_part_exposures(i, heavy, self.inter, 1)
                loaded = min(loaded, sum(min(a, b) for a, b in zip(heavy_parts, most_parts)))
        # ... and the stage holding at least the average number of layers is one of them
        return max(best, loaded if loaded < INF else 0.0)


def _parts(instance, config: Config, whole_tp: bool = False, caps: list[int] | None = None) -> _Parts:
    """The pieces of (B1). `whole_tp`: under the assumption that every tp group lies inside one node (so a node
    holds whole tp groups: at most gpus-per-node / tp members of any dp or cp group, and no two pipeline stages
    when it holds a single tp group)."""
    model, job, cluster = instance.model, instance.training, instance.cluster
    p = placement_for(config, even_split(model.num_layers, config.pp), range(cluster.num_gpus))
    gpu_type = min(cluster.gpu_types.values(), key=lambda g: cost.layer_compute(model, job, p, g).forward)
    intra, inter = cluster_extremes(cluster)
    max_nodes, cap = len(cluster.nodes), max(n.num_gpus for n in cluster.nodes)
    first = stage_constants(instance, p, 0, gpu_type)
    last = stage_constants(instance, p, config.pp - 1, gpu_type)
    w_bytes, g_bytes, _ = job.bytes_per_param_state
    span = span_bandwidth(cluster)
    whole_tp = whole_tp and config.tp <= cap
    dp_cap = cap // config.tp if whole_tp else cap  # members of one dp (or cp) group on a node
    tp = best_group_time(lambda lk: cost.tp_layer_comm(model, job, p, lk, cluster), config.tp, intra, inter,
                         1 if whole_tp else max_nodes, cap, span=span)
    cp = 0.0
    if config.cp > 1:
        best_bw = max(intra, inter) if intra != INF else inter
        if whole_tp and config.cp > dp_cap:  # the ring cannot fit on one node
            cp = cost.cp_layer_comm(model, job, p, min(intra, inter), False, cluster)
        else:
            cp = cost.cp_layer_comm(model, job, p, best_bw, config.cp <= cap, cluster)
    ag = rs = 0.0
    if config.zero_stage >= 3:
        n = config.dp * config.cp
        ag = best_group_time(lambda lk: cost.collective_time("all_gather", first.layer_params * w_bytes, lk, cluster),
                             n, intra, inter, max_nodes, dp_cap, span=span)
        rs = best_group_time(lambda lk: cost.collective_time("reduce_scatter", first.layer_params * g_bytes, lk,
                                                             cluster), n, intra, inter, max_nodes, dp_cap, span=span)
    lt = layer_time(first, job.tp_comm_overlap, tp, cp, ag, rs)
    P, v = config.pp, config.vpp
    m = job.global_batch_size // (config.micro_batch_size * config.dp)
    if caps is None:
        caps = partition_fits(instance, config, max(cluster.gpu_types.values(), key=lambda g: g.memory_gib))[1]
    c_min, c_inter, rounds = 0.0, 0.0, 0
    if P > 1:
        sp = config.tp if (job.sequence_parallel and config.tp > 1) else 1
        message = cost.activation_message_bytes(model, job, p) / sp
        c_inter = cost.p2p_time(message, inter, False, cluster) if inter != INF else INF
        if whole_tp and dp_cap < 2 or intra == INF:  # one tp group per node: stage neighbours on other nodes
            c_min = c_inter
        else:  # the faster of an intra-node and an inter-node send, each with its own latency
            c_min = min(c_inter, cost.p2p_time(message, intra, True, cluster))
        rounds = math.ceil(m / P) if v == 1 else 1
    heavy = math.ceil(model.num_layers / P)
    optimizer = min(cost.optimizer_step_time(
        (memory_coefficients(instance, p, i).optimizer[0] + memory_coefficients(instance, p, i).optimizer[1] * heavy)
        / job.bytes_per_param_state[2], gpu_type) for i in range(P))
    return _Parts(instance=instance, config=config, placement=p, gpu_type=gpu_type, intra=intra, inter=inter,
                  max_nodes=max_nodes, per_node_cap=cap, caps=caps, extras=[0.0] * (P - 1) + [3 * last.output_fwd],
                  m=m, tp=tp, cp=cp, ag=ag, rs=rs, u=lt.forward + lt.backward, c_min=c_min, rounds=rounds,
                  optimizer=optimizer, span=span, dp_cap=dp_cap, c_inter=c_inter)


def _chain_split(w: _Parts, b: _Parts, us: list[float], split: set, floor: float, fixed: float,
                 exact: bool = True) -> float:
    """(B1) for stage times `us` when every stage outside `split` keeps its tp
    groups inside nodes (`w` = `_parts(whole_tp=True)`, `b` the unrestricted parts, `floor` a floor of the dp
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


def _kind(parts: _Parts, stage: int):
    """Stages of one kind are interchangeable in the bounds: the first, the last, and middle ones by cap."""
    return stage if stage in (0, parts.config.pp - 1) else ("middle", parts.caps[stage])


def _split_tp_bound(b: _Parts, w: _Parts, u_split: float, fixed: float) -> float:
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
    loaded = [INF] * P  # stage i's least narrow dp exposure when it holds at least `heavy` layers
    for i in range(P):
        most = max(w.caps[i], 0) // v * v
        if most >= heavy:
            loaded[i] = sum(min(x, y) for x, y in zip(w.dp_part_exposures(i, heavy, w.inter, 1),
                                                      w.dp_part_exposures(i, most, w.inter, 1)))
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
    if len(kinds) > 12:
        for s in (m[0] for m in representative.values()):
            for s2 in (m[0] if m[0] != s else (m[1] if len(m) > 1 else None) for m in representative.values()):
                if s2 is not None:
                    best = min(best, b.pipeline([u_split if i in (s, s2) else b.u for i in range(P)]) + rest)
        return best
    for combo in itertools.combinations_with_replacement(range(len(kinds)), 3):
        S = set()
        for k in set(combo):
            pool = representative[kinds[k]]
            if combo.count(k) > len(pool):
                break
            S.update(pool[:combo.count(k)])
        else:
            best = min(best, b.pipeline([u_split if i in S else b.u for i in range(P)]) + rest)
    for k1, k2 in itertools.combinations_with_replacement(range(len(kinds)), 2):
        if k1 == k2 and len(representative[kinds[k1]]) < 2:
            continue
        S = {representative[kinds[k1]][0], representative[kinds[k2]][-1]}
        delta = max([base] + [floors[i] for i in range(P) if i not in S])
        alone = all(len(representative[_kind(b, i)]) == 1 for i in S)
        best = min(best, _chain_split(w, b, slow(S), S, delta, fixed, alone))
    return best


def fast_bound(instance, config: Config, caps: list[int] | None = None, refined: bool = False) -> float:
    """(B1) pipeline + chain + dp sync + optimizer + overhead, each at its best over partitions and maps: the
    smaller of (i) every tp group inside a node (`_parts(whole_tp=True)`) and (ii) some tp group across nodes,
    whose stage then runs at that tp group's time (everything else at its unrestricted best).

    `refined` (part of (B2), costlier): (i) with the chain split of `_chain_split`, and (ii) by how many stages
    have a tp group across nodes (`_split_tp_bound`)."""
    b = _parts(instance, config, caps=caps)
    fixed = b.optimizer + b.gpu_type.iteration_overhead_s
    rest = b.chain() + b.dp_floor() + fixed
    P = config.pp
    if config.tp > b.per_node_cap or len(instance.cluster.nodes) == 1:
        return b.pipeline([b.u] * P) + rest  # (ii) is certain, or there are no nodes to span: (B1) as is
    if config.tp == 1:  # (i) is certain
        return _chain_split(b, b, [b.u] * P, set(), b.dp_floor(), fixed) if refined else b.pipeline([b.u] * P) + rest
    whole = _parts(instance, config, whole_tp=True, caps=b.caps)
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
            at_heavy = whole.dp_part_exposures(i, heavy, whole.inter, 1)
            at_most = whole.dp_part_exposures(i, most, whole.inter, 1)
            loaded = min(loaded, sum(min(x, y) for x, y in zip(at_heavy, at_most)))
    narrow_h = b.pipeline([b.u] * config.pp) + rest - b.dp_floor() + max(b.dp_floor(), loaded)
    slow_h = INF
    for s in stages:
        us = [b.u] * config.pp
        us[s] = u_split
        for q in range(heavy, max(b.caps[s], 0) // v * v + 1, v):
            slow_h = min(slow_h, b.pipeline(us, {s: q}) + rest)
    return max(min(within, across), min(narrow_h, slow_h))


def cut_bound(instance, config: Config) -> float:
    """(B2) the largest over the weakest cuts of `cut_bound_at`; (B1) for a single node."""
    base = fast_bound(instance, config, refined=True)
    world = instance.cluster.num_gpus
    cuts = weakest_cuts(instance.cluster)
    parts = _parts(instance, config) if cuts else None
    return max([base] + [cut_bound_at(instance, config, bw, (side, world - side), parts) for bw, side in cuts])


def cut_bound_at(instance, config: Config, cut: float, sides: tuple[int, int], parts: _Parts | None = None) -> float:
    """(B2) for one cut: (B1) with one group across it, the smallest over which kind of group crosses.

    A kind of group need not be considered when the others alone cannot connect the two sides: if only the
    kinds in R cross, each side is a union of classes of ranks that differ only in R's coordinates, each of
    prod_{k in R} size_k ranks. So a set D of kinds is left out when some side is not a multiple of the
    product over the rest; the bound is the largest over such D of the smallest over the rest.
    """
    cluster, model, job = instance.cluster, instance.model, instance.training
    b = parts or _parts(instance, config)
    if cut >= b.inter:
        return -INF
    p, P, v = b.placement, config.pp, config.vpp
    fixed_part = b.optimizer + b.gpu_type.iteration_overhead_s
    dp_floor = b.dp_floor()
    stages = b.distinct_stages()
    n_dp = config.dp * config.cp
    # A dp x cp group has at most one member per tp group of its stage. Either every node it spans holds at most
    # cap / tp of its members (a), or some node holds more, and then a tp group of the same stage spans nodes (b):
    # that stage pays both. (b) does not exist when tp > cap: then every tp group spans nodes already in (B1).
    narrow = b.per_node_cap // config.tp if config.tp <= b.per_node_cap else b.per_node_cap

    def with_slow_stage(u_slow: float, dp_slow: bool, dp_cap: int) -> float:
        best = INF
        for s in stages:
            us = [b.u] * P
            us[s] = u_slow
            if not dp_slow:
                best = min(best, b.pipeline(us) + dp_floor)
                continue
            for q in range(v, max(b.caps[s], 0) + 1, v):
                best = min(best, b.pipeline(us, {s: q}) + max(dp_floor, b.dp_exposure(s, q, cut, 2, dp_cap)))
        return best + b.chain() + fixed_part

    def tp_time(bandwidth: float) -> float:
        return best_group_time(lambda lk: cost.tp_layer_comm(model, job, p, lk, cluster), config.tp, b.intra,
                               bandwidth, b.max_nodes, b.per_node_cap, 2, b.span)

    cases = {}
    if config.tp > 1:
        cases["tp"] = with_slow_stage(b.unit(tp_time(cut), b.cp, b.ag, b.rs), False, b.per_node_cap)
    if n_dp > 1:
        dp_slow = config.zero_stage < 3
        split_tp = config.tp > 1 and config.tp <= b.per_node_cap
        tp_split = tp_time(b.inter) if split_tp else b.tp

        def zero3(cap: int) -> tuple[float, float]:
            """Per-layer ZeRO-3 gathers of a dp x cp group across the cut with at most `cap` members a node."""
            if config.zero_stage < 3:
                return b.ag, b.rs
            w_bytes, g_bytes, _ = job.bytes_per_param_state
            k = b.constants(0)
            return tuple(best_group_time(lambda lk, kind=kind, size=size: cost.collective_time(kind, size, lk, cluster),
                                         n_dp, b.intra, cut, b.max_nodes, cap, 2, b.span)
                         for kind, size in (("all_gather", k.layer_params * w_bytes),
                                            ("reduce_scatter", k.layer_params * g_bytes)))

        def across(cp_time: float) -> float:
            value = with_slow_stage(b.unit(b.tp, cp_time, *zero3(narrow)), dp_slow, narrow)  # (a)
            if split_tp:  # (b)
                value = min(value, with_slow_stage(b.unit(tp_split, cp_time, *zero3(b.per_node_cap)), dp_slow,
                                                   b.per_node_cap))
            return value

        if config.cp > 1:  # a cp ring across the cut puts its dp x cp group across too
            cases["cp"] = across(cost.cp_layer_comm(model, job, p, min(b.intra, cut), False, cluster))
        if config.dp > 1:
            cases["dp"] = across(b.cp)
    if P > 1:
        sp = config.tp if (job.sequence_parallel and config.tp > 1) else 1
        slow = cost.p2p_time(cost.activation_message_bytes(model, job, p) / sp, cut, False, cluster)
        cases["pp"] = b.pipeline([b.u] * P) + b.chain(max(0.0, slow - b.c_min)) + dp_floor + fixed_part
    if not cases:
        return -INF
    size = {"tp": config.tp, "cp": config.cp, "dp": config.dp, "pp": P}
    kinds = sorted(cases)
    best = min(cases.values())
    for mask in range(1, 2 ** len(kinds) - 1):  # R = the kinds kept, a proper non-empty subset
        rest = [kind for i, kind in enumerate(kinds) if mask >> i & 1]
        block = math.prod(size[kind] for kind in rest)
        if any(side % block for side in sides):
            best = max(best, min(cases[kind] for kind in rest))
    return best


def lower_bound(instance, config: Config, caps: list[int] | None = None) -> float:
    """A time no partition and no GPU map of `config` can beat: (B1), cheap, for every configuration. `caps`:
    the stages' layer capacities when the caller has them (`partition_fits`)."""
    return fast_bound(instance, config, caps)
