"""Plans outside the island compositions on clusters of several GPU types: every configuration of every world
size w laid out Megatron's default way (even split, ranks in order) on the cluster's w fastest GPUs.

The composition search (solvers/search/mixed.py) is exact over stages on one island's slots. An independent
brute force found faster plans outside that space: three H100s of a four-H100 node in one stage (dp 3), or a
tp 2 x dp 2 stage over two nodes of different A100s. Such plans are what this finds, cheaply: the GPUs are
ordered by one layer's compute on their type (then by memory, then by index, which keeps a node's GPUs
together), and a configuration is tried only where its work floor (solvers/bounds/every_placement.py, W)
beats the plan in hand. It proves nothing; the bound comes from (B5)."""

from __future__ import annotations

import time

from formulation.evaluate import evaluate
from formulation.physics import moe_cost
from formulation.placement import default_split
from formulation.programs.islands import find_islands
from formulation.space import Config, memory_feasible, placement_for

from solvers.bounds.every_placement import configuration_floors


def fastest_gpus(instance) -> list[int]:
    """The cluster's GPUs, fastest type first (one layer's forward at tp 1, micro-batch 1), then most memory."""
    cluster, model, job = instance.cluster, instance.model, instance.training
    probe = placement_for(Config(tp=1, pp=1, cp=1, dp=1, vpp=1, micro_batch_size=1, recompute="none",
                                 zero_stage=0), (model.num_layers,), (0,))
    pace = {name: moe_cost.layer_compute(model, job, probe, gpu_type).forward
            for name, gpu_type in cluster.gpu_types.items()}
    return sorted(range(cluster.num_gpus), key=lambda g: (pace[cluster.gpu_type_of(g).name],
                                                          -cluster.gpu_type_of(g).memory_gib, g))


def fastest_first(instance, incumbent_s: float, deadline: float = float("inf"), floors: list | None = None):
    """The fastest fitting default placement on the fastest GPUs over every world size, if it beats
    `incumbent_s`: (placement, estimate), else None. Configurations go in the order of their work floor
    (`floors`: configuration_floors(instance), if the caller has them), and stop once it reaches the best time
    found (or at `deadline`)."""
    order = fastest_gpus(instance)
    island_of = {g: isl for isl in find_islands(instance.cluster) for g in isl.gpus(instance.cluster)}
    best, best_s = None, incumbent_s
    for floor, _, config in floors or configuration_floors(instance):
        if floor >= best_s or time.perf_counter() > deadline:
            break
        split = default_split(instance.model.num_layers, config.pp, config.vpp)
        if split is None:
            continue
        placement = placement_for(config, split, order[:config.tp * config.cp * config.dp * config.pp])
        if not _outside_compositions(placement, island_of):  # the composition search has done better already
            continue
        if not memory_feasible(instance, placement)[0]:  # cheaper than scoring it
            continue
        estimate = evaluate(instance, placement, check=False)
        if estimate.fits and estimate.iteration_time_s < best_s:
            best, best_s = (placement, estimate), estimate.iteration_time_s
    return best


def _outside_compositions(placement, island_of: dict) -> bool:
    """Whether some stage spans two islands or holds a part of a node that does not tile it (3 GPUs of 4): the
    layouts the composition search cannot express. Any other stage is a slot of one island, and there the
    composition program has chosen the stages' islands and the layer split optimally."""
    size = placement.tp * placement.cp * placement.dp
    for j in range(placement.pp):
        islands = {island_of[int(g)] for g in placement.stage_gpus(j)}
        if len(islands) > 1 or any(size % isl.gpus_per_node and isl.gpus_per_node % size for isl in islands):
            return True
    return False
