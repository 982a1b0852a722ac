"""(B5) A lower bound over every placement of a cluster of several GPU types, in the objective's unit.

The island composition search (solvers/search/mixed.py) is exact over compositions: stages on the slots of one
island, slot sizes that tile its nodes. Placements outside that space exist (a stage of 3 GPUs on a 4-GPU node,
a stage over two islands) and can be faster: an independent brute force found eight 4-8-GPU clusters where
they were, by 0.5-5.7%, while the search said optimal with gap 0. So the status and bound the user sees come
from this bound, which holds for every placement of every configuration, of any world size (the composition
search leaves GPUs idle too):

    B5 = min over configurations c of value(c, max(W(c), T(c))),

the work floor W and the typed bound T below each being valid for every layer partition and GPU map of c. The
value of a time is the objective's, monotone in the time (Objective.of_time), with the used GPUs priced at least
at the cheapest type's price. The one-type bound (B1, solvers/bounds/configs.py) is not among them: it prices
every term at one "fastest" type, and across types no type is fastest at everything. On moe_mixed13 (V100 and
H100 PCIe, a small MoE model) the V100's layers are the quicker but its output layer and optimizer step the
slower, and B1 of tp1 pp2 came out at 0.09670 s against a fitting placement on the two H100s at 0.09612 s.

Speed order. Take the world's w GPUs as the cluster's w fastest, in stages of S in speed order: the k-th stage's
slowest member is then the (k S)-th fastest GPU. In any placement, the k fastest stages hold k S GPUs each no
slower than the k-th stage's slowest, so its k-th fastest stage is no faster than this grouping's k-th: the
grouping's stage paces are below any placement's, sorted against sorted.

W, the work floor. u_j the per-layer compute (3 x forward, of the model's fastest layer kind) of the grouping's
stage j, sorted. With l_j layers on stage j, t_j >= l_j u_j, and the schedule (C9) is (m - 1/v) max t + (sum t)/v.
Over real l_j that is least where the j fastest stages hold every layer at one level L / sum_{i<=j} 1/u_i (a
vertex of the LP), so

    W(c) = min over j of L / (sum_{i<=j} 1 / u_i) x (m + (j - 1) / v) + the least per-iteration overhead,

m x L / sum 1 / u_j and the bubble; recompute and communication only add. W is far cheaper than T:
configurations are taken in the order of their W and the loop stops once W reaches the smallest value found,
since no later configuration can go below it. A deadline stops it early; the bound is then the smallest of the
values found and the next configuration's W, still valid.

T, the typed bound. W prices compute alone. T prices each of the grouping's stages at the whole layer time
(compute and the best groups' communication) of its type, and takes the least slowest stage over every order of
those times along the pipeline (an assignment problem per level: `least_slowest_stage_any_order`), each position
with its own memory cap (at the largest memory) and the last its output layer, at the type of the stage that
holds it. A stage of a type holds a GPU of that type, and so does one of its tp groups (and one ZeRO-3 dp x cp
group): that group is inside a node of the type or leaves one, so its links are at best the type's (`type_links`),
not the cluster's fastest. The stage sum is taken with the slowest stage: at a level tau every stage holds at
most tau / u_j layers, so the least sum fills the fastest stages first (`least_stage_sum`), and the schedule
(C9) is least over tau at M or where the sum steps down (`_pipeline_at_levels`). It adds B1's send/receive chain
at the fastest pair and, over the GPU types, the least dp exposure (a slower type hides more of the dp sync
behind its longer backward), optimizer step and overhead. With dense and MoE layers the stages off the fastest
type are priced at the least of theirs (`Parts.pipeline_any`). A type's figure is the least over the types no
faster than it by the evaluator's key, so that a figure which does not follow the key stays a floor. Where T
is still below the plan, its slowest stage is also taken jointly with the dp exposure, at levels of it: a stage
holds only as many layers as keep its exposure within the level, at narrow dp groups when its tp and ep groups
lie inside nodes, or at slower layers when one crosses (solvers/bounds/exposure_levels.py).

Measured: on 206 random 4-8-GPU clusters (one or several types, uneven nodes, one-way links, MoE) B5 never
exceeds the brute-force minimum over tp-in-node placements of any world size (docs/independent_check/check_b5.py),
nor on the 32 clusters of tests/test_mixed_brute_force.py. What each piece adds on the shipped instances is in
docs/mixed-gpu-types.md."""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from formulation.stage_links import type_pace
from formulation.physics import cost, moe_cost
from formulation.physics.stage import stage_constants
from formulation.placement import even_split
from formulation.space import Config, configurations, partition_fits, placement_for

from solvers.bounds.exposure_levels import exposure_split, stage_options
from solvers.bounds.kinds import least_optimizer_step
from solvers.bounds.levels import node_links
from solvers.bounds.parts import best_group_time, stage_parts
from solvers.bounds.slowest import least_slowest_stage_any_order

INF = float("inf")


def _stage_floors(instance, p, world: int, of_type: dict, *also: dict) -> list:
    """The speed-order grouping's stages, each at `of_type`'s least figure over the GPU types no faster than its
    slowest member's (a stage runs at its slowest member's type, by stage_links.slowest_type's key; a figure need
    not follow that key, hence the least over the slower types): sorted, as the module docstring compares them.
    With `also` (more figures per type), tuples: each stage's figure of `of_type` and of each of `also`, sorted
    by the first; a figure that is a tuple (memory caps per position) is the most over the slower types."""
    names, slower = grouping_types(instance, p, world)

    def floor(figure):
        values = {name: [figure[o] for o in slower[name]] for name in slower}
        if isinstance(figure[next(iter(slower))], tuple):  # memory caps per position: the most over the slower types
            return {name: tuple(max(c) for c in zip(*v)) for name, v in values.items()}
        return {name: min(v) for name, v in values.items()}

    floors = [floor(figure) for figure in (of_type, *also)]
    stages = sorted(tuple(floor[name] for floor in floors) for name in names)
    return stages if also else [s[0] for s in stages]


def grouping_types(instance, p, world: int) -> tuple[list[str], dict[str, list[str]]]:
    """The GPU type of each stage's slowest member when the world's fastest GPUs are taken in stages in speed
    order (stage_links.slowest_type's key), and per type the types no faster than it (itself included)."""
    cluster, model, job = instance.cluster, instance.model, instance.training
    key = {name: type_pace(model, job, p, g) for name, g in cluster.gpu_types.items()}
    fastest = sorted((key[n.gpu_type], n.gpu_type) for n in cluster.nodes for _ in range(n.num_gpus))[:world]
    size = world // p.pp
    return [name for _, name in fastest[size - 1::size]], {n: [o for o in key if key[o] >= key[n]] for n in key}


def work_floor(instance, config: Config) -> float:
    """W(c): a lower bound on the iteration time of every placement of `config` (module docstring)."""
    model, job, cluster = instance.model, instance.training, instance.cluster
    world = config.tp * config.cp * config.dp * config.pp
    p = placement_for(config, even_split(model.num_layers, config.pp), range(world))
    kinds = (None,) if model.moe is None else tuple({"moe" if x else "dense" for x in model.moe.layer_pattern})
    pace = {name: min(3 * moe_cost.layer_compute(model, job, p, gpu_type, kind).forward for kind in kinds)
            for name, gpu_type in cluster.gpu_types.items()}
    stage_paces = _stage_floors(instance, p, world, pace)
    m, v, L = p.num_micro_batches(job.global_batch_size), config.vpp, model.num_layers
    # (C9) over real layer counts: the least (m - 1/v) max_j t_j + sum_j t_j / v lies where the j fastest stages
    # hold every layer at one level L / sum_{i<=j} 1/u_i, for some j (an LP's vertex)
    reach = np.cumsum([1 / u for u in stage_paces])
    bubble = 1.0 if config.schedule == "1f1b" else 0.0  # zero bubble (S1): no bubble term kept
    pipe = min(L / r * (m + bubble * j / v) for j, r in enumerate(reach))
    return pipe + min(g.iteration_overhead_s for g in cluster.gpu_types.values())


def typed_bound(instance, config: Config, refine_below: float = 0.0, enough: float = INF) -> float:
    """T(c): (C9)-(C14) at the best links, each stage priced at the layer time of the GPU type it must run at
    when the world's fastest GPUs are taken in stages in speed order (module docstring). Where it comes out
    below `refine_below`, the stage sum is also taken with the positions' caps and extras (`placed_sum`). Where
    the pipeline, chain and overhead alone reach `enough`, their sum is returned (a lower bound that is enough
    for the caller) without the dp exposure and optimizer step, the costliest pieces."""
    cluster = instance.cluster
    types = list(cluster.gpu_types.values())
    b = stage_parts(instance, config)
    world, P, v, L = b.placement.world_size, config.pp, config.vpp, instance.model.num_layers
    at_type = {g.name: replace(b, gpu_type=g, _constants={}) for g in types}
    output = {g.name: 3 * stage_constants(instance, b.placement, P - 1, g).output_fwd for g in types}
    # a stage holds a GPU of the type it runs at, and must fit in that GPU (evaluate._stage_memory: every type)
    # (at the largest memory, B1's caps, also for a type within 10 % of it, where its own would cost a memory model
    # per stage and config for little; a type with less memory its own)
    most = max(g.memory_gib for g in types)
    room = {g.name: tuple(b.caps) if g.memory_gib >= 0.9 * most else tuple(partition_fits(instance, config, g)[1])
            for g in types}
    stages = _stage_floors(instance, b.placement, world, {name: at.unit(*_type_groups(instance, b, name))
                                                          for name, at in at_type.items()}, output, room)
    us = [unit for unit, _, _ in stages]
    u = us[0]
    # the last stage's output layer (forward + 2x backward) at the type where it is cheapest
    extras = [0.0] * (P - 1) + [min(output.values())]
    if b.kinds is None:  # the slowest stage over every order of the stages' types, each position its cap and extra
        # (the output layer at the type of the stage that holds the last position)
        at_last = np.zeros((P, P))
        at_last[P - 1, :] = [out for _, out, _ in stages]
        caps = np.array([c for _, _, c in stages]).T  # caps[i][j]: position i holding stage j
        M = least_slowest_stage_any_order(us, at_last, caps, L, v)
        pipe = _pipeline_at_levels(b, us, M, [min(max(c), L) for _, _, c in stages], sum(extras))
        if pipe + b.chain() + min(g.iteration_overhead_s for g in types) >= enough:
            return pipe + b.chain() + min(g.iteration_overhead_s for g in types)
        rest = b.chain() + min(at.dp_floor() for at in at_type.values()) + min(
            least_optimizer_step(instance, b.placement, g) for g in types) + min(g.iteration_overhead_s for g in types)
        if pipe + rest < refine_below:
            value = max(pipe, placed_pipeline(b, us, at_last, caps, M)) + rest
            if value < refine_below:  # the slowest stage jointly with the dp exposure (exposure_levels.py)
                value = max(value, _exposure_bound(instance, b, us, M, stages, output, room, rest, refine_below))
            return value
    else:  # (E1) two levels: the stages off the fastest unit at the least of theirs
        slow = [x for x in us if x > u]
        pipe = replace(b, u=u, extras=extras).pipeline_any(len(slow), min(slow, default=u))
    # a slower type hides more of the dp sync behind its longer backward: the least over types
    dp = min(at.dp_floor() for at in at_type.values())
    fixed = min(least_optimizer_step(instance, b.placement, g) for g in types)
    overhead = min(g.iteration_overhead_s for g in types)
    return pipe + b.chain() + dp + fixed + overhead


def _exposure_bound(instance, b, us: list[float], M: float, stages: list, output: dict, room: dict, rest: float,
                    enough: float) -> float:
    """T with its slowest stage taken jointly with the dp exposure at levels of it (solvers/bounds/exposure_levels.py):
    `rest` is T's chain, dp exposure floor, optimizer step and overhead; the returned bound counts them too."""
    types = list(instance.cluster.gpu_types.values())
    P, v, L = b.config.pp, b.config.vpp, instance.model.num_layers
    names, slower = grouping_types(instance, b.placement, b.placement.world_size)
    groups = {g.name: {"groups": _type_groups(instance, b, g.name), "caps": room[g.name]} for g in types}
    options = stage_options(instance, b, types, groups, L)
    per_stage = [[o for t in slower[name] for o in options[t]] for name in names]
    extras = np.zeros((P, P))
    extras[P - 1, :] = [min(output[t] for t in slower[name]) for name in names]
    floor = min(replace(b, gpu_type=g, _constants={}).dp_floor() for g in types)
    cap = [min(max(c), L) for _, _, c in stages]

    def pipeline(slowest: float) -> float:
        return _pipeline_at_levels(b, us, max(slowest, M), cap, float(extras[P - 1].min()))

    return exposure_split(per_stage, extras, L, v, pipeline, rest - floor, floor, enough)


def least_stage_sum(us: list[float], level: float, cap, layers: int, step: int) -> float:
    """The least sum of stage times l_j u_j when every stage holds at least `step` layers, at most `cap` and at
    most what its time allows at `level` (l_j u_j <= level), in whole chunks: the fastest stages filled first
    (a lower bound on sum_j t_j of any partition whose slowest stage is at most `level`). INF where they
    cannot hold `layers`."""
    caps = cap if isinstance(cap, list) else [cap] * len(us)  # one cap, or each stage its own
    room = [min(c, int(level / x * (1 + 1e-12) + 1e-9)) // step * step for x, c in zip(us, caps)]
    if any(r < step for r in room) or sum(room) < layers:
        return INF
    left, total = layers - step * len(us), sum(us) * step
    for x, r in sorted(zip(us, room)):
        take = min(left, r - step)
        total, left = total + take * x, left - take
    return total


def _pipeline_at_levels(b, us: list[float], M: float, cap: list[int], extra: float) -> float:
    """(C9) m tau + (sum_j t_j - tau) / vpp over the slowest stage's time tau >= M, the stage sum at least its
    least at that level (`least_stage_sum`, plus the output layer's least): the sum falls as tau grows only
    where some stage can take one more chunk, so the least lies at M or at such a step."""
    L, v = b.instance.model.num_layers, b.config.vpp
    if M == INF:
        return INF
    steps = sorted({k * x for x, c in zip(us, cap) for k in range(v, c + 1, v) if k * x > M})
    best = INF
    for tau in [M] + steps:
        if b.m * tau >= best:
            break  # the schedule only grows from here
        total = least_stage_sum(us, tau, cap, L, v)
        if total < INF:
            best = min(best, b.schedule(tau, total + extra))
    return best


def placed_sum(us: list[float], extras: np.ndarray, caps: np.ndarray, level: float, layers: int,
               step: int) -> float:
    """The least stage sum sum_i (l_i u_s(i) + extras[i][s(i)]) over assignments s of the stages to positions
    (stages of one kind alike) and layer counts with every stage at most `level`, l_i <= caps[i][s(i)], l_i >= step,
    sum l_i = layers: the linear relaxation of that assignment (a lower bound; INF if even it is infeasible)."""
    from scipy.optimize import linprog  # here: scipy.optimize takes 0.6 s to import

    P = len(us)
    kinds: dict[tuple, list[int]] = {}
    for j in range(P):
        kinds.setdefault((us[j], tuple(extras[:, j]), tuple(caps[:, j])), []).append(j)
    K = list(kinds)
    n = len(K)
    # variables: y[i, k] (fraction of position i given to kind k), then x[i, k] (its layers)
    y = lambda i, k: i * n + k  # noqa: E731
    x = lambda i, k: P * n + i * n + k  # noqa: E731
    cost, bounds = np.zeros(2 * P * n), [(0.0, 1.0)] * (P * n) + [(0.0, None)] * (P * n)
    a_eq, b_eq, a_ub = [], [], []
    for i in range(P):
        row = np.zeros(2 * P * n)
        for k, (u, e, c) in enumerate(K):
            room = min(c[i], int((level * (1 + 1e-12) - e[i]) / u + 1e-9)) // step * step
            if room < step:
                bounds[y(i, k)] = (0.0, 0.0)
            cost[y(i, k)], cost[x(i, k)] = e[i], u
            row[y(i, k)] = 1.0
            for sign, limit in ((1.0, max(room, 0)), (-1.0, step)):  # step y <= x <= room y
                r = np.zeros(2 * P * n)
                r[x(i, k)], r[y(i, k)] = sign, -sign * limit
                a_ub.append(r)
        a_eq.append(row)
        b_eq.append(1.0)
    for k, members in enumerate(kinds.values()):
        row = np.zeros(2 * P * n)
        row[[y(i, k) for i in range(P)]] = 1.0
        a_eq.append(row)
        b_eq.append(float(len(members)))
    row = np.zeros(2 * P * n)
    row[P * n:] = 1.0
    a_eq.append(row)
    b_eq.append(float(layers))
    out = linprog(cost, A_ub=np.array(a_ub), b_ub=np.zeros(len(a_ub)), A_eq=np.array(a_eq), b_eq=np.array(b_eq),
                  bounds=bounds, method="highs")
    return float(out.fun) * (1 - 1e-9) if out.status == 0 else INF


def placed_pipeline(b, us: list[float], extras: np.ndarray, caps: np.ndarray, M: float) -> float:
    """(C9) m tau + (sum - tau) / vpp over the slowest stage's time tau >= M with the stage sum at least
    `placed_sum` at that level: it falls only where some (position, stage) pair can take one more chunk, so the
    least lies at M or at such a step; levels whose m tau alone reaches the least found are not tried."""
    L, v = b.instance.model.num_layers, b.config.vpp
    if M == INF:
        return INF
    P = len(us)
    kinds = {j: None for j in range(P)}
    seen = set()
    for j in range(P):  # one stage of each kind
        key = (us[j], tuple(extras[:, j]), tuple(caps[:, j]))
        kinds[j], seen = key not in seen, seen | {key}
    steps = sorted({q * us[j] + float(extras[i, j]) for j in range(P) if kinds[j] for i in range(P)
                    for q in range(v, int(min(caps[i, j], L)) + 1, v)} | {M})
    best = INF
    for tau in steps:
        if tau < M:
            continue
        if b.m * tau >= best:
            break
        total = placed_sum(us, extras, caps, tau, L, v)
        if total < INF:
            best = min(best, b.schedule(tau, total))
    return best


def type_links(cluster, name: str) -> tuple[float, float]:
    """The fastest pair at the fast level with one end on a node of GPU type `name` (inside such a node, or
    across trays of its NVLink domain), and the fastest pair at the slow level with one end on such a node
    (between nodes, or between domains where declared; either direction; INF where there is none)."""
    mine = [k for k, node in enumerate(cluster.nodes) if node.gpu_type == name]
    intra = max((float(m[~np.eye(m.shape[0], dtype=bool)].max()) for k, m in enumerate(cluster.intra_gb_per_s)
                 if k in mine and m.shape[0] > 1), default=INF)
    if cluster.has_domains:  # the trays of a domain talk at its NVLink figure: the fast level too
        domain = cluster.node_domain
        mates = [float(cluster.inter_gb_per_s[k, j]) for k in mine for j in range(len(cluster.nodes))
                 if j != k and domain[j] == domain[k]]
        mates += [float(v) for (a, c), v in cluster.gpu_pair_gb_per_s.items()  # measured faster pairs too
                  if {int(cluster.gpu_node[a]), int(cluster.gpu_node[c])} & set(mine)
                  and domain[cluster.gpu_node[a]] == domain[cluster.gpu_node[c]]]
        if mates:
            intra = max(mates) if intra == INF else max(intra, max(mates))
    W = node_links(cluster)
    if W.shape[0] < 2:
        return intra, INF
    units = np.unique(cluster.node_domain[mine]) if cluster.has_domains else np.asarray(mine)
    return intra, float(max(W[units, :].max(), W[:, units].max()))


def _type_groups(instance, b, name: str) -> tuple[float, float, float, float]:
    """(tp, cp, ag, rs) per layer for a stage paced by GPU type `name`: it holds a GPU of that type, and so
    does one of its tp groups (and one dp x cp group under ZeRO-3). Such a group inside one node is on a node of
    that type (its slowest pair no faster than the type's fastest intra-node pair); over several nodes, its
    slowest inter-node pair is no faster than the fastest link leaving a node of that type (evaluator: slowest
    pair per level, formulation/inputs/cluster.py `group_links`). The least over both shapes, at B1's figure
    where the type's own is no better."""
    model, job, cluster = instance.model, instance.training, instance.cluster
    config, p = b.config, b.placement
    intra_k, inter_k = type_links(cluster, name)
    w_bytes, g_bytes = job.bytes_per_param_state[0], job.grad_reduce_bytes

    def least(fn, size: int) -> float:
        inside = best_group_time(fn, size, min(intra_k, b.intra), b.inter, 1, b.per_node_cap, span=b.span)
        across = best_group_time(fn, size, b.intra, min(inter_k, b.inter), b.max_nodes, b.per_node_cap, 2,
                                 span=b.span)
        return min(inside, across)

    tp = least(lambda lk: cost.tp_layer_comm(model, job, p, lk, cluster), config.tp)
    ag, rs = b.ag, b.rs
    if config.zero_stage >= 3 and b.ag + b.rs > 0:
        params = stage_constants(instance, p, 0, b.gpu_type).layer_params
        n = config.shard_size  # the per-layer gathers run over the shard group (dp_shard x cp)
        ag = least(lambda lk: cost.collective_time("all_gather", params * w_bytes, lk, cluster), n)
        rs = least(lambda lk: cost.collective_time("reduce_scatter", params * g_bytes, lk, cluster), n)
    return max(tp, b.tp), b.cp, max(ag, b.ag), max(rs, b.rs)


def configuration_floors(instance) -> list[tuple[float, int, Config]]:
    """Every configuration of every world size the cluster holds (the composition search leaves GPUs idle too)
    with its work floor W, in W order: (W, index, configuration)."""
    every = (c for world in range(1, instance.cluster.num_gpus + 1) for c in configurations(instance, world))
    return sorted(((work_floor(instance, c), k, c) for k, c in enumerate(every)), key=lambda item: item[:2])


def every_placement_bound(instance, value, cap: float, deadline: float = INF, floors: list | None = None,
                          refine: bool = True, record: dict | None = None) -> float:
    """B5 in the objective's unit, at most `cap` (the plan's own value: a bound that reaches it proves the plan
    optimal). `value(config, time_s)`: the objective's lower bound for a plan of `config` taking at least
    `time_s` (INF where no such plan can count, e.g. one too slow for a required throughput). `floors`:
    configuration_floors(instance), if the caller has them. `record`: filled with each configuration bounded and
    its bound (a search may take them in that order)."""
    ordered = sorted(((value(c, w), k, c, w) for w, k, c in floors or configuration_floors(instance)),
                     key=lambda item: item[:2])  # the value may weigh configurations apart (cost: by GPUs)
    best = cap
    for floor, _, config, w in ordered:
        if floor >= best:
            break
        if time.perf_counter() > deadline:
            return floor  # every configuration left is at least its floor, and they come in that order
        # (the value in seconds: where it is in another unit, T is not refined)
        at = best if refine else 0.0
        bound = value(config, max(typed_bound(instance, config, at, best if refine else INF), w))
        if record is not None:
            record[config] = bound
        best = min(best, bound)
    return best
