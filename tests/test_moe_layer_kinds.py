"""Models with dense and MoE layers (docs/moe.md (E1)): each stage is costed from its own layers' kinds.

By hand: a stage of k dense layers against one of k MoE layers (time and weights); the stages' mixes follow
Megatron-LM's layer order, with interleaving too; a model of one kind scores as before (its layer is the mean
layer); the partition program (solvers/local/partition.py) finds the brute-force best partition of a fixed map
with both backends; the incremental scorer's partition moves equal evaluate(). The exact program against brute
force is in tests/test_moe_exact.py.
"""

from __future__ import annotations

import dataclasses
import itertools
import random

import numpy as np
import pytest
from conftest import ALL_BACKENDS, build_instance, small_instance_dict
from test_bounds import splits

from formulation import evaluate
from formulation.evaluate import stage_estimate
from formulation.stage_links import group_comm, stage_links
from formulation.physics import cost, layer_kinds, moe_cost
from formulation.physics.layer_kinds import LayerMix
from formulation.physics.stage import stage_constants
from formulation.placement import default_placement
from formulation.space import configurations, layer_capacity, memory_feasible, placement_for
from solvers.local.fast_score import FastScorer
from solvers.local.partition import best_partition
from solvers.outputs.export import parse_pipeline_layout, pipeline_layout

GIB = float(1 << 30)
BACKENDS = ALL_BACKENDS
DEEPSEEK_STYLE = {"name": "tiny-deepseek", "num_hidden_layers": 8, "hidden_size": 512, "intermediate_size": 4096,
                  "num_attention_heads": 8, "num_key_value_heads": 8, "vocab_size": 4000, "hidden_act": "silu",
                  "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 256,
                  "n_shared_experts": 1, "first_k_dense_replace": 3}


def mixed_instance(nodes=1, per_node=4, model=None, **training):
    data = small_instance_dict(nodes, per_node, global_batch_size=8, seq_length=1024)
    data["model"] = dict(model or DEEPSEEK_STYLE)
    data["training"].update({"zero_stage": [1], "context_parallel_sizes": [1], "recompute": ["none"], **training})
    return build_instance(data)


def test_a_stage_of_dense_layers_is_cheaper_than_one_of_moe_layers_by_hand():
    """Stage 0 of tp 1, pp 2, dp 2, ep 2 on one node, no recompute: k MoE layers take k x (3 (f_m - f_d) +
    4 all-to-alls) longer than k dense layers (backward = 2 x forward compute; dispatch + combine forward and
    again backward, each all-to-all (ep - 1) / ep of k T rho 2h bytes at the NVLink share + one latency), and
    hold k x 2 bytes x (dense MLP - shared expert - router - E / ep experts) fewer weights."""
    inst = mixed_instance()
    model, job, cluster = inst.model, inst.training, inst.cluster
    p = default_placement(inst, tp=1, pp=2, dp=2, ep=2)
    links = stage_links(inst, p, 0)
    h, f, f_e, E = 512, 4096, 256, 8
    tokens = 1024  # micro-batch 1 x seq 1024, tp 1
    message = 2 * tokens * 1.25 * 2 * h  # top-2 copies x imbalance x 2 bytes x h
    intra_eff = cost.collective_efficiency(cluster)[0]
    bw = cluster.intra_gb_per_s[0][0, 1]
    all_to_all = (2 - 1) / 2 * message / (intra_eff * bw * 1e9) + cluster.intra_latency_s
    assert group_comm(inst, p, "ep", cost.group_links(cluster, p.moe_ep_groups(0)[0])) == pytest.approx(
        2 * all_to_all, rel=1e-12)
    f_m = moe_cost.layer_compute(model, job, p, links.gpu_type, "moe").forward
    f_d = moe_cost.layer_compute(model, job, p, links.gpu_type, "dense").forward
    for k in (1, 2, 3):
        dense = stage_estimate(inst, p, 0, k, links, LayerMix(k, 0))
        moe = stage_estimate(inst, p, 0, k, links, LayerMix(0, k))
        assert dense.ep_comm_s == 0.0
        assert moe.ep_comm_s == pytest.approx(k * 4 * all_to_all, rel=1e-12)
        assert moe.time_per_micro_batch_s - dense.time_per_micro_batch_s == pytest.approx(
            k * (3 * (f_m - f_d) + 4 * all_to_all), rel=1e-9)
        saved = k * 2 * (3 * h * f - 3 * h * f_e - h * E - E * 3 * h * f_e / 2)  # bytes of bf16 weights
        assert dense.memory.weights_gib - moe.memory.weights_gib == pytest.approx(saved / GIB, rel=1e-9)
    # and a stage of the evaluated plan holds what its range holds: layers 0-3 are 3 dense + 1 MoE
    est = evaluate(inst, placement_for(p, (4, 4), p.gpus))
    assert est.stages[0].ep_comm_s == pytest.approx(4 * all_to_all, rel=1e-12)
    assert est.stages[1].ep_comm_s == pytest.approx(4 * 4 * all_to_all, rel=1e-12)


@pytest.mark.parametrize("pattern_keys", [{"first_k_dense_replace": 3}, {"first_k_dense_replace": 1,
                                                                           "moe_layer_freq": 2}])
def test_stage_mixes_follow_megatrons_layer_order_with_interleaving(pattern_keys):
    """Chunk c of stage i is virtual stage c pp + i (Megatron's layout); each stage's dense and MoE layers
    counted from the layout string equal layer_kinds.stage_mixes, for vpp 1, 2 and 4."""
    model = build_instance({**small_instance_dict(1, 4), "model": {**DEEPSEEK_STYLE, **pattern_keys}}).model
    pattern = model.moe.layer_pattern
    for pp, vpp in ((2, 1), (2, 2), (2, 4), (4, 2)):
        for split in splits(model.num_layers, pp, vpp):
            parsed = parse_pipeline_layout(pipeline_layout(tuple(split), vpp), pp)
            sizes = [parsed[s][c] for c in range(vpp) for s in range(pp)]  # virtual stages in layer order
            starts = list(itertools.accumulate([0] + sizes))
            owner = [v % pp for v in range(pp * vpp)]
            moe = [sum(sum(pattern[starts[v]:starts[v + 1]]) for v in range(pp * vpp) if owner[v] == s)
                   for s in range(pp)]
            mixes = layer_kinds.stage_mixes(model, split, vpp)
            assert [m.moe for m in mixes] == moe, (pp, vpp, split)
            assert [m.total for m in mixes] == list(split)


def test_a_model_of_one_kind_has_its_layer_as_the_mean_layer():
    """Mixtral (every layer MoE) and a dense model: the kind's constants are the mean layer's, to the bit."""
    data = small_instance_dict(2, 8, global_batch_size=64, seq_length=4096)
    mixtral = build_instance({**data, "model": {"preset": "mixtral-8x7b"}})
    dense = build_instance(small_instance_dict(1, 4))
    for inst, kind in ((mixtral, "moe"), (dense, "dense")):
        p = default_placement(inst, tp=2, pp=2, ep=2 if inst.model.moe else 1)
        gpu = next(iter(inst.cluster.gpu_types.values()))
        assert stage_constants(inst, p, 1, gpu, kind) == stage_constants(inst, p, 1, gpu)
        assert not layer_kinds.is_mixed(inst.model)


def test_capacity_is_the_most_layers_of_any_range_that_fits():
    """layer_capacity of a model with dense and MoE layers: the most layers of any range the stage can hold
    within memory (the lower bounds need it to be no less). The dense layers are the heavier here (ep 2 leaves
    4 small experts a GPU): memory between stage 0's first 3 and 4 layers lets stage 1 hold more."""
    data = small_instance_dict(1, 4, global_batch_size=8, seq_length=1024)
    data["model"] = dict(DEEPSEEK_STYLE)
    data["training"].update({"zero_stage": [1], "context_parallel_sizes": [1], "recompute": ["none"]})
    roomy = build_instance(data)
    p = default_placement(roomy, tp=1, pp=2, dp=2, ep=2)
    links = stage_links(roomy, p, 0)
    needs = [stage_estimate(roomy, p, 0, mix.total, links, mix).memory.total_gib
             for mix in (LayerMix(3, 0), LayerMix(3, 1))]
    fraction = roomy.training.memory_limit_fraction
    data["cluster"]["gpu_types"] = {"h100-sxm-80gb": {"preset": "h100-sxm-80gb", "memory_gib": sum(needs) / 2 / fraction}}
    tight = build_instance(data)
    gpu = next(iter(tight.cluster.gpu_types.values()))
    for i in range(2):
        fitting = [m.total for m in layer_kinds.possible_mixes(tight.model, 2, 1, i)
                   if stage_estimate(tight, p, i, m.total, stage_links(tight, p, i), m).memory.fits]
        assert layer_capacity(tight, p, i, gpu) == max(fitting)
    assert layer_capacity(tight, p, 0, gpu) == 3 < layer_capacity(tight, p, 1, gpu) < tight.model.num_layers


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed", range(3))
def test_partition_program_finds_the_best_partition_of_a_map(backend, seed):
    """best_partition (one-hot mixes linked to boundaries) = the best of every partition of a random map."""
    inst = mixed_instance(nodes=2, per_node=4, model={**DEEPSEEK_STYLE, "num_hidden_layers": 7})
    rng = random.Random(seed)
    configs = [c for c in configurations(inst) if c.pp in (2, 4) and c.vpp == 1]
    compared = 0
    for config in rng.sample(configs, min(3, len(configs))):
        gpus = rng.sample(range(inst.cluster.num_gpus), config.tp * config.pp * config.cp * config.dp)
        probe = placement_for(config, next(splits(inst.model.num_layers, config.pp, 1)), gpus)
        scores = [evaluate(inst, dataclasses.replace(probe, layers_per_stage=tuple(s)), check=False)
                  for s in splits(inst.model.num_layers, config.pp, 1)]
        best = min((e.iteration_time_s for e in scores if e.fits), default=None)
        found = best_partition(inst, probe, solver=backend)
        if best is None:
            assert found is None
            continue
        assert evaluate(inst, found).iteration_time_s == pytest.approx(best, rel=1e-9), config
        compared += 1
    assert compared >= 2


def test_scorer_partition_moves_equal_evaluate():
    """The incremental scorer re-costs every stage whose range changes (its mix), not only those whose count
    does: each proposed partition scores as evaluate() does."""
    inst = mixed_instance(nodes=2, per_node=4)
    rng = np.random.default_rng(1)
    compared = 0
    for config in [c for c in configurations(inst) if c.pp >= 2 and c.vpp == 1][:6]:
        L = inst.model.num_layers
        options = list(splits(L, config.pp, 1))
        perm = rng.permutation(inst.cluster.num_gpus).tolist()
        sc = FastScorer(inst, config, options[0], perm)
        for index in rng.choice(len(options), min(8, len(options)), replace=False):
            layers = list(options[int(index)])
            total = sc.propose_layers(layers)
            est = evaluate(inst, sc.proposed_placement(), check=False)
            if total is None:
                assert not est.fits
                sc.reject()
                continue
            assert total == pytest.approx(est.iteration_time_s, rel=1e-12, abs=0), (config, layers)
            sc.commit(total)
            compared += 1
    assert compared >= 10


def test_cheap_memory_check_counts_each_stage_kinds():
    """space.memory_feasible (the search's check of default placements) sees each stage's dense layers: its
    worst excess is the evaluator's on every partition of a one-type cluster."""
    inst = mixed_instance()
    p = default_placement(inst, tp=1, pp=4, dp=1, ep=1)
    for split in splits(inst.model.num_layers, 4, 1):
        placement = dataclasses.replace(p, layers_per_stage=split)
        assert memory_feasible(inst, placement)[1] == pytest.approx(
            evaluate(inst, placement, check=False).memory_shortfall_gib, rel=1e-12, abs=1e-12)
