"""Mixture-of-experts models planned with expert parallelism (docs/moe.md): hand-derived dispatch bytes, expert
memory and model FLOPs; Megatron-Core's ep / etp rules; the incremental scorer equals evaluate() with expert
groups; the lower bounds never exceed any evaluated placement of small MoE instances."""

from __future__ import annotations

import random

import numpy as np
import pytest

from conftest import REPO, build_instance, small_instance_dict
from formulation import evaluate
from formulation.errors import InputError
from formulation.inputs.moe import parameter_counts
from formulation.physics import moe_cost
from formulation.physics.cost import GroupLinks
from formulation.placement import default_placement
from formulation.space import configurations, placement_for
from solvers.bounds.configs import lower_bound
from solvers.local.fast_score import FastScorer

REPO_INSTANCES = REPO / "instances"
TINY_DEEPSEEK = {"name": "tiny-deepseek", "num_hidden_layers": 4, "hidden_size": 512, "intermediate_size": 1024,
                 "num_attention_heads": 8, "num_key_value_heads": 8, "vocab_size": 4000, "hidden_act": "silu",
                 "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 256,
                 "n_shared_experts": 1, "first_k_dense_replace": 1, "q_lora_rank": 128, "kv_lora_rank": 64,
                 "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32}


def moe_instance(nodes=2, per_node=4, seed=None, model=None, **training):
    data = small_instance_dict(nodes, per_node, global_batch_size=8, seq_length=1024)
    data["model"] = dict(model or TINY_DEEPSEEK)
    data["training"].update({"zero_stage": [0, 1], "context_parallel_sizes": [1], **training})
    if seed is not None:  # every node pair its own bandwidth
        rng = random.Random(seed)
        m = [[0.0] * nodes for _ in range(nodes)]
        for i in range(nodes):
            for j in range(i + 1, nodes):
                m[i][j] = m[j][i] = round(rng.uniform(3.0, 50.0), 1)
        data["cluster"]["network"]["node_matrix_gb_per_s"] = m
    return build_instance(data)


def mixtral(**training):
    data = small_instance_dict(2, 8, global_batch_size=64, seq_length=4096)
    data["model"] = {"preset": "mixtral-8x7b"}
    data["training"].update({"zero_stage": [1], "context_parallel_sizes": [1], **training})
    return build_instance(data)


def test_dispatch_bytes_and_all_to_all_time_by_hand():
    inst = mixtral()
    p = default_placement(inst, tp=2, pp=2, dp=4, ep=8)
    # tokens per GPU: 1 x 4096 / tp 2 = 2048; top-2 copies x imbalance 1.25 = 5120; x 4096 x 2 bytes
    assert moe_cost.dispatch_bytes(inst.model, inst.training, p) == 5120 * 4096 * 2
    one_node = GroupLinks(size=8, intra_gb_per_s=450.0, inter_gb_per_s=48.0, nodes=1, per_node=8)
    message = 5120 * 4096 * 2
    expected = 7 / 8 * message / (0.8 * 450e9) + inst.cluster.intra_latency_s
    assert moe_cost.all_to_all_time(message, one_node, inst.cluster) == pytest.approx(expected, rel=1e-12)
    # two nodes, 4 members each: 4 of 8 destinations are on the other node, over the GPU's own NIC
    two_nodes = GroupLinks(size=8, intra_gb_per_s=450.0, inter_gb_per_s=48.0, nodes=2, per_node=4)
    expected = 4 / 8 * message / (0.94 * 48e9) + inst.cluster.inter_latency_s
    assert moe_cost.all_to_all_time(message, two_nodes, inst.cluster) == pytest.approx(expected, rel=1e-12)


def test_expert_parallel_group_across_nodes_costs_more_than_inside_one():
    inst = mixtral()
    inside = evaluate(inst, default_placement(inst, tp=1, pp=2, dp=8, ep=8))  # ep groups = one node each
    gpus = [r // 2 + 8 * (r % 2) for r in range(16)]  # ranks alternate between the nodes
    config = default_placement(inst, tp=1, pp=2, dp=8, ep=8).config
    across = evaluate(inst, placement_for(config, (16, 16), gpus))
    # by hand: half of the message over a 48 x 0.94 GB/s NIC against 7/8 over 450 x 0.8 NVLink: 4.56x
    assert across.breakdown["ep_comm_s"] / inside.breakdown["ep_comm_s"] == pytest.approx(4.56, rel=0.02)


def test_expert_memory_is_split_by_ep_and_their_optimizer_by_expert_dp():
    inst = mixtral()
    model = inst.model
    for ep in (1, 2, 8):
        p = default_placement(inst, tp=2, pp=2, dp=4, ep=ep)
        est = evaluate(inst, p)
        experts = 8 * 3 * 4096 * 14336 / ep  # per layer per GPU (etp = 1)
        other = (model.attention_params + 3 * 4096 * 0) / 2 + 2 * 4096 + 4096 * 8  # attention / tp, norms, router
        weights = 16 * (experts + other) * 2 + model.embedding_params / 2 * 2  # stage 0: 16 layers + embedding
        assert est.stages[0].memory.weights_gib * 2**30 == pytest.approx(weights, rel=1e-12)
        optimizer = 16 * (experts / (8 // ep) + other / 4) * 12 + model.embedding_params / 2 / 4 * 12
        assert est.stages[0].memory.optimizer_gib * 2**30 == pytest.approx(optimizer, rel=1e-12)


def test_model_flops_use_the_active_parameters():
    """Mixtral-8x7B: 12.9B active parameters (Jiang et al. 2024); the model FLOPs per token outside attention are
    6 x (active - embedding) parameters, the router included, the norms (2h per layer + h) not multiplied."""
    inst = mixtral()
    model = inst.model
    active = parameter_counts(model).active
    s = 4096
    attention = 3 * 32 * 2.0 * s * 32 * 2 * 128
    per_token = moe_cost.model_flops(model, 1, s) / s - attention
    norms = 32 * 2 * 4096 + 4096
    assert per_token == pytest.approx(6.0 * (active - model.vocab_size * 4096 - norms), rel=1e-12)
    assert active / 1e9 == pytest.approx(12.9, abs=0.06)


def test_expert_sizes_follow_megatron_core_and_errors_name_every_factor():
    inst = mixtral()
    sizes = {(c.ep, c.etp) for c in configurations(inst) if (c.tp, c.pp, c.dp) == (2, 2, 4)}
    assert sizes == {(1, 1), (2, 1), (4, 1), (8, 1)}  # ep divides 8 experts and tp x dp = 8; etp from (1,)
    with pytest.raises(InputError) as info:
        default_placement(inst, tp=2, pp=4, dp=2, ep=8)
    assert "etp=1 x ep=8 = 8 must divide tp=2 x cp=1 x dp=2 = 4" in info.value.problem
    with pytest.raises(InputError) as info:
        default_placement(build_instance(), tp=2, pp=2, dp=2, ep=2)
    assert info.value.field == "ep" and "no experts" in info.value.problem
    narrow = mixtral(expert_tensor_parallel_sizes=[1, 2], expert_parallel_sizes=[2, 4])
    sizes = {(c.ep, c.etp) for c in configurations(narrow) if (c.tp, c.pp, c.dp) == (2, 2, 4)}
    assert sizes == {(2, 1), (4, 1), (2, 2), (4, 2)}


@pytest.mark.parametrize("seed", range(3))
def test_scorer_equals_evaluate_with_expert_groups(seed):
    inst = moe_instance(seed=seed, expert_tensor_parallel_sizes=[1, 2])
    rng = random.Random(seed)
    configs = [c for c in configurations(inst) if c.ep > 1 and c.vpp == 1]
    assert any(c.etp > 1 for c in configs)
    compared = 0
    for config in rng.sample(configs, min(12, len(configs))):
        L = inst.model.num_layers
        cuts = sorted(rng.sample(range(1, L), config.pp - 1))
        layers = [b - a for a, b in zip([0] + cuts, cuts + [L])]
        perm = rng.sample(range(inst.cluster.num_gpus), inst.cluster.num_gpus)
        sc = FastScorer(inst, config, layers, perm)
        for _ in range(20):
            a, b = rng.sample(range(inst.cluster.num_gpus), 2)
            total = sc.propose_perm({a: sc.perm[b], b: sc.perm[a]})
            est = evaluate(inst, sc.proposed_placement())
            assert (total is not None) == est.fits
            if total is None:
                sc.reject()
                continue
            assert total == pytest.approx(est.iteration_time_s, rel=1e-12, abs=0), config
            sc.commit(total)
            compared += 1
    assert compared >= 20


@pytest.mark.parametrize("seed", [0, 1] + [pytest.param(s, marks=pytest.mark.slow) for s in (2, 3)])
def test_lower_bounds_never_exceed_evaluated_moe_placements(seed):
    """Bounds <= evaluate() over random maps and partitions (the brute-force minimum of a configuration is one of
    its placements, so a bound above any placement would be wrong)."""
    inst = moe_instance(seed=seed)
    rng = np.random.default_rng(seed)
    L, n = inst.model.num_layers, inst.cluster.num_gpus
    checked = 0
    for config in configurations(inst):
        if config.vpp > 1:
            continue
        bound = lower_bound(inst, config)
        for _ in range(6):
            cuts = sorted(rng.choice(np.arange(1, L), config.pp - 1, replace=False).tolist())
            layers = [b - a for a, b in zip([0] + cuts, cuts + [L])]
            est = evaluate(inst, placement_for(config, layers, rng.permutation(n).tolist()), check=False)
            if est.fits:
                assert bound <= est.iteration_time_s * (1 + 1e-9), (config, bound, est.iteration_time_s)
                checked += 1
    assert checked >= 50


def test_solve_plans_an_moe_model_with_an_honest_status():
    """Small enough for the exact program, which encodes the expert groups (tests/test_moe_exact.py checks its
    optimum against brute force): proven optimal."""
    from solvers import solve
    inst = moe_instance(seed=1)
    result = solve(inst, seed=0)
    assert result.solver.method.startswith("exact") and result.solver.status == "optimal"
    assert result.solver.bound_s <= result.solver.objective_s
    assert result.estimate.iteration_time_s == evaluate(inst, result.placement).iteration_time_s
    assert "ep_comm_s" in result.estimate.breakdown


def test_megatron_arguments_for_deepseek_v3():
    from formulation import load_instance
    from solvers.outputs.export import megatron_arguments
    inst = load_instance(REPO_INSTANCES / "deepseek_v3_h100_1024.json")
    p = default_placement(inst, tp=2, pp=16, dp=32, ep=64, recompute="full")
    args = dict(megatron_arguments(inst, p)[0])
    assert (args["--num-experts"], args["--moe-router-topk"], args["--moe-ffn-hidden-size"]) == (256, 8, 2048)
    assert (args["--expert-model-parallel-size"], args["--expert-tensor-parallel-size"]) == (64, 1)
    assert args["--moe-layer-freq"] == "[" + ",".join(["0"] * 3 + ["1"] * 58) + "]"
    assert args["--moe-shared-expert-intermediate-size"] == 2048 and args["--moe-token-dispatcher-type"] == "alltoall"
    assert (args["--q-lora-rank"], args["--kv-lora-rank"], args["--qk-head-dim"], args["--qk-pos-emb-head-dim"],
            args["--v-head-dim"]) == (1536, 512, 128, 64, 128)
    assert "--multi-latent-attention" in args and "--moe-grouped-gemm" in args
    assert args["--kv-channels"] == 128  # the value head width, not hidden / heads = 56


@pytest.mark.slow
def test_mixed_type_moe_instance_keeps_expert_groups_inside_nodes():
    """mixtral_8x7b_a100_h100_64 (4 DGX H100 + 4 DGX A100 behind a ~24 GB/s spine): the mixed-type search plans
    expert parallelism with stages on islands of one GPU type; the plan is the evaluator's, and each
    expert-parallel group stays inside one node (the all-to-all on NVLink, not the NICs or the spine)."""
    from formulation import load_instance
    from solvers import solve
    inst = load_instance(REPO_INSTANCES / "mixtral_8x7b_a100_h100_64.json")
    result = solve(inst, seed=0, time_limit=60)
    p = result.placement
    assert p.ep > 1 and result.solver.bound_s <= result.solver.objective_s
    assert result.estimate.iteration_time_s == evaluate(inst, p).iteration_time_s
    node = inst.cluster.gpu_node
    for stage in range(p.pp):
        for group in p.moe_ep_groups(stage):
            assert len({int(node[g]) for g in group}) == 1, (stage, group)


# two shapes in the quick suite, the 4-node ones (about 30 s since the bounds cost each stage's layer kinds) slow
@pytest.mark.parametrize("seed,nodes,per_node", [(0, 2, 4), (1, 2, 4)] + [
    pytest.param(*case, marks=pytest.mark.slow) for case in ((2, 4, 2), (3, 4, 4))])
def test_expert_group_split_bound_never_exceeds_evaluated_placements(seed, nodes, per_node):
    """(B3)'s case split on the ep groups (docs/programs.md): the bounds with it stay <= evaluate() on random maps
    and on maps keeping every ep group inside a node (node-contiguous maps of shuffled nodes, where case (i) is
    the binding one), and the split raises the bound of some configuration (so it is exercised)."""
    from solvers.bounds.configs import cut_bound, fast_bound, tp_split_bound  # the split alone, for the exercise check
    inst = moe_instance(nodes=nodes, per_node=per_node, seed=seed)
    rng = np.random.default_rng(seed)
    L, n = inst.model.num_layers, inst.cluster.num_gpus
    checked = raised = 0
    for config in configurations(inst):
        if config.ep == 1 or config.vpp > 1:
            continue
        bound = max(fast_bound(inst, config), cut_bound(inst, config))
        raised += bound > tp_split_bound(inst, config, None, False) * (1 + 1e-9)
        for trial in range(8):
            cuts = sorted(rng.choice(np.arange(1, L), config.pp - 1, replace=False).tolist())
            layers = [b - a for a, b in zip([0] + cuts, cuts + [L])]
            if trial % 2:
                gpus = rng.permutation(n).tolist()
            else:  # whole nodes in a random order, GPUs shuffled inside each node
                gpus = [node * per_node + g for node in rng.permutation(nodes) for g in rng.permutation(per_node)]
            est = evaluate(inst, placement_for(config, layers, gpus), check=False)
            if est.fits:
                assert bound <= est.iteration_time_s * (1 + 1e-9), (config, bound, est.iteration_time_s)
                checked += 1
    assert checked >= 20
    assert raised >= 1


def test_readme_says_the_self_check_covered_the_expert_groups(tmp_path):
    """export_plan rebuilds Megatron's expert groups from the launch files before writing (launch.check_groups);
    the README says so for a plan with expert parallelism."""
    from test_export import _Scored

    from solvers.outputs.export import export_plan
    inst = mixtral()
    p = default_placement(inst, tp=1, pp=2, dp=8, ep=8)
    export_plan(inst, _Scored(p, evaluate(inst, p)), tmp_path)
    assert "and its expert groups (ep, expert tp, expert dp, tp-ep)" in (tmp_path / "README.txt").read_text()
