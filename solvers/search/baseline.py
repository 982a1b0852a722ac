"""The Megatron-style baseline: every configuration with the default placement (even split, ranks filled
node by node), scored by the evaluator; the fastest that fits wins.

This is what a user gets by sweeping Megatron-LM's flags without touching the partition or the rank map,
and it is the reference the exact planner is compared against.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from formulation.errors import InfeasibleError
from formulation.evaluate import Estimate, evaluate
from formulation.placement import Placement, default_split
from formulation.space import Config, configurations, memory_feasible, placement_for


@dataclass
class Ranked:
    config: Config
    placement: Placement
    estimate: Estimate


@dataclass
class BaselineResult:
    best: list[Ranked]  # fastest first, at most `top`
    examined: int = 0
    fitting: int = 0
    wall_time_s: float = 0.0
    smallest_shortfall: tuple[float, str] | None = None  # (GiB over the limit, description) when nothing fits
    skipped: dict = field(default_factory=dict)


def default_placements(instance, progress=None):
    """Yield (config, placement, fits, excess GiB, worst stage) for every configuration's default placement."""
    world = instance.cluster.num_gpus
    for config in configurations(instance):
        split = default_split(instance.model.num_layers, config.pp, config.vpp)
        if split is None:  # Megatron-LM has no default partition for it (needs the layout flag)
            continue
        placement = placement_for(config, split, range(world))
        fits, excess, stage = memory_feasible(instance, placement)
        if progress is not None:
            progress()
        yield config, placement, fits, excess, stage


def best_default(instance, top: int = 1, progress=None) -> BaselineResult:
    """Evaluate the default placement of every configuration; raise `InfeasibleError` if none fits."""
    start = time.perf_counter()
    result = BaselineResult(best=[])
    ranked: list[Ranked] = []
    shortfall: tuple[float, str] | None = None
    for config, placement, fits, excess, stage in default_placements(instance, progress):
        result.examined += 1
        if not fits:
            if shortfall is None or excess < shortfall[0]:
                shortfall = (excess, f"{config.describe()}: stage {stage} over its limit by {excess:.1f} GiB")
            continue
        estimate = evaluate(instance, placement, check=False)
        if not estimate.fits:  # the cheap check used the smallest GPU; the evaluator is the referee
            excess = estimate.memory_shortfall_gib
            if shortfall is None or excess < shortfall[0]:
                shortfall = (excess, f"{config.describe()}: over its limit by {excess:.1f} GiB")
            continue
        result.fitting += 1
        ranked.append(Ranked(config, placement, estimate))
    result.wall_time_s = time.perf_counter() - start
    if result.examined == 0:
        raise InfeasibleError("no configuration matches the cluster and batch: global_batch_size must be "
                              "divisible by some data-parallel size dp (and tp, pp, cp must divide the GPU count)")
    if not ranked:
        raise InfeasibleError(f"no configuration fits in memory; the closest is {shortfall[1]}")
    ranked.sort(key=lambda r: (r.estimate.iteration_time_s, r.config))
    result.best = ranked[:top]
    result.smallest_shortfall = shortfall
    return result
