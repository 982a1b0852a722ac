"""(B5) A lower bound over every placement of a cluster of several GPU types, in the objective's unit.

The island composition search (solvers/search/mixed.py) is exact over compositions: stages on the slots of one
island, slot sizes that tile its nodes. Placements outside that space exist (a stage of 3 GPUs on a 4-GPU node,
a stage over two islands) and can be faster: an independent brute force found eight 4-8-GPU clusters where
they were, by 0.5-5.7%, while the search said optimal with gap 0. So the status and bound the user sees come
from this bound, which holds for every placement of every configuration, of any world size (the composition
search leaves GPUs idle too):

    B5 = min over configurations c of value(c, max(B1(c), W(c), T(c))),

B1 (solvers/bounds/configs.py `fast_bound`), the work floor W and the typed bound T below each being valid for
every layer partition and GPU map of c. The value of a time is the objective's, monotone in the time
(Objective.of_time), with the used GPUs priced at least at the cheapest type's price.

Speed order. Take the world's w GPUs as the cluster's w fastest, in stages of S in speed order: the k-th stage's
slowest member is then the (k S)-th fastest GPU. In any placement, the k fastest stages hold k S GPUs each no
slower than the k-th stage's slowest, so its k-th fastest stage is no faster than this grouping's k-th: the
grouping's stage paces are below any placement's, sorted against sorted.

W, the work floor. u_j the per-layer compute (3 x forward, of the model's fastest layer kind) of the grouping's
stage j, sorted. With l_j layers on stage j, t_j >= l_j u_j, and the schedule (C9) is (m - 1/v) max t + (sum t)/v.
Over real l_j that is least where the j fastest stages hold every layer at one level L / sum_{i<=j} 1/u_i (a
vertex of the LP), so

    W(c) = min over j of L / (sum_{i<=j} 1 / u_i) x (m + (j - 1) / v) + the least per-iteration overhead,

m x L / sum 1 / u_j and the bubble; recompute and communication only add. W is far cheaper than the others:
configurations are taken in the order of their W and the loop stops once W reaches the smallest value found,
since no later configuration can go below it. A deadline stops it early; the bound is then the smallest of the
values found and the next configuration's W, still valid.

T, the typed bound. B1 prices every stage at the fastest type, W prices compute alone; T prices each of the
grouping's stages at the whole layer time (compute and the best groups' communication, as B1) of its slowest
member's type, every stage at the largest memory cap and wherever it sits (`least_slowest_stage` is then
symmetric in the stages), plus B1's chain, and the least over GPU types of B1's dp exposure, optimizer step and
overhead (a slower type hides more of the dp sync behind its longer backward). With dense and MoE layers the
stages off the fastest type are priced at the least of theirs (`Parts.pipeline_any`).

Measured: on 206 random 4-8-GPU clusters (one or several types, uneven nodes, one-way links, MoE) B5 never
exceeded the brute-force minimum over tp-in-node placements of any world size (median 0.994 of it, 0.965
before T and W's bubble; docs/independent_check/check_b5.py). On a100_h100_64 it is 16.15 s against the plan's 21.24 s, on mixed_256 17.06 s against 23.01 s."""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from formulation.physics import cost, moe_cost
from formulation.placement import even_split
from formulation.space import Config, configurations, placement_for

from solvers.bounds.configs import fast_bound
from solvers.bounds.kinds import least_optimizer_step
from solvers.bounds.parts import stage_parts
from solvers.bounds.slowest import least_slowest_stage

INF = float("inf")


def work_floor(instance, config: Config) -> float:
    """W(c): a lower bound on the iteration time of every placement of `config` (module docstring)."""
    model, job, cluster = instance.model, instance.training, instance.cluster
    world = config.tp * config.cp * config.dp * config.pp
    p = placement_for(config, even_split(model.num_layers, config.pp), range(world))
    kinds = (None,) if model.moe is None else tuple({"moe" if x else "dense" for x in model.moe.layer_pattern})
    pace = {name: min(3 * moe_cost.layer_compute(model, job, p, gpu_type, kind).forward for kind in kinds)
            for name, gpu_type in cluster.gpu_types.items()}
    # the world's fastest GPUs in speed order, in stages of S: each stage runs at its last (slowest) member's pace
    fastest = sorted(pace[node.gpu_type] for node in cluster.nodes for _ in range(node.num_gpus))[:world]
    size = world // config.pp
    stage_paces = fastest[size - 1::size]
    m, v, L = p.num_micro_batches(job.global_batch_size), config.vpp, model.num_layers
    # (C9) over real layer counts: the least (m - 1/v) max_j t_j + sum_j t_j / v lies where the j fastest stages
    # hold every layer at one level L / sum_{i<=j} 1/u_i, for some j (an LP's vertex)
    reach = np.cumsum([1 / u for u in stage_paces])
    pipe = min(L / r * (m + j / v) for j, r in enumerate(reach))
    return pipe + min(g.iteration_overhead_s for g in cluster.gpu_types.values())


def typed_bound(instance, config: Config) -> float:
    """T(c): (C9)-(C14) at the best links, each stage priced at the layer time of the GPU type it must run at
    when the world's fastest GPUs are taken in stages in speed order (module docstring)."""
    cluster, job, model = instance.cluster, instance.training, instance.model
    b = stage_parts(instance, config)
    world, P, v, L = config.tp * config.cp * config.dp * config.pp, config.pp, config.vpp, model.num_layers
    pace = {name: cost.layer_compute(model, job, b.placement, g).forward for name, g in cluster.gpu_types.items()}
    unit = {name: replace(b, gpu_type=g, _constants={}).unit(b.tp, b.cp, b.ag, b.rs)
            for name, g in cluster.gpu_types.items()}
    # a stage runs at its slowest member's type (by forward compute, evaluate._slowest_type): at least the least
    # layer time of the types no faster than that one
    floor = {name: min(unit[o] for o in pace if pace[o] >= pace[name]) for name in pace}
    fastest = sorted((pace[n.gpu_type], n.gpu_type) for n in cluster.nodes for _ in range(n.num_gpus))[:world]
    us = [floor[name] for _, name in fastest[world // P - 1::world // P]]
    u = min(us)
    if b.kinds is None:  # every stage at the largest cap and no extra: the slowest stage wherever each sits
        M = least_slowest_stage(us, [0.0] * P, [max(b.caps)] * P, L, v)
        S = u * L + sum(b.extras) + sum(x - u for x in us) * v  # each stage holds at least v layers
        pipe = INF if M == INF else b.m * M + (max(S, M) - M) / v
    else:  # (E1) two levels: the stages off the fastest unit at the least of theirs
        slow = [x for x in us if x > u]
        pipe = replace(b, u=u).pipeline_any(len(slow), min(slow, default=u))
    # a slower type hides more of the dp sync behind its longer backward: the least over types
    dp = min(replace(b, gpu_type=g, _constants={}).dp_floor() for g in cluster.gpu_types.values())
    fixed = min(least_optimizer_step(instance, b.placement, g) for g in cluster.gpu_types.values())
    overhead = min(g.iteration_overhead_s for g in cluster.gpu_types.values())
    return pipe + b.chain() + dp + fixed + overhead


def configuration_floors(instance) -> list[tuple[float, int, Config]]:
    """Every configuration of every world size the cluster holds (the composition search leaves GPUs idle too)
    with its work floor W, in W order: (W, index, configuration)."""
    every = (c for world in range(1, instance.cluster.num_gpus + 1) for c in configurations(instance, world))
    return sorted(((work_floor(instance, c), k, c) for k, c in enumerate(every)), key=lambda item: item[:2])


def every_placement_bound(instance, value, cap: float, deadline: float = INF, floors: list | None = None) -> float:
    """B5 in the objective's unit, at most `cap` (the plan's own value: a bound that reaches it proves the plan
    optimal). `value(config, time_s)`: the objective's lower bound for a plan of `config` taking at least
    `time_s` (INF where no such plan can count, e.g. one too slow for a required throughput). `floors`:
    configuration_floors(instance), if the caller has them."""
    ordered = sorted(((value(c, w), k, c, w) for w, k, c in floors or configuration_floors(instance)),
                     key=lambda item: item[:2])  # the value may weigh configurations apart (cost: by GPUs)
    best = cap
    for floor, _, config, w in ordered:
        if floor >= best:
            break
        if time.perf_counter() > deadline:
            return floor  # every configuration left is at least its floor, and they come in that order
        known = max(typed_bound(instance, config), w)
        if value(config, known) < best:  # B1 costs about three times T: only where T leaves room
            best = min(best, value(config, max(known, fast_bound(instance, config))))
    return best
