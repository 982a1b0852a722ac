"""Iterated descent (solvers/local/polish.py): its end is a local optimum of every node swap and layer move, checked
one neighbour at a time with evaluate() (not with the scorer it ran on); it never worsens a plan; without a time
limit it is deterministic."""

from __future__ import annotations

import dataclasses
import itertools
import random

import pytest

from conftest import build_instance
from formulation import evaluate, load_instance
from formulation.placement import Placement
from formulation.space import Config
from solvers.local.annealing import start_scorer
from solvers.local.polish import polish
from test_annealing import irregular_dict, node_matrix_dict


def _node_swapped(instance, placement: Placement, a: int, b: int) -> Placement:
    """The placement with nodes a and b trading the ranks they serve (local index for local index)."""
    cl = instance.cluster
    ga = range(int(cl.node_offset[a]), int(cl.node_offset[a + 1]))
    gb = range(int(cl.node_offset[b]), int(cl.node_offset[b + 1]))
    relabel = {**dict(zip(ga, gb)), **dict(zip(gb, ga))}
    return dataclasses.replace(placement, gpus=tuple(relabel.get(g, g) for g in placement.gpus))


def _layer_moved(placement: Placement, src: int, dst: int) -> Placement | None:
    layers = list(placement.layers_per_stage)
    if layers[src] < 2 * placement.vpp:
        return None
    layers[src] -= placement.vpp
    layers[dst] += placement.vpp
    return dataclasses.replace(placement, layers_per_stage=tuple(layers))


def assert_local_optimum(instance, placement: Placement) -> None:
    """No node swap and no one-chunk layer move makes evaluate() faster (and still fitting)."""
    best = evaluate(instance, placement).iteration_time_s
    cl = instance.cluster
    sizes = [int(cl.node_offset[n + 1] - cl.node_offset[n]) for n in range(len(cl.nodes))]
    for a, b in itertools.combinations(range(len(cl.nodes)), 2):
        if sizes[a] == sizes[b]:
            est = evaluate(instance, _node_swapped(instance, placement, a, b), check=False)
            assert not (est.fits and est.iteration_time_s < best * (1 - 1e-9)), (a, b, est.iteration_time_s, best)
    for src, dst in itertools.permutations(range(placement.pp), 2):
        moved = _layer_moved(placement, src, dst)
        if moved is not None:
            est = evaluate(instance, moved, check=False)
            assert not (est.fits and est.iteration_time_s < best * (1 - 1e-9)), (src, dst)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_descent_ends_at_a_local_optimum_small(seed):
    """4 nodes x 2 GPUs, every node pair its own bandwidth: the descent's end, checked neighbour by neighbour."""
    instance = build_instance(node_matrix_dict(random.Random(seed), 6, 5.0, 50.0) if seed else irregular_dict(0))
    for config in (Config(1, 2, 1, 4, 1, 1, "none", 1), Config(2, 2, 1, 2, 1, 1, "none", 1)):
        start = start_scorer(instance, config).placement()
        found = polish(instance, start)
        assert found.estimate == evaluate(instance, found.placement)
        assert found.estimate.iteration_time_s <= evaluate(instance, start).iteration_time_s
        assert_local_optimum(instance, found.placement)


def test_descent_ends_at_a_local_optimum_measured_16():
    """16 nodes with all-different node-pair links (the bench's node-matrix family), auto's configuration there."""
    instance = load_instance("instances/measured_16.json")
    config = Config(4, 8, 1, 4, 2, 1, "none", 1)
    start = start_scorer(instance, config).placement()
    found = polish(instance, start)
    assert found.estimate.iteration_time_s < 0.999 * evaluate(instance, start).iteration_time_s
    assert found.estimate == evaluate(instance, found.placement)
    assert_local_optimum(instance, found.placement)
    again = polish(instance, start)
    assert again.placement == found.placement  # deterministic without a time limit


def test_kicks_keep_the_best_and_never_lose_the_descent():
    """With a time limit the kicks only ever replace the best with a better plan: the result is at most the plain
    descent's from the same start."""
    instance = build_instance(node_matrix_dict(random.Random(5), 6, 5.0, 50.0))
    config = Config(1, 2, 1, 4, 1, 1, "none", 1)
    start = start_scorer(instance, config).placement()
    plain = polish(instance, start)
    kicked = polish(instance, start, seed=1, time_limit_s=0.3)
    assert kicked.moves > plain.moves  # kicks (and the descents after them) were scored beyond the plain descent
    assert kicked.estimate.iteration_time_s <= plain.estimate.iteration_time_s
    assert [h[1] for h in kicked.history] == sorted((h[1] for h in kicked.history), reverse=True)
    assert kicked.estimate == evaluate(instance, kicked.placement)
