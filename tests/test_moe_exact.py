"""The exact program with expert groups (docs/programs.md (P14)-(P15), docs/moe.md "Search") against brute force,
with every backend (one parametrized class; a backend is skipped only where it is not installed).

Instances: tiny mixture-of-experts models (Mixtral-style 4 or 8 experts top-2, or DeepSeek-style with a dense
first layer, a shared expert and latent attention), 2-4 layers, on 4 GPUs with every GPU pair its own bandwidth
(GPU-level maps: every rank-to-GPU permutation) or 2 x 4 GPUs with uneven node links and one intra-node figure
(node-level maps), so where the expert-parallel groups lie matters. The brute force scores every configuration,
partition and map with `evaluate()`; it shares nothing with the program but the evaluator.
"""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest
from conftest import ALL_BACKENDS, seeds_by_backend
from test_bounds import brute_force_optimum
from test_oneway_uneven import bounds_below_brute_force, maps, programs_match_brute_force

from formulation import evaluate, instance_from_dict
from formulation.physics import layer_kinds
from formulation.programs.exact import build_program
from formulation.space import configurations, placement_for
from solvers import backends, solve
from solvers.bounds.configs import lower_bound

BACKENDS = ALL_BACKENDS
TIME_LIMIT_S = None  # no wall-clock limit where a proof is asserted (tests/test_exact.py)


def moe_model(rng: random.Random) -> dict:
    layers, hidden = rng.choice([2, 3, 4]), rng.choice([256, 512])
    base = {"name": "tiny-moe", "num_hidden_layers": layers, "hidden_size": hidden, "num_attention_heads": 8,
            "num_key_value_heads": rng.choice([2, 8]), "vocab_size": 4000, "hidden_act": "silu",
            "num_experts_per_tok": 2}
    if rng.random() < 0.6:  # Mixtral: every layer an MoE layer
        return {**base, "intermediate_size": 2 * hidden, "num_local_experts": rng.choice([4, 8])}
    return {**base, "intermediate_size": 3 * hidden, "n_routed_experts": rng.choice([4, 8]),
            "moe_intermediate_size": hidden, "n_shared_experts": 1, "first_k_dense_replace": 1,
            "q_lora_rank": 128, "kv_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16,
            "v_head_dim": 32}


def moe_exact_instance(seed: int) -> tuple[dict, bool]:
    """(instance dict, GPU-level maps needed)."""
    rng = random.Random(seed)
    nodes, per_node = rng.choice([(1, 4), (2, 2), (2, 4), (2, 4)])
    names = [f"n{i}" for i in range(nodes)]
    gpu_level = per_node * nodes == 4
    net: dict = {"intra_node_gb_per_s": rng.choice([100.0, 300.0]), "inter_node_gb_per_s": rng.choice([5.0, 25.0])}
    if gpu_level:  # every GPU pair its own bandwidth
        gpus = [f"{n}:{g}" for n in names for g in range(per_node)]
        net["gpu_pairs"] = [{"gpus": [a, b], "gb_per_s": round(rng.uniform(3.0, 300.0), 1)}
                            for a, b in itertools.combinations(gpus, 2) if rng.random() < 0.7]
    else:
        net["node_pairs"] = [{"nodes": ["n0", "n1"], "gb_per_s": round(rng.uniform(3.0, 30.0), 1)}]
    data = {
        "name": f"moe_exact{seed}",
        "model": moe_model(rng),
        "training": {"global_batch_size": rng.choice([4, 8]), "seq_length": rng.choice([512, 1024]),
                     "recompute": rng.sample(["none", "full"], 1), "zero_stage": rng.sample([0, 1], 1),
                     "max_micro_batch_size": 1, "context_parallel_sizes": [1], "virtual_pipeline_sizes": [1],
                     "expert_tensor_parallel_sizes": [1, 2] if rng.random() < 0.5 else [1],
                     "moe_token_dispatcher": "allgather" if rng.random() < 0.25 else "alltoall"},
        "cluster": {"gpu_types": {"h100-sxm-80gb": {}},
                    "nodes": [{"name": n, "gpu_type": "h100-sxm-80gb", "gpus": per_node} for n in names],
                    "network": net},
    }
    if gpu_level and rng.random() < 0.5:
        data["training"]["context_parallel_sizes"] = [1, 2]
    return data, gpu_level


_OPTIMA: dict = {}


def optima(seed: int):
    """The instance and the brute-force minimum of each configuration (inf: nothing fits), computed once."""
    if seed not in _OPTIMA:
        data, gpu_level = moe_exact_instance(seed)
        instance = instance_from_dict(data)
        all_maps = list(maps(instance, gpu_level))
        _OPTIMA[seed] = instance, {c: brute_force_optimum(instance, c, all_maps) for c in configurations(instance)}
    return _OPTIMA[seed]


SEEDS = list(range(12))
QUICK = [2]  # 1 x 4 GPUs, GPU-level maps, in the quick suite (every seed with -m slow)
QUICK_PROGRAMS = [4]  # every third expert configuration of seed 4 in the quick suite; the other seeds all (-m slow)


def _seeds(quick):
    return [s if s in quick else pytest.param(s, marks=pytest.mark.slow) for s in SEEDS]


def check_programs(backend: str, seed: int, every: int = 1) -> int:
    """Every `every`-th configuration with experts: the program's optimum is its brute-force minimum and its
    objective the evaluator's time of the decoded placement. Returns how many were compared."""
    instance, best = optima(seed)
    return programs_match_brute_force(instance, best, backend, [c for c in best if c.ep * c.etp > 1][::every])


@pytest.mark.parametrize("backend", BACKENDS)
class TestMoEExactAgainstBruteForce:
    @pytest.mark.parametrize("seed", _seeds(QUICK))
    def test_search_finds_the_brute_force_minimum(self, backend, seed):
        instance, best = optima(seed)
        expected = min(best.values())
        assert expected < math.inf
        result = solve(instance, solver=backend, time_limit=TIME_LIMIT_S)
        assert result.solver.status == "optimal", result.solver
        assert result.estimate.iteration_time_s == pytest.approx(expected, rel=1e-6)
        assert result.solver.bound_s <= expected * (1 + 1e-9)

    @pytest.mark.parametrize("seed", _seeds(QUICK_PROGRAMS))
    def test_program_optimum_of_every_expert_configuration(self, backend, seed):
        assert check_programs(backend, seed, every=3 if seed in QUICK_PROGRAMS else 1) >= 2


@pytest.mark.parametrize("seed", _seeds(QUICK))
def test_bounds_never_exceed_the_brute_force_optimum(seed):
    instance, best = optima(seed)
    assert bounds_below_brute_force(instance, best) >= 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_program_equals_evaluate_on_random_placements(backend):
    """The program with every map and partition fixed (x and lambda pinned to a random placement) is the evaluator
    of that placement: the objective equals evaluate() to 1e-6 for a few expert configurations."""
    instance, _ = optima(3)
    rng = np.random.default_rng(5)
    solver = backends.get(backend)
    configs = [c for c in configurations(instance) if c.ep > 1]
    compared = 0
    for index in rng.choice(len(configs), min(4, len(configs)), replace=False):
        config = configs[int(index)]
        program = build_program(instance, config)
        L, n = instance.model.num_layers, instance.cluster.num_gpus
        cuts = sorted(rng.choice(np.arange(1, L), config.pp - 1, replace=False).tolist())
        layers = [b - a for a, b in zip([0] + cuts, cuts + [L])]
        if any((i, q) not in program.layers for i, q in enumerate(partition_keys(instance, config, layers))):
            continue  # that partition does not fit
        gpus = rng.permutation(n).tolist()
        pin(program, placement_for(config, layers, gpus), instance)
        out = solver.solve(program, time_limit_s=TIME_LIMIT_S)
        assert out.status == "optimal", config
        placement = program.decode(out.values)
        assert out.objective_s == pytest.approx(evaluate(instance, placement).iteration_time_s, rel=1e-6)
        assert out.objective_s == pytest.approx(evaluate(instance, placement_for(config, layers, gpus))
                                                .iteration_time_s, rel=1e-6), config
        compared += 1
    assert compared >= 2


def partition_keys(instance, config, layers) -> tuple:
    """What the program's one-hots are over per stage: layer counts, or layer mixes where the model has dense
    and MoE layers (docs/programs.md (P2b))."""
    if layer_kinds.is_mixed(instance.model):
        return layer_kinds.stage_mixes(instance.model, layers, config.vpp)
    return tuple(layers)


def pin(program, placement, instance=None) -> None:
    """Fix the program's map and partition to `placement`'s (each rank on its GPU's class, each stage's count,
    or its layer mix given the `instance` of a model with dense and MoE layers)."""
    class_of = {g: u for u, cls in enumerate(program.classes) for g in cls}
    program.rows = [r for r in program.rows if r[3] != "P13 symmetry"]  # the pinned map need not be ordered
    for (rank, u), var in program.assign.items():
        program.add({var: 1}, "==", 1 if class_of[int(placement.gpus[rank])] == u else 0, "pinned map")
    keys = partition_keys(instance, placement, placement.layers_per_stage) if instance else placement.layers_per_stage
    for (stage, q), var in program.layers.items():
        program.add({var: 1}, "==", 1 if keys[stage] == q else 0, "pinned partition")


def test_bounds_count_the_expert_communication(monkeypatch):
    """(B3) raises the bounds of expert configurations (here by the dispatch of an ep group that must leave a
    node or cross slow pairs) and stays below brute force (checked above); the work bound (B0) is cached per
    (tp, cp, micro-batch, recompute, ep, etp), since the experts' GEMMs depend on ep and etp."""
    from solvers.bounds import parts, work
    instance, best = optima(1)
    spread = [c for c, t in best.items() if c.ep > 1 and t < math.inf]
    with_experts = {c: lower_bound(instance, c) for c in spread}
    monkeypatch.setattr(parts, "expert_layer_floor", lambda *args, **kwargs: 0.0)
    monkeypatch.setattr(work, "expert_layer_floor", lambda *args, **kwargs: 0.0)
    without = {c: lower_bound(instance, c) for c in spread}
    assert all(with_experts[c] >= without[c] for c in spread)
    assert sum(with_experts[c] > without[c] * (1 + 1e-6) for c in spread) >= len(spread) // 2
    monkeypatch.undo()
    shared = work.WorkBound(instance)
    for c in sorted(best, key=lambda c: (c.ep, c.etp)):
        assert shared(c) == work.WorkBound(instance)(c), c


# ---- models with dense and MoE layers (docs/moe.md (E1), docs/programs.md (P2b)) ---------------------------------

def mixed_kinds_instance(seed: int) -> tuple[dict, bool]:
    """(instance dict, GPU-level maps needed): a DeepSeek-style model of 4-6 layers whose first 1 or 2 are dense
    (and, sometimes, only every second layer after them MoE), a dense FFN wider than the experts' so the kinds
    differ in time and memory, on 3 or 4 GPUs (GPU-level maps) or 2 x 3 GPUs (node-level maps, pp up to 3),
    sometimes with interleaving (vpp 2: each stage's chunks hold layers of both halves of the model, (E1a));
    the GPU memory set between what the fullest stage of two partitions needs, so memory decides some splits."""
    rng = random.Random(1000 + seed)
    layers, hidden = rng.choice([4, 5, 6]), rng.choice([256, 512])
    nodes, per_node = rng.choice([(1, 4), (2, 2), (1, 3), (2, 3)])
    names = [f"n{i}" for i in range(nodes)]
    gpu_level = nodes * per_node <= 4
    net: dict = {"intra_node_gb_per_s": rng.choice([100.0, 300.0]), "inter_node_gb_per_s": rng.choice([5.0, 25.0])}
    if gpu_level:
        gpus = [f"{n}:{g}" for n in names for g in range(per_node)]
        net["gpu_pairs"] = [{"gpus": [a, b], "gb_per_s": round(rng.uniform(3.0, 300.0), 1)}
                            for a, b in itertools.combinations(gpus, 2) if rng.random() < 0.7]
    else:
        net["node_pairs"] = [{"nodes": ["n0", "n1"], "gb_per_s": round(rng.uniform(3.0, 30.0), 1)}]
    model = {"name": "tiny-mixed", "num_hidden_layers": layers, "hidden_size": hidden, "num_attention_heads": 8,
             "num_key_value_heads": 8, "vocab_size": 4000, "hidden_act": "silu", "num_experts_per_tok": 2,
             "intermediate_size": rng.choice([4, 8]) * hidden, "n_routed_experts": rng.choice([4, 8]),
             "moe_intermediate_size": hidden, "n_shared_experts": 1,
             "first_k_dense_replace": rng.choice([1, 2]), "moe_layer_freq": 2 if rng.random() < 0.3 else 1}
    if rng.random() < 0.5:
        model.update({"q_lora_rank": 128, "kv_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16,
                      "v_head_dim": 32})
    data = {
        "name": f"mixed_kinds{seed}", "model": model,
        "training": {"global_batch_size": rng.choice([4, 8]), "seq_length": rng.choice([512, 1024]),
                     "recompute": rng.sample(["none", "full"], 1), "zero_stage": rng.sample([0, 1], 1),
                     "max_micro_batch_size": 1, "context_parallel_sizes": [1],
                     "virtual_pipeline_sizes": [1, 2] if layers % 2 == 0 and rng.random() < 0.7 else [1],
                     "moe_token_dispatcher": "allgather" if rng.random() < 0.25 else "alltoall"},
        "cluster": {"gpu_types": {"h100-sxm-80gb": {}},
                    "nodes": [{"name": n, "gpu_type": "h100-sxm-80gb", "gpus": per_node} for n in names],
                    "network": net},
    }
    data["cluster"]["gpu_types"]["h100-sxm-80gb"] = {"memory_gib": _binding_memory(data, rng),
                                                     "runtime_overhead_gib": 1.0}
    return data, gpu_level


def _binding_memory(data: dict, rng: random.Random) -> float:
    """A GPU memory between the fullest stage of two random partitions of a random configuration (GiB)."""
    from formulation.evaluate import evaluate as score
    from formulation.placement import Placement
    data = {**data, "cluster": {**data["cluster"], "gpu_types": {"h100-sxm-80gb": {"runtime_overhead_gib": 1.0}}}}
    instance = instance_from_dict(data)
    config = rng.choice([c for c in configurations(instance) if c.pp > 1 and c.vpp == 1])
    L = instance.model.num_layers
    peaks = []
    for _ in range(2):
        cuts = sorted(rng.sample(range(1, L), config.pp - 1))
        layers = [b - a for a, b in zip([0] + cuts, cuts + [L])]
        p = placement_for(config, layers, range(config.tp * config.pp * config.cp * config.dp))
        assert isinstance(p, Placement)
        peaks.append(score(instance, p, check=False).peak_memory_gib)
    limit = instance.training.memory_limit_fraction
    return round((min(peaks) + (max(peaks) - min(peaks)) * rng.uniform(0.2, 0.8)) / limit + 1e-3, 4)


_MIXED: dict = {}


def mixed_optima(seed: int):
    """The instance and the brute-force minimum of each configuration, computed once."""
    if seed not in _MIXED:
        data, gpu_level = mixed_kinds_instance(seed)
        instance = instance_from_dict(data)
        assert layer_kinds.is_mixed(instance.model)
        all_maps = list(maps(instance, gpu_level))
        _MIXED[seed] = instance, {c: brute_force_optimum(instance, c, all_maps) for c in configurations(instance)}
    return _MIXED[seed]


MIXED_SEEDS = list(range(16))
MIXED_QUICK = [0, 3]


@pytest.mark.parametrize("seed,backend",
                         seeds_by_backend(MIXED_SEEDS, slow_seeds=set(MIXED_SEEDS) - set(MIXED_QUICK)))
def test_mixed_kinds_program_optimum_is_brute_force(backend, seed):
    """Every configuration of a model with dense and MoE layers: the program's optimum is the brute-force minimum
    over every partition and map, and its objective the evaluator's time of the decoded placement (P2b, P8b)."""
    instance, best = mixed_optima(seed)
    assert programs_match_brute_force(instance, best, backend) >= 1
    assert any(c.pp > 1 for c, t in best.items() if t < math.inf)


@pytest.mark.parametrize("seed", [s if s in MIXED_QUICK else pytest.param(s, marks=pytest.mark.slow)
                                  for s in MIXED_SEEDS])
def test_mixed_kinds_bounds_never_exceed_brute_force(seed):
    """(B0)-(B3) with the dense-layer discount stay below the brute-force minimum of every configuration."""
    from solvers.bounds.work import WorkBound
    instance, best = mixed_optima(seed)
    assert bounds_below_brute_force(instance, best) >= 1
    work = WorkBound(instance)
    for config, expected in best.items():
        if expected < math.inf:
            assert work(config) <= expected * (1 + 1e-9), config


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed", [2] + [pytest.param(s, marks=pytest.mark.slow) for s in (4, 6)])
def test_mixed_kinds_with_interleaving_program_optimum_is_brute_force(backend, seed):
    """vpp 2 (each stage's two chunks hold layers from both halves of the model, the MoE counts from the folded
    prefix (E1a)), GPU memory roomy: every interleaved configuration's program optimum is the brute-force
    minimum and the evaluator's time of its plan."""
    data, gpu_level = mixed_kinds_instance(seed)
    data["model"]["num_hidden_layers"] = 6
    data["model"]["first_k_dense_replace"] = 1 if seed == 4 else 2
    data["training"].update({"virtual_pipeline_sizes": [2], "global_batch_size": 8})
    data["cluster"]["gpu_types"]["h100-sxm-80gb"] = {}
    instance = instance_from_dict(data)
    all_maps = list(maps(instance, gpu_level))
    best = {c: brute_force_optimum(instance, c, all_maps) for c in configurations(instance) if c.vpp == 2}
    assert programs_match_brute_force(instance, best, backend) >= 1
