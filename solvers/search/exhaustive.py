"""Every placement of a small cluster of several GPU types, enumerated in the order of a bound: a search that is
complete, outside the island compositions too.

The composition search (solvers/search/mixed.py) is exact over stages on whole slots of one island; a stage on
part of a node that does not tile it, a stage over two islands (run at the slower type, held to the smaller
memory, as the evaluator prices it), or an island visited twice along the pipeline are outside it. On a small
cluster they can be enumerated instead, with a proof of what is skipped:

- Configurations (every world size: idle GPUs are allowed) are taken in the order of their lower bound over
  every placement, max(W, T) of (B5) (solvers/bounds/every_placement.py). Once the next bound is no better than
  the best time found, nothing left can win.
- For a configuration, every rank-to-GPU map up to interchangeable GPUs (solvers/local/gpu_classes.py: GPUs of
  one class see every link alike in both directions, so swapping two never changes a score) and every layer
  split that Megatron-LM accepts is scored by the evaluator. That covers stages on part of a node, over islands,
  and any order of the islands along the pipeline.
- The enumeration is bounded by a count of evaluations fixed in advance (never by the clock, so the answer is
  the same on any machine) and by the caller's deadline. A configuration is either enumerated whole or not at
  all; when it stops, the bound is the least of the best time found and the next configuration's bound, which
  every configuration not enumerated is at least.

The map count of a configuration is w! [x^w] prod over classes (sum_{j <= n_k} x^j / j!), computed before the
enumeration so that a configuration too large for what is left of the budget stops the search honestly."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from formulation.errors import InputError
from formulation.evaluate import evaluate
from formulation.placement import check_placement
from formulation.space import Config, placement_for

from solvers.bounds.every_placement import INF, configuration_floors, typed_bound
from solvers.local.gpu_classes import safe_classes

# Evaluations the enumeration may spend (about 0.3 ms each): enough for the 4-8-GPU clusters of the brute-force
# tests and the repros, small enough that a larger cluster stops at its first configuration.
BUDGET = 60_000
MAX_GPUS = 12  # beyond this the map counts are astronomic: the enumeration is not tried


@dataclass
class Enumerated:
    """What the enumeration proved: `best` (placement, estimate) if it beat the incumbent, `bound` a lower
    bound over every placement (the best time when `complete`), `evaluations` spent, `configurations`
    enumerated whole."""

    best: tuple | None
    bound: float
    complete: bool
    evaluations: int
    configurations: int


def class_members(cluster) -> list[list[int]]:
    """The GPUs of every interchangeable class, in index order."""
    members: dict[int, list[int]] = {}
    for g, k in enumerate(safe_classes(cluster)):
        members.setdefault(k, []).append(g)
    return [members[k] for k in sorted(members)]


def map_count(sizes: list[int], world: int) -> int:
    """Rank-to-GPU maps of `world` ranks up to swaps inside classes of these sizes: world! [x^world] of
    prod_k sum_{j <= n_k} x^j / j!, in exact rationals as integers (multinomial sums)."""
    ways = {0: 1}  # ranks placed -> number of ordered ways, each class's members taken in its own order
    for n in sizes:
        nxt: dict[int, int] = {}
        for used, count in ways.items():
            for j in range(0, min(n, world - used) + 1):
                nxt[used + j] = nxt.get(used + j, 0) + count * math.comb(used + j, j)
        ways = nxt
    return ways.get(world, 0)


def rank_maps(classes: list[list[int]], world: int):
    """Every map of `world` ranks to GPUs up to swaps inside classes: the k-th rank given to a class takes its
    k-th GPU."""
    taken = [0] * len(classes)
    prefix: list[int] = []

    def extend():
        if len(prefix) == world:
            yield tuple(prefix)
            return
        for k, members in enumerate(classes):
            if taken[k] < len(members):
                prefix.append(members[taken[k]])
                taken[k] += 1
                yield from extend()
                taken[k] -= 1
                prefix.pop()

    yield from extend()


def layer_splits(instance, config: Config) -> list[tuple[int, ...]]:
    """Every layer split of `config` that Megatron-LM accepts (each stage a positive multiple of vpp; the
    placement checks of formulation/placement.py, experts included)."""
    L, P, v = instance.model.num_layers, config.pp, config.vpp

    def parts(total: int, count: int):
        if count == 1:
            if total >= v and total % v == 0:
                yield (total,)
            return
        for first in range(v, total - v * (count - 1) + 1, v):
            for rest in parts(total - first, count - 1):
                yield (first,) + rest

    world = config.tp * config.cp * config.dp * config.pp
    out = []
    for split in parts(L, P):
        try:
            check_placement(instance, placement_for(config, split, range(world)), "<enumeration>")
        except InputError:
            continue
        out.append(split)
    return out


def ordered_bounds(instance, incumbent_s: float, floors: list | None = None) -> list[tuple[float, Config]]:
    """(max(W, T), configuration) of every configuration whose work floor is below `incumbent_s`, in bound
    order; the others cannot beat it."""
    out = []
    for w, _, config in floors or configuration_floors(instance):
        if w >= incumbent_s:
            break  # W order: nothing after goes below either
        out.append((max(w, typed_bound(instance, config)), config))
    out.sort(key=lambda item: item[0])
    return out


def enumerate_placements(instance, incumbent_s: float = INF, deadline: float = INF, floors: list | None = None,
                         budget: int = BUDGET) -> Enumerated:
    """The fastest placement of the cluster, by enumeration in bound order (module docstring)."""
    cluster = instance.cluster
    if cluster.num_gpus > MAX_GPUS:
        return Enumerated(None, 0.0, False, 0, 0)
    classes = class_members(cluster)
    sizes = [len(c) for c in classes]
    best, best_s, spent, done = None, incumbent_s, 0, 0
    for bound, config in ordered_bounds(instance, incumbent_s, floors):
        if bound >= best_s:
            return Enumerated(best, best_s, True, spent, done)
        world = config.tp * config.cp * config.dp * config.pp
        splits = layer_splits(instance, config)
        cost = map_count(sizes, world) * len(splits)
        if spent + cost > budget or time.perf_counter() > deadline:
            return Enumerated(best, min(bound, best_s), False, spent, done)
        for gpus in rank_maps(classes, world):
            for split in splits:
                estimate = evaluate(instance, placement_for(config, split, gpus), check=False)
                if estimate.fits and estimate.iteration_time_s < best_s:
                    best, best_s = (placement_for(config, split, gpus), estimate), estimate.iteration_time_s
        spent, done = spent + cost, done + 1
    return Enumerated(best, best_s, True, spent, done)
