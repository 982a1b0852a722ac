"""The (B5) pieces on clusters of several GPU types, against placements scored by the evaluator.

Each configuration's work floor W (with its bubble) and typed bound T must stay below every placement of that
configuration that fits: every layer split, with the GPUs in speed order, in reverse speed order and in random
orders over random subsets of the cluster (the composition search and the fastest-first layouts both leave GPUs
idle, so the world may be smaller than the cluster). The clusters are the eight where the search once claimed
a false optimum (tests/repro/mixed_types_*.json). The exhaustive check over every map is
docs/independent_check/check_b5.py (206 instances, 0 above the brute-force minimum, 2026-11-27).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
from pathlib import Path

import numpy as np
import pytest
from test_bounds import splits

from formulation import evaluate, load_instance
from formulation.physics import cost
from formulation.space import configurations, placement_for
from solvers.bounds.configs import fast_bound
from solvers.bounds.every_placement import (every_placement_bound, least_stage_sum, placed_sum, typed_bound,
                                             work_floor)
from solvers.bounds.slowest import least_slowest_stage_any_order

REPRO = Path(__file__).resolve().parent / "repro"
MIXED = sorted(p.stem for p in REPRO.glob("mixed_types_*.json") if not p.stem.endswith("_better"))


def _maps(instance, world: int, rng: random.Random, count: int):
    """GPU orders of `world` GPUs: fastest first, slowest first, and `count` random subsets in random order."""
    cluster = instance.cluster
    some = next(iter(configurations(instance, 1)))
    probe = placement_for(some, (instance.model.num_layers,), range(1))
    pace = [cost.layer_compute(instance.model, instance.training, probe,
                               cluster.gpu_types[cluster.nodes[cluster.gpu_node[g]].gpu_type]).forward
            for g in range(cluster.num_gpus)]
    by_speed = sorted(range(cluster.num_gpus), key=lambda g: (pace[g], g))
    yield tuple(by_speed[:world])
    yield tuple(reversed(by_speed[-world:]))
    for _ in range(count):
        yield tuple(rng.sample(range(cluster.num_gpus), world))


@pytest.mark.parametrize("name", MIXED)
def test_work_floor_and_typed_bound_stay_below_every_fitting_placement(name):
    instance = load_instance(REPRO / f"{name}.json")
    rng = random.Random(name)
    checked = 0
    for world in range(1, instance.cluster.num_gpus + 1):
        for config in configurations(instance, world):
            floor = max(work_floor(instance, config), typed_bound(instance, config))
            maps = list(_maps(instance, world, rng, 6))
            for split in splits(instance.model.num_layers, config.pp, config.vpp):
                probe = placement_for(config, split, range(world))
                for gpus in maps:
                    est = evaluate(instance, dataclasses.replace(probe, gpus=gpus), check=False)
                    if est.fits:
                        assert floor <= est.iteration_time_s * (1 + 1e-9), (config, split, gpus, floor,
                                                                           est.iteration_time_s)
                        checked += 1
    assert checked >= 50, checked


def test_typed_bound_is_stronger_than_the_fastest_type_bounds_somewhere():
    """Not a restatement: on these clusters T exceeds both (B1) and W on many configurations."""
    stronger = total = 0
    for name in MIXED:
        instance = load_instance(REPRO / f"{name}.json")
        for config in configurations(instance):
            old = max(fast_bound(instance, config), work_floor(instance, config))
            if math.isinf(old):
                continue
            total += 1
            stronger += typed_bound(instance, config) > old * (1 + 1e-9)
    assert stronger >= total // 4, (stronger, total)


def test_every_placement_bound_stays_below_the_faster_placements():
    """B5 (the least over every configuration of every world size) against the placements that beat the old
    composition proof: each fits, and B5 is below it, however much tighter T makes B5."""
    from formulation.placement_file import load_placement
    for name in MIXED:
        instance = load_instance(REPRO / f"{name}.json")
        better = evaluate(instance, load_placement(REPRO / f"{name}_better.json", instance))
        bound = every_placement_bound(instance, lambda config, time_s: time_s, math.inf)
        assert better.fits and bound <= better.iteration_time_s * (1 + 1e-9), (name, bound)


def test_least_slowest_stage_any_order_against_enumeration():
    """The least slowest stage over every order of the per-layer times (T's pipeline) against every permutation
    and every split, with per-position extras and memory caps."""
    rng = random.Random(5)
    for _ in range(200):
        P, step = rng.randint(1, 4), rng.choice([1, 2])
        layers = step * rng.randint(P, 6)
        us = [rng.choice([0.7, 1.0, rng.uniform(0.5, 3.0)]) for _ in range(P)]
        extras = [rng.choice([0.0, 0.0, rng.uniform(0, 3)]) for _ in range(P)]
        caps = [rng.randint(step - 1 if rng.random() < 0.1 else step, layers) for _ in range(P)]
        expected = min((max(q * u + e for q, u, e in zip(split, order, extras))
                        for order in itertools.permutations(us) for split in splits(layers, P, step)
                        if all(q <= c for q, c in zip(split, caps))), default=math.inf)
        assert least_slowest_stage_any_order(us, extras, caps, layers, step) == pytest.approx(expected)


def test_least_slowest_stage_any_order_with_extras_per_stage_type_against_enumeration():
    """The same with extras[i][j]: position i's extra when it holds the j-th time's stage (T prices the output
    layer at the type of the stage in the last position)."""
    rng = random.Random(6)
    for _ in range(200):
        P, step = rng.randint(1, 4), rng.choice([1, 2])
        layers = step * rng.randint(P, 6)
        us = [rng.choice([0.7, 1.0, rng.uniform(0.5, 3.0)]) for _ in range(P)]
        extras = [[rng.choice([0.0, rng.uniform(0, 3)]) for _ in range(P)] for _ in range(P)]
        caps = [rng.randint(step, layers) for _ in range(P)]
        expected = min((max(q * us[j] + extras[i][j] for i, (q, j) in enumerate(zip(split, order)))
                        for order in itertools.permutations(range(P)) for split in splits(layers, P, step)
                        if all(q <= c for q, c in zip(split, caps))), default=math.inf)
        assert least_slowest_stage_any_order(us, extras, caps, layers, step) == pytest.approx(expected)


def test_least_stage_sum_against_enumeration():
    """T's stage sum at a level: the least sum_j l_j u_j over splits with every l_j u_j <= level and l_j <= cap,
    against every split and every order (the stages' times are a multiset)."""
    rng = random.Random(7)
    for _ in range(300):
        P, step = rng.randint(1, 4), rng.choice([1, 2])
        layers = step * rng.randint(P, 6)
        us = [rng.choice([0.7, 1.0, rng.uniform(0.5, 3.0)]) for _ in range(P)]
        cap, level = rng.randint(step, layers), rng.uniform(0.5, 8.0)
        expected = min((sum(q * u for q, u in zip(split, us)) for split in splits(layers, P, step)
                        if all(q <= cap and q * u <= level * (1 + 1e-12) for q, u in zip(split, us))),
                       default=math.inf)
        assert least_stage_sum(us, level, cap, layers, step) == pytest.approx(expected)


def test_placed_stage_sum_lies_between_the_unplaced_sum_and_enumeration():
    """T's refined stage sum (a linear relaxation of assigning stages to positions with their caps and extras) is
    at most the least sum of every order and split under the level, and at least the sum that ignores the
    positions (`least_stage_sum`)."""
    rng = random.Random(8)
    for _ in range(150):
        P, step = rng.randint(1, 4), rng.choice([1, 2])
        layers = step * rng.randint(P, 6)
        us = [rng.choice([0.7, 1.0, rng.uniform(0.5, 3.0)]) for _ in range(P)]
        extras = np.zeros((P, P))
        extras[P - 1, :] = [rng.uniform(0, 2) for _ in range(P)]
        caps = np.array([[rng.randint(step, layers) for _ in range(P)] for _ in range(P)])
        level = rng.uniform(1.0, 10.0)
        exact = min((sum(q * us[j] + extras[i, j] for i, (q, j) in enumerate(zip(split, order)))
                     for order in itertools.permutations(range(P)) for split in splits(layers, P, step)
                     if all(q <= caps[i, j] and q * us[j] + extras[i, j] <= level
                            for i, (q, j) in enumerate(zip(split, order)))), default=math.inf)
        relaxed = placed_sum(us, extras, caps, level, layers, step)
        assert relaxed <= exact * (1 + 1e-9)
        loose = least_stage_sum(us, level, [int(caps[:, j].max()) for j in range(P)], layers, step)
        if relaxed < math.inf:
            assert relaxed >= (loose + extras[P - 1].min()) * (1 - 1e-8)
