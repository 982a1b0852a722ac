"""(B5) T with its slowest stage taken jointly with the dp exposure (solvers/bounds/exposure_levels.py), configuration
by configuration against a brute force over every layer split and GPU map; and the pipelines that visit an island
twice (solvers/search/reorder.py) on the shipped Mixtral instance, where they beat every composition."""

from __future__ import annotations

from pathlib import Path

import pytest

from formulation.evaluate import evaluate
from formulation.inputs.instance import instance_from_dict, load_instance
from formulation.programs.islands import find_islands
from formulation.space import Config, configurations, placement_for
from solvers.bounds.every_placement import INF, typed_bound
from solvers.search import reorder

from test_mixed_brute_force import cluster_dict, fitting_times

ROOT = Path(__file__).resolve().parents[1]


def minima_per_configuration(instance) -> dict:
    """The brute-force minimum of every configuration (vpp 1, cp 1, the planner's tp up to the smallest node):
    every layer split and every map of ranks to GPUs up to swaps that keep every link, by the evaluator."""
    out = {}
    for config, time_s in fitting_times(instance):
        out[config] = min(out.get(config, INF), time_s)
    return out


# the brute-force test's quick seeds (MoE, one-way links); slow: MoE on nodes of 2 and 4 GPUs, nodes of one GPU
@pytest.mark.parametrize("seed", [1, 8, 14, 15] + [pytest.param(s, marks=pytest.mark.slow) for s in (2, 10, 22, 29)])
def test_typed_bound_with_exposure_levels_is_below_every_configurations_minimum(tmp_path, seed):
    instance = instance_from_dict(cluster_dict(seed), f"mixed_bf{seed}", tmp_path)
    minima = minima_per_configuration(instance)
    if not minima:
        pytest.skip("nothing fits on this cluster")
    checked = 0
    for world in range(1, instance.cluster.num_gpus + 1):
        for config in configurations(instance, world):
            if config in minima:  # refined everywhere (refine_below and enough at INF): the exposure levels too
                assert typed_bound(instance, config, INF, INF) <= minima[config] * (1 + 1e-9), config
                checked += 1
    assert checked == len(minima)


def _mixtral():
    return load_instance(ROOT / "instances" / "mixtral_8x7b_a100_h100_64.json")


def _config(instance, **fields) -> Config:
    return next(c for c in configurations(instance, 64) if all(getattr(c, k) == v for k, v in fields.items()))


def test_exposure_levels_raise_mixtrals_bound_and_stay_below_its_plans():
    """tp 2, pp 2, dp 16, ep 8: the H100 stage that the pipeline wants loaded syncs its experts across nodes (its ep
    groups fill the nodes) or runs its ep across nodes. The composed plan (9 layers on the A100s, 23 on the H100s)
    takes 5.0739 s; T was 4.8669 s without the exposure levels."""
    instance = _mixtral()
    config = _config(instance, tp=2, pp=2, dp=16, ep=8, vpp=1, micro_batch_size=1, recompute="none")
    h100, a100 = tuple(range(32)), tuple(range(32, 64))
    plans = [evaluate(instance, placement_for(config, (q, 32 - q), a100 + h100)) for q in range(6, 12)]
    best = min(e.iteration_time_s for e in plans if e.fits)
    plain, joint = typed_bound(instance, config, 0.0, INF), typed_bound(instance, config, INF, INF)
    assert joint <= best
    assert joint > plain + 0.1  # 5.057 s against 4.867 s


def test_a_pipeline_visiting_the_a100_island_twice_beats_the_contiguous_ones():
    """tp 2, pp 8, dp 4, ep 4, vpp 2: with an A100 stage last, the four H100 stages sit where memory lets each hold
    6 layers without the output layer: 4.891 s, against 5.066 s for the best contiguous order (A100 first, 2 + 6
    layers a stage, found by brute force over every split of both orders)."""
    instance = _mixtral()
    config = _config(instance, tp=2, pp=8, dp=4, ep=4, vpp=2, micro_batch_size=1, recompute="none",
                     moe_a2a_overlap=True)
    found = [(evaluate(instance, p), p) for p in reorder.level_placements(instance, config,
                                                                          find_islands(instance.cluster))]
    estimate, placement = min(((e, p) for e, p in found if e.fits), key=lambda item: item[0].iteration_time_s)
    types = [instance.cluster.gpu_type_of(int(placement.stage_gpus(j)[0])).name for j in range(config.pp)]
    runs = sum(1 for a, b in zip(types, types[1:]) if a != b) + 1
    assert runs > len(set(types))  # some island's stages are not one contiguous run
    contiguous = [evaluate(instance, placement_for(config, split, gpus))
                  for gpus in (tuple(range(32, 64)) + tuple(range(32)), tuple(range(64)))
                  for split in ((2, 2, 2, 2, 6, 6, 6, 6), (6, 6, 6, 6, 2, 2, 2, 2), (4,) * 8)]
    assert estimate.iteration_time_s < min(e.iteration_time_s for e in contiguous if e.fits) - 0.1
