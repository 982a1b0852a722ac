"""Whole-node stages scored from tables (solvers/local/node_slots.py): the tables give evaluate()'s time on every
node order, their anneal reaches the brute-force optimum of a small cluster, and they stay out where they do not
describe the cluster."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from conftest import REPO, build_instance, small_instance_dict
from formulation import evaluate, load_instance
from formulation.placement import Config, even_split
from formulation.space import placement_for
from solvers.local.node_slots import slot_anneal, slot_placement, slot_tables, slot_time


def _plan(instance, config: Config):
    layers = [u * config.vpp for u in even_split(instance.model.num_layers // config.vpp, config.pp)]
    return placement_for(config, layers, range(instance.cluster.num_gpus))


def _six_nodes(seed: int, one_way: bool = False):
    """6 nodes x 4 H100s, node pairs i.i.d. 15-25 GB/s (each direction drawn apart with `one_way`); 24 sequences a
    batch, so tp=2 pp=3 dp=4 has 6 micro-batches (interleaving needs a multiple of pp)."""
    rng = np.random.default_rng(seed)
    links = rng.uniform(15.0, 25.0, (6, 6)).round(1)
    if not one_way:
        links = np.triu(links, 1) + np.triu(links, 1).T
    np.fill_diagonal(links, 0.0)
    return build_instance(small_instance_dict(6, 4, global_batch_size=24, node_matrix_gb_per_s=links.tolist()))


# tp=2 pp=3 dp=4 (stages of two 4-GPU nodes), with and without interleaving
SIX_NODE_CONFIGS = [Config(2, 3, 1, 4, 1, 1, "none", 1), Config(2, 3, 1, 4, 2, 1, "none", 1)]


@pytest.mark.parametrize("config", SIX_NODE_CONFIGS, ids=["vpp1", "vpp2"])
@pytest.mark.parametrize("one_way", [False, True], ids=["two-way", "one-way"])
def test_tables_give_evaluate_time_on_every_node_order(config, one_way):
    """All 720 orders of a 6-node cluster: the tables' time is evaluate()'s to 1e-9 (one-way matrices included:
    every pair runs at its slower direction, docs/links.md)."""
    instance = _six_nodes(3, one_way)
    plan = _plan(instance, config)
    tables = slot_tables(instance, plan)
    assert tables is not None and tables.nodes_per_stage == 2
    for order in itertools.permutations(range(6)):
        want = evaluate(instance, slot_placement(instance, plan, order)).iteration_time_s
        assert slot_time(tables, order) == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize("seed", range(4))
def test_slot_anneal_reaches_the_brute_force_optimum(seed):
    """The anneal from a random order ends at the best of all 720 orders (brute force over the tables, which the
    test above ties to evaluate()); what it reports is its order's time."""
    instance = _six_nodes(10 + seed)
    plan = _plan(instance, SIX_NODE_CONFIGS[seed % 2])
    tables = slot_tables(instance, plan)
    best = min(slot_time(tables, order) for order in itertools.permutations(range(6)))
    start = [int(n) for n in np.random.default_rng(seed).permutation(6)]
    found, order = slot_anneal(tables, start, 20_000, seed)
    assert sorted(order) == list(range(6))
    assert found == pytest.approx(slot_time(tables, order), rel=1e-12)
    assert found == pytest.approx(best, rel=1e-12)


def test_slot_anneal_is_deterministic_per_seed_and_beats_its_start_on_measured_16():
    """measured_16's winning configuration (tp=4 pp=8 dp=4 vpp=2): 50,000 proposals from a random order end well
    below the start (the incremental walk's time checked against evaluate()), and the same seed gives the same
    order."""
    instance = load_instance(REPO / "instances" / "measured_16.json")
    plan = _plan(instance, Config(4, 8, 1, 4, 2, 1, "none", 1))
    tables = slot_tables(instance, plan)
    start = [int(n) for n in np.random.default_rng(0).permutation(16)]
    found, order = slot_anneal(tables, start, 50_000, seed=1)
    assert found < slot_time(tables, start) - 0.01
    assert evaluate(instance, slot_placement(instance, plan, order)).iteration_time_s == pytest.approx(found, rel=1e-9)
    assert slot_anneal(tables, start, 50_000, seed=1) == (found, order)
    placed = slot_placement(instance, plan, order)  # node order[k] serves ranks 8k .. 8k + 7, its GPUs in order
    assert [int(instance.cluster.gpu_node[g]) for g in placed.gpus[::8]] == order
    assert placed.layers_per_stage == plan.layers_per_stage


def test_no_tables_where_they_do_not_describe_the_cluster():
    """Uniform links (nothing to order), a stage of half a node, ZeRO-3 (its gathers run on the dp links inside
    every layer), and one node with slower NVLink (its stage's compute depends on where it goes: the check
    against evaluate() refuses the tables)."""
    uniform = build_instance(small_instance_dict(4, 4, global_batch_size=16))
    assert slot_tables(uniform, _plan(uniform, Config(2, 2, 1, 4, 1, 1, "none", 1))) is None
    six = _six_nodes(3)
    assert slot_tables(six, _plan(six, Config(4, 6, 1, 1, 1, 1, "none", 1))) is None  # 4 GPUs a stage
    assert slot_tables(six, _plan(six, Config(2, 3, 1, 4, 1, 1, "none", 3))) is None
    rng = np.random.default_rng(3)
    links = np.triu(rng.uniform(15.0, 25.0, (6, 6)).round(1), 1)
    data = small_instance_dict(6, 4, global_batch_size=24, node_matrix_gb_per_s=(links + links.T).tolist(),
                               nodes=[{"node": "n2", "intra_node_gb_per_s": 90.0}])
    slow_nvlink = build_instance(data)
    assert slot_tables(slow_nvlink, _plan(slow_nvlink, SIX_NODE_CONFIGS[0])) is None
