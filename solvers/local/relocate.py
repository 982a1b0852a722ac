"""Move the cluster's weak nodes to where they cost least: a greedy step before annealing on large clusters.

A node with a half-speed NIC, or in a congested pair, slows every group it joins; which stage it serves
decides how much of that shows (a stage with fewer layers has a smaller gradient message; stages differ in
what is exposed). Random moves rarely pick these few nodes among thousands, so this step tries each weak node
against nodes of a few other stages, lightest first, and keeps a node swap when the evaluator says it helps.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from formulation.evaluate import evaluate
from formulation.placement import Placement

WEAK_NODES = 16  # weak nodes tried, weakest first
STAGES_PER_NODE = 4  # destination stages tried per weak node
# a node is weak when its fastest or slowest link is this far below the cluster's median one (or it is in a
# measured GPU pair): a half-speed NIC is at 0.5. On the i.i.d. 15-25 GB/s node-pair matrices (measured_16/32/64)
# every node is within 8 % of the median on both figures; relocating half of them as "below the median" found
# nothing and cost 0.3-0.4 s per configuration (measured_64 at a 10 s budget), time annealing uses better
WEAK_MARGIN = 0.9


def weak_nodes(cluster, limit: int = WEAK_NODES) -> list[int]:
    """Nodes whose fastest or slowest link to the rest is below the cluster's typical figure, weakest first."""
    n = len(cluster.nodes)
    if n < 3:
        return []
    W = np.array(cluster.inter_gb_per_s, dtype=float)
    np.fill_diagonal(W, np.nan)
    fastest, slowest = np.nanmax(W, axis=1), np.nanmin(W, axis=1)
    touched = {int(cluster.gpu_node[g]) for pair in cluster.gpu_pair_gb_per_s for g in pair}
    typical_fast, typical_slow = np.median(fastest), np.median(slowest)
    weak = [i for i in range(n) if fastest[i] <= WEAK_MARGIN * typical_fast or slowest[i] <= WEAK_MARGIN * typical_slow
            or i in touched]
    return sorted(weak, key=lambda i: (fastest[i], slowest[i]))[:limit]


def _swap_nodes(gpus: list[int], cluster, a: int, b: int) -> list[int]:
    """Exchange the GPUs of nodes a and b (local index for local index) in the rank order."""
    lo_a, lo_b = int(cluster.node_offset[a]), int(cluster.node_offset[b])
    size = min(cluster.nodes[a].num_gpus, cluster.nodes[b].num_gpus)
    mapping = {lo_a + k: lo_b + k for k in range(size)} | {lo_b + k: lo_a + k for k in range(size)}
    return [mapping.get(g, g) for g in gpus]


def relocate_weak_nodes(instance, placement: Placement, deadline: float | None = None) -> Placement:
    """`placement` with weak nodes swapped into other stages wherever that makes the evaluated iteration
    faster (still fitting). Deterministic; stops early at `deadline` (time.perf_counter())."""
    import time

    cluster = instance.cluster
    if len({cluster.nodes[i].gpu_type for i in range(len(cluster.nodes))}) > 1:
        return placement  # node swaps would move GPU types between stages: left to annealing's checks
    weak = weak_nodes(cluster)
    if not weak:
        return placement
    best = evaluate(instance, placement, check=False)
    gpus = list(placement.gpus)
    per_stage = placement.world_size // placement.pp
    for node in weak:
        if deadline is not None and time.perf_counter() >= deadline:
            break
        stage_of = {int(cluster.gpu_node[g]): r // per_stage for r, g in enumerate(gpus)}
        here = stage_of.get(node)
        if here is None:
            continue
        stages = sorted((s for s in range(placement.pp) if s != here),
                        key=lambda s: (placement.layers_per_stage[s], s))[:STAGES_PER_NODE]
        for s in stages:
            partner = next((x for x, st in sorted(stage_of.items()) if st == s and x not in weak), None)
            if partner is None:
                continue
            trial = _swap_nodes(gpus, cluster, node, partner)
            candidate = dataclasses.replace(placement, gpus=tuple(trial))
            est = evaluate(instance, candidate, check=False)
            if est.fits and est.iteration_time_s < best.iteration_time_s * (1 - 1e-12):
                gpus, best = trial, est
                stage_of = {int(cluster.gpu_node[g]): r // per_stage for r, g in enumerate(gpus)}
    return dataclasses.replace(placement, gpus=tuple(_gather(instance, placement, gpus, best, weak, deadline)))


def _gather(instance, placement: Placement, gpus: list[int], best, weak: list[int], deadline: float | None
            ) -> list[int]:
    """All weak nodes moved together onto one of the lightest stages, if that is faster. The dp sync that counts
    is the slowest stage's, so moving one weak node off a stage that another weak node keeps slow gains
    nothing, and the greedy step above stops there; gathering them on a stage with a small gradient message
    (h100_16384: eight half-speed NICs onto the last stage) pays for the slow NICs once."""
    import time

    cluster = instance.cluster
    per_stage = placement.world_size // placement.pp
    for s in sorted(range(placement.pp), key=lambda s: (placement.layers_per_stage[s], s))[:STAGES_PER_NODE]:
        if deadline is not None and time.perf_counter() >= deadline:
            break
        stage_of = {int(cluster.gpu_node[g]): r // per_stage for r, g in enumerate(gpus)}
        movers = [node for node in weak if stage_of.get(node) not in (None, s)]
        partners = [x for x, st in sorted(stage_of.items()) if st == s and x not in weak][:len(movers)]
        if not movers or len(partners) < len(movers):
            continue
        trial = gpus
        for node, partner in zip(movers, partners):
            trial = _swap_nodes(trial, cluster, node, partner)
        est = evaluate(instance, dataclasses.replace(placement, gpus=tuple(trial)), check=False)
        if est.fits and est.iteration_time_s < best.iteration_time_s * (1 - 1e-12):
            gpus, best = trial, est
    return gpus
