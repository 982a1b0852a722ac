"""(B5) A lower bound over every placement of a cluster of several GPU types, in the objective's unit.

The island composition search (solvers/search/mixed.py) is exact over compositions: stages on the slots of one
island, slot sizes that tile its nodes. Placements outside that space exist (a stage of 3 GPUs on a 4-GPU node,
a stage over two islands) and can be faster: an independent brute force found eight 4-8-GPU clusters where
they were, by 0.5-5.7%, while the search said optimal with gap 0. So the status and bound the user sees come
from this bound, which holds for every placement of every configuration, of any world size (the composition
search leaves GPUs idle too):

    B5 = min over configurations c of value(c, max(B1(c), W(c))),

B1 (solvers/bounds/configs.py `fast_bound`) and the work floor W below each being valid for every layer partition and GPU map of c: the fastest
GPU type's compute, the largest memory, the fastest links for B1. The value of a time is the objective's, monotone in
the time (Objective.of_time), with the used GPUs priced at least at the cheapest type's price.

B1 charges every stage the fastest type's compute, which on 32 A100s and 32 H100s leaves a third of the gap
open; the work floor charges each stage its slowest member's,

    W(c) = m x L / sum over stages j of 1 / u_j,

u_j the per-layer compute (3 x forward, of the model's fastest layer kind) of the slowest GPU of stage j when the world's
w GPUs are the cluster's w fastest, taken in stages of S in speed order: that grouping maximises sum 1 / u_j,
and with l_j layers on stage j the slowest stage takes max_j l_j u_j >= L / sum 1 / u_j per micro-batch (C9:
m micro-batches through the slowest stage; recompute and communication only add). Each configuration is
charged max(B1, W). W is far cheaper than B1: configurations are taken in the order of their W and the loop stops
once W reaches the smallest value found, since no later configuration can go below it. A deadline stops it
early; the bound is then the smallest of the values found and the next configuration's W, still valid.

Measured: on 208 random 4-8-GPU clusters (one or several types, uneven nodes, one-way links, MoE) B5 never
exceeded the brute-force minimum over tp-in-node placements of any world size (median 0.965 of it).
On a100_h100_64 it is 16.15 s against the plan's 21.24 s, on mixed_256 17.06 s against 23.01 s."""

from __future__ import annotations

import time

from formulation.physics import moe_cost
from formulation.placement import even_split
from formulation.space import Config, configurations, placement_for

from solvers.bounds.configs import fast_bound

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
    return p.num_micro_batches(job.global_batch_size) * model.num_layers / sum(1 / u for u in stage_paces)


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
        best = min(best, value(config, max(fast_bound(instance, config), w)))
    return best
