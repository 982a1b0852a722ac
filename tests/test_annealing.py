"""Simulated annealing (solvers/local/annealing.py) and its incremental scorer (solvers/local/fast_score.py).

The scorer must equal evaluate() on every proposal, accepted or not; annealing must be deterministic per seed,
never return a placement that does not fit, never beat brute force (it is a heuristic) and usually match it.
`python tests/bench_annealing.py` prints the per-move cost against evaluate() on h100_128 and on 1,024 GPUs.
"""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from conftest import H100_128, JumpingClock, build_instance, small_instance_dict
from formulation import InfeasibleError, evaluate, load_instance
from formulation.placement import check_placement
from formulation.space import Config, configurations, placement_for
from solvers.local.annealing import anneal, start_scorer
from solvers.local.moves import Moves


@pytest.fixture(scope="module")
def h100():
    return load_instance(H100_128)


def node_matrix_dict(rng: random.Random, layers: int, low: float, high: float) -> dict:
    """4 nodes x 2 GPUs, every node pair its own bandwidth drawn in [low, high]."""
    data = small_instance_dict(4, 2, global_batch_size=8, seq_length=1024)
    data["model"]["num_hidden_layers"] = layers
    M = [[0.0] * 4 for _ in range(4)]
    for i, j in itertools.combinations(range(4), 2):
        M[i][j] = M[j][i] = round(rng.uniform(low, high), 1)
    data["cluster"]["network"]["node_matrix_gb_per_s"] = M
    return data


def irregular_dict(seed: int = 0) -> dict:
    """4 nodes x 2 GPUs: irregular node matrix, cross-node GPU-pair overrides, an asymmetric NVLink pair."""
    data = node_matrix_dict(random.Random(seed), 6, 5.0, 50.0)
    net = data["cluster"]["network"]
    net["gpu_pairs"] = [{"gpus": ["n0:1", "n2:0"], "gb_per_s": 3.0}, {"gpus": ["n1:0", "n3:1"], "gb_per_s": 80.0}]
    return data


def mixed_types_dict() -> dict:
    """2 H100 nodes + 2 A100-40GB nodes (smaller and slower): stage types and memory depend on the map."""
    data = small_instance_dict(4, 2, global_batch_size=8, seq_length=2048)
    data["cluster"]["gpu_types"]["a100-sxm-40gb"] = {"preset": "a100-sxm-40gb"}
    for node in data["cluster"]["nodes"][2:]:
        node["gpu_type"] = "a100-sxm-40gb"
    data["cluster"]["network"]["nodes"] = [{"node": "n3", "inter_node_gb_per_s": 12.0}]
    return data


def asymmetric_dict() -> dict:
    """One node of 4 GPUs with a full, asymmetric GPU matrix (rows equal, columns not)."""
    data = small_instance_dict(1, 4, global_batch_size=8, seq_length=1024)
    data["cluster"]["network"]["gpu_matrix_gb_per_s"] = [[0, 100, 100, 100], [100, 0, 100, 100],
                                                          [30, 30, 0, 300], [300, 300, 300, 0]]
    return data


def walk(instance, config: Config, steps: int, seed: int = 0, check_every: int = 1, node_only: bool = False) -> int:
    """Random moves with random acceptance; every checked proposal, accepted or not, must score as evaluate()
    does (None exactly when it does not fit). Returns the number of proposals checked."""
    rng = np.random.default_rng(seed)
    sc = start_scorer(instance, config)
    moves = Moves(sc, rng, node_only=node_only)
    checked = 0
    for step in range(steps):
        out = moves.propose()
        if out is None:
            continue
        kind, total = out
        if step % check_every == 0:
            est = evaluate(instance, sc.proposed_placement())
            assert (total is not None) == est.fits, (kind, config)
            if total is not None:
                assert total == pytest.approx(est.iteration_time_s, rel=1e-9, abs=0), (kind, config)
            checked += 1
        if total is not None and rng.random() < 0.5:
            moves.commit(kind, total)
        else:
            sc.reject()
    est = evaluate(instance, sc.placement())
    assert est.fits and sc.total == pytest.approx(est.iteration_time_s, rel=1e-9, abs=0)
    return checked


def pick(instance, **want) -> list[Config]:
    return [c for c in configurations(instance) if all(getattr(c, k) == v for k, v in want.items())]


# ---- the incremental scorer equals evaluate() -----------------------------------------------------------------

def test_scorer_equals_evaluate_h100(h100):
    configs = [Config(8, 4, 1, 4, 1, 1, "selective", 1), Config(4, 4, 2, 4, 5, 1, "none", 1),
               Config(2, 16, 1, 4, 2, 1, "full", 0), Config(1, 16, 2, 4, 1, 1, "full", 1)]
    for k, config in enumerate(configs):
        assert config in set(configurations(h100))
        assert walk(h100, config, 200, seed=k, check_every=5) >= 30


@pytest.mark.parametrize("make", [irregular_dict, mixed_types_dict, asymmetric_dict])
def test_scorer_equals_evaluate_on_random_placements(make):
    """A scorer built on a random GPU map and a random split scores it as evaluate() does (fits or not)."""
    from solvers.local.fast_score import FastScorer

    instance = build_instance(make())
    rng = random.Random(5)
    configs = list(configurations(instance))
    n, L = instance.cluster.num_gpus, instance.model.num_layers
    compared = 0
    for config in rng.sample(configs, min(25, len(configs))):
        units = L // config.vpp
        if L % config.vpp or units < config.pp:
            continue
        cuts = sorted(rng.sample(range(1, units), config.pp - 1))
        layers = [config.vpp * (b - a) for a, b in zip([0] + cuts, cuts + [units])]
        perm = rng.sample(range(n), n)
        sc = FastScorer(instance, config, layers, perm)
        est = evaluate(instance, sc.placement())
        assert sc.fits == est.fits
        assert sc.total == pytest.approx(est.iteration_time_s, rel=1e-12, abs=0), config
        compared += 1
    assert compared >= 10


def test_node_moves_score_as_evaluate_and_move_whole_nodes(h100):
    """Pipette's node moves (swap, insert, segment-reverse over the node order) score as evaluate() does, and
    a node-only anneal keeps every node's GPUs together: each node's ranks are served by one node."""
    config = Config(4, 4, 1, 8, 1, 1, "selective", 1)
    assert walk(h100, config, 300, seed=3, check_every=3, node_only=True) >= 50
    result = anneal(h100, config, seed=1, max_moves=600, node_only=True)
    cl = h100.cluster
    for start in range(0, len(result.placement.gpus), 8):  # default map: 8 consecutive ranks per node
        block = result.placement.gpus[start:start + 8]
        assert len({int(cl.gpu_node[g]) for g in block}) == 1
        assert [int(cl.gpu_local[g]) for g in block] == list(range(8))
    assert result.estimate.iteration_time_s <= result.start_s


@pytest.mark.parametrize("make", [small_instance_dict, irregular_dict, mixed_types_dict, asymmetric_dict])
def test_scorer_equals_evaluate_small(make):
    """Uniform and irregular bandwidth, GPU-pair overrides, mixed GPU types, an asymmetric matrix; vpp > 1,
    cp > 1, ZeRO-3 and every recompute among the configurations walked."""
    instance = build_instance(make())
    configs = list(configurations(instance))
    rng = random.Random(1)
    chosen = [c for c in configs if c.vpp > 1][:2] + [c for c in configs if c.cp > 1][:2] + \
        [c for c in configs if c.zero_stage == 3][:2] + rng.sample(configs, 6)
    assert any(c.vpp > 1 for c in chosen) and any(c.cp > 1 for c in chosen)
    checked = 0
    for k, config in enumerate(chosen):
        try:
            checked += walk(instance, config, 120, seed=k)
        except InfeasibleError:
            continue
    assert checked > 300


def test_scorer_with_spare_gpus():
    """A configuration on part of the cluster: swaps bring spare GPUs in."""
    instance = build_instance(irregular_dict())
    configs = list(configurations(instance, world_size=4))
    for k, config in enumerate(configs[:6]):
        walk(instance, config, 100, seed=k)


# ---- annealing -----------------------------------------------------------------------------------------------

def test_deterministic_per_seed(h100):
    config = Config(4, 4, 2, 4, 5, 1, "none", 1)
    a = anneal(h100, config, seed=3, max_moves=1500)
    b = anneal(h100, config, seed=3, max_moves=1500, time_limit_s=600)
    assert a.placement == b.placement and a.estimate.iteration_time_s == b.estimate.iteration_time_s
    assert (a.moves, a.accepted) == (b.moves, b.accepted) and a.moves == 1500
    assert [h[1] for h in a.history] == [h[1] for h in b.history]
    assert a.estimate.iteration_time_s <= a.start_s and a.estimate == evaluate(h100, a.placement)


def test_time_limit_only(h100, monkeypatch):
    """A time limit alone (no move budget) ends the run at the limit: with one reading of the clock per move
    (1 ms each here) a 0.5 s limit stops it after about 500 moves, and the result still fits."""
    from solvers.local import annealing
    monkeypatch.setattr(annealing, "time", JumpingClock(step_s=0.001))
    result = anneal(h100, Config(8, 4, 1, 4, 1, 1, "selective", 1), seed=0, time_limit_s=0.5)
    assert 0 < result.moves <= 500 and result.estimate.fits
    assert result.wall_time_s >= 0.5  # stopped by the clock, not by a move budget


def test_improves_bad_start(h100):
    """Tensor-parallel groups spread over 8 nodes each: annealing pulls them back inside nodes."""
    config = Config(8, 4, 1, 4, 1, 1, "selective", 1)
    scattered = tuple((r % 16) * 8 + (r // 16) for r in range(128))
    bad = placement_for(config, (20, 20, 20, 20), scattered)
    check_placement(h100, bad, "bad")
    result = anneal(h100, config, seed=0, max_moves=3000, start=bad)
    default = evaluate(h100, placement_for(config, (20, 20, 20, 20), range(128))).iteration_time_s
    assert result.start_s == evaluate(h100, bad).iteration_time_s
    assert result.estimate.fits and result.estimate.iteration_time_s < 0.8 * result.start_s
    assert result.estimate.iteration_time_s < 1.02 * default
    assert len(result.history) > 1 and result.history[-1][1] == result.estimate.iteration_time_s


def _tight_dict() -> dict:
    data = small_instance_dict(2, 4, global_batch_size=8, seq_length=2048)
    data["model"]["num_hidden_layers"] = 7
    data["cluster"]["gpu_types"]["h100-sxm-80gb"] = {"preset": "h100-sxm-80gb", "memory_gib": 5.2,
                                                      "runtime_overhead_gib": 1.0}
    return data


def _some_split_fits(instance, config: Config) -> bool:
    L, pp, vpp = instance.model.num_layers, config.pp, config.vpp
    world = config.tp * config.pp * config.cp * config.dp
    for split in itertools.product(range(vpp, L + 1, vpp), repeat=pp):
        if sum(split) == L and evaluate(instance, placement_for(config, split, range(world)), check=False).fits:
            return True
    return False


@pytest.mark.parametrize("make", [_tight_dict, small_instance_dict])
def test_every_configuration_fits_or_is_infeasible(make):
    """Every configuration the exact planner handles: annealing returns a fitting placement, or raises
    InfeasibleError exactly when no layer split fits (tight memory: many defaults do not fit)."""
    instance = build_instance(make())
    ran = 0
    for k, config in enumerate(configurations(instance)):
        if not _some_split_fits(instance, config):
            with pytest.raises(InfeasibleError):
                anneal(instance, config, seed=k, max_moves=10)
            continue
        result = anneal(instance, config, seed=k, max_moves=25)
        assert result.estimate.fits and result.estimate == evaluate(instance, result.placement)
        ran += 1
    assert ran >= 10


def test_start_that_does_not_fit_is_repaired():
    instance = build_instance(_tight_dict())
    config = next(c for c in configurations(instance) if c.pp == 4 and c.vpp == 1 and _some_split_fits(instance, c)
                  and not evaluate(instance, placement_for(c, (1, 1, 1, 4), range(8)), check=False).fits)
    bad = placement_for(config, (1, 1, 1, 4), range(8))
    result = anneal(instance, config, seed=0, max_moves=200, start=bad)
    assert result.estimate.fits and result.placement.layers_per_stage != (1, 1, 1, 4)


# ---- against brute force ------------------------------------------------------------------------------------

def brute_force(instance, config: Config) -> float:
    """evaluate() over every layer split and every rank-to-GPU map up to uniform classes (GPUs of one class
    are interchangeable: the evaluator cannot tell such maps apart)."""
    classes = instance.cluster.uniform_classes()
    label = [None] * instance.cluster.num_gpus
    for k, members in enumerate(classes):
        for g in members:
            label[g] = k
    L, pp, vpp = instance.model.num_layers, config.pp, config.vpp
    splits = [s for s in itertools.product(range(vpp, L + 1, vpp), repeat=pp) if sum(s) == L]
    best = float("inf")
    for labels in set(itertools.permutations(label)):
        used = [0] * len(classes)
        gpus = []
        for k in labels:
            gpus.append(classes[k][used[k]])
            used[k] += 1
        for split in splits:
            est = evaluate(instance, placement_for(config, split, gpus), check=False)
            if est.fits:
                best = min(best, est.iteration_time_s)
    return best


def four_gpu_dict(seed: int) -> dict:
    """One node of 4 GPUs, every GPU pair its own bandwidth (as tests/test_exact.py's small instances)."""
    rng = random.Random(seed)
    data = small_instance_dict(1, 4, global_batch_size=8, seq_length=1024)
    data["model"]["num_hidden_layers"] = rng.choice([4, 5, 6])
    data["cluster"]["network"]["gpu_pairs"] = [
        {"gpus": [f"n0:{a}", f"n0:{b}"], "gb_per_s": round(rng.uniform(2, 300), 1)}
        for a, b in itertools.combinations(range(4), 2)]
    return data


def eight_gpu_dict(seed: int) -> dict:
    """4 nodes x 2 GPUs with an irregular node matrix: 2,520 distinct maps."""
    return node_matrix_dict(random.Random(seed), 4, 2.0, 60.0)


def test_never_better_than_brute_force_and_usually_equal():
    cases = []
    for seed in range(4):
        instance = build_instance(four_gpu_dict(seed))
        rng = random.Random(seed)
        cases += [(instance, c) for c in rng.sample(list(configurations(instance)), 6)]
    instance = build_instance(eight_gpu_dict(0))
    cases += [(instance, c) for c in configurations(instance)
              if c.pp == 2 and c.micro_batch_size == 1 and c.recompute == "none" and c.zero_stage == 1][:2]
    equal = 0
    for k, (instance, config) in enumerate(cases):
        optimum = brute_force(instance, config)
        if optimum == float("inf"):
            continue
        result = anneal(instance, config, seed=k, max_moves=1500)
        assert result.estimate.iteration_time_s >= optimum * (1 - 1e-9), config
        equal += result.estimate.iteration_time_s <= optimum * (1 + 1e-9)
    assert equal >= 0.8 * len(cases), (equal, len(cases))


def cluster_1024_dict(seed: int = 7) -> dict:
    """128 DGX-H100-like nodes in 4 leaf groups of 32 (48 GB/s inside, 30 across), one half-speed NIC."""
    rng = random.Random(seed)
    data = small_instance_dict(128, 8, global_batch_size=1024, seq_length=8192)
    data["model"] = {"preset": "llama3-70b"}
    data["training"].update(virtual_pipeline_sizes=[1, 2, 4, 5], zero_stage=[0, 1])
    M = [[0.0] * 128 for _ in range(128)]
    for i, j in itertools.combinations(range(128), 2):
        M[i][j] = M[j][i] = round((48.0 if i // 32 == j // 32 else 30.0) * rng.uniform(0.97, 1.03), 1)
    data["cluster"]["network"].update(node_matrix_gb_per_s=M, nodes=[{"node": "n5", "inter_node_gb_per_s": 24.0}])
    return data


def test_relocation_gathers_weak_nodes_on_a_light_stage(monkeypatch):
    """Two slow-NIC nodes in two stages: the slowest stage's dp sync counts, so moving either alone gains less
    than moving both onto one stage, which the gathering step does (and never makes it worse). Since a ring's
    levels run at once (rail_ring) that stage is the middle one, whose dp message is smaller than the last
    stage's with the output layer, not the stage with the fewest layers (and with the weak nodes in stages 0 and
    1, one greedy move already joins them there)."""
    from solvers.local import relocate

    data = small_instance_dict(6, 2, global_batch_size=32, seq_length=4096)
    data["cluster"]["network"]["nodes"] = [{"node": "n1", "inter_node_gb_per_s": 6.0},
                                           {"node": "n5", "inter_node_gb_per_s": 6.0}]
    instance = build_instance(data)
    config = next(c for c in configurations(instance) if (c.tp, c.pp, c.cp, c.vpp, c.micro_batch_size, c.zero_stage,
                                                          c.recompute) == (1, 3, 1, 1, 1, 1, "none"))
    start = placement_for(config, (3, 3, 2), range(12))  # n1 in stage 0, n5 in stage 2
    gathered = relocate.relocate_weak_nodes(instance, start)
    monkeypatch.setattr(relocate, "_gather", lambda instance, placement, gpus, best, weak, deadline: gpus)
    greedy = relocate.relocate_weak_nodes(instance, start)
    stage = {int(instance.cluster.gpu_node[g]): r // 4 for r, g in enumerate(gathered.gpus)}
    assert stage[1] == stage[5] == 1
    assert evaluate(instance, gathered).iteration_time_s < evaluate(instance, greedy).iteration_time_s * (1 - 1e-9)

