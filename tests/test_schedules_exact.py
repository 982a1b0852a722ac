"""The exact program with the pipeline schedule free (docs/schedules.md, docs/programs.md (P12')): it equals brute
force with both backends and the evaluator to 1e-6, and the bounds stay below brute force. The instances are
test_exact's 4-GPU ones on a stack that runs the zero-bubble schedules (torchtitan without torch.compile)."""

from __future__ import annotations

import itertools

import pytest
from conftest import seeds_by_backend
from test_exact import programs_match_evaluator, small_instance

from formulation import InputError, evaluate, instance_from_dict
from formulation.placement import Placement, check_placement
from solvers import solve

SEEDS = [s for s in range(20) if s % 5 != 4][:12]  # 4-GPU instances: every rank-to-GPU map enumerable


def schedule_instance(seed: int) -> dict:
    data, _ = small_instance(seed)
    data["training"].update(software_stack="torchtitan", torch_compile=False, virtual_pipeline_sizes=[1, 2],
                            pipeline_schedules=["1F1B", "Interleaved1F1B", "InterleavedZeroBubble"])
    return data


def splits(total: int, parts: int, step: int):
    if parts == 1:
        yield from ([(total,)] if total >= step and total % step == 0 else [])
        return
    for first in range(step, total - step * (parts - 1) + 1, step):
        yield from ((first,) + rest for rest in splits(total - first, parts - 1, step))


def sizes_of(job: dict, world: int):
    """Every (tp, pp, cp, dp, micro-batch, vpp, recompute, zero stage) of the job's lists on `world` GPUs."""
    for tp, pp, cp in itertools.product(range(1, world + 1), repeat=3):
        if world % (tp * pp * cp) or cp not in job["context_parallel_sizes"]:
            continue
        for mbs, vpp, recompute, zero in itertools.product(range(1, job["max_micro_batch_size"] + 1),
                                                           job["virtual_pipeline_sizes"], job["recompute"],
                                                           job["zero_stage"]):
            yield tp, pp, cp, world // (tp * pp * cp), mbs, vpp, recompute, zero


def scored_placements(instance, data, families):
    """The estimate of every placement the brute forces try: each configuration of the job's sizes, schedule family
    of `families(pp, vpp)`, layer split and GPU map that check_placement admits, scored by evaluate() alone."""
    world, layers = instance.cluster.num_gpus, instance.model.num_layers
    for tp, pp, cp, dp, mbs, vpp, recompute, zero in sizes_of(data["training"], world):
        for family, split in itertools.product(families(pp, vpp), splits(layers, pp, vpp)):
            probe = Placement(tp, pp, cp, dp, vpp, mbs, recompute, zero, split, tuple(range(world)),
                              schedule=family)
            try:
                check_placement(instance, probe, "brute force")
            except InputError:
                continue
            for gpus in itertools.permutations(range(world)):
                yield family, evaluate(instance, replace_gpus(probe, gpus), check=False)


def brute_force_with_schedules(instance, data) -> float:
    """Every configuration, schedule family, layer split and GPU map, scored by evaluate() alone."""
    def families(pp: int, vpp: int) -> list[str]:
        return ["1f1b"] + (["zero_bubble"] if pp > 1 and vpp > 1 else [])
    return min((est.iteration_time_s for _, est in scored_placements(instance, data, families) if est.fits),
               default=float("inf"))


def replace_gpus(p: Placement, gpus) -> Placement:
    from dataclasses import replace
    return replace(p, gpus=tuple(gpus))


@pytest.mark.parametrize("seed,backend", seeds_by_backend(SEEDS))
def test_search_with_schedule_free_equals_brute_force(seed, backend):
    data = schedule_instance(seed)
    instance = instance_from_dict(data)
    expected = brute_force_with_schedules(instance, data)
    assert expected < float("inf")
    result = solve(instance, solver=backend)
    assert result.solver.status == "optimal", result.solver
    assert result.estimate.iteration_time_s == pytest.approx(expected, rel=1e-6)
    assert result.solver.bound_s <= expected * (1 + 1e-9)


@pytest.mark.parametrize("seed,backend", seeds_by_backend([1, 2]))
def test_zero_bubble_programs_equal_the_evaluator(seed, backend):
    """Every configuration's program (zero-bubble ones included): objective = evaluator to 1e-6, bound below."""
    assert programs_match_evaluator(instance_from_dict(schedule_instance(seed)), backend) >= 3
