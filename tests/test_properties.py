"""Properties of the evaluator over generated small instances and placements (hypothesis).

Instances: 1-3 nodes of 2/4/8 H100s, a small llama-style model, random bandwidths. Placements: the
Megatron default placement of a random valid configuration, and for map properties a random permutation
of its GPUs.
"""

from __future__ import annotations

import dataclasses
import math
import os

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from conftest import build_instance, small_instance_dict
from formulation import InputError, default_placement, evaluate
from formulation.physics import cost

# PROPERTY_EXAMPLES=2000 python -m pytest tests/test_properties.py searches harder.
PROPERTY = settings(max_examples=int(os.environ.get("PROPERTY_EXAMPLES", 40)), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
RECOMPUTE = ("none", "selective", "full")
ZERO = (0, 1, 3)


@st.composite
def instance_dicts(draw, min_nodes: int = 1, max_nodes: int = 3, gpus_per_node=(2, 4, 8)) -> dict:
    nodes = draw(st.integers(min_nodes, max_nodes))
    g = draw(st.sampled_from(gpus_per_node))
    heads = draw(st.sampled_from([8, 16]))
    head_dim = draw(st.sampled_from([64, 128]))
    data = small_instance_dict(nodes, g, intra=draw(st.floats(50, 900)), inter=draw(st.floats(5, 100)),
                               global_batch_size=draw(st.sampled_from([8, 16, 32])),
                               seq_length=draw(st.sampled_from([512, 1024, 2048, 4096])))
    data["model"].update(num_hidden_layers=draw(st.sampled_from([4, 8, 12])), num_attention_heads=heads,
                         num_key_value_heads=draw(st.sampled_from([h for h in (1, 2, 4, 8, 16) if heads % h == 0])),
                         hidden_size=heads * head_dim,
                         intermediate_size=draw(st.sampled_from([2, 3, 4])) * heads * head_dim,
                         vocab_size=draw(st.sampled_from([32000, 50304])))
    data["training"].update(sequence_parallel=draw(st.booleans()), overlap_grad_reduce=draw(st.booleans()))
    return data


def valid_configs(instance) -> list[dict]:
    """Every (tp, pp, cp, dp, vpp, micro_batch_size) whose default placement passes `check_placement`."""
    world_max = instance.cluster.num_gpus
    out = []
    for tp in (1, 2, 4, 8):
        for pp in (1, 2, 3, 4):
            for cp in (1, 2):
                for dp in (1, 2, 4):
                    if tp * pp * cp * dp > world_max:
                        continue
                    for vpp in (1, 2):
                        for mbs in (1, 2):
                            config = dict(tp=tp, pp=pp, cp=cp, dp=dp, vpp=vpp, micro_batch_size=mbs)
                            try:
                                default_placement(instance, **config)
                            except InputError:
                                continue
                            out.append(config)
    return out


@st.composite
def placements(draw, instance, permute: bool = True):
    configs = valid_configs(instance)
    assume(configs)
    config = draw(st.sampled_from(configs))
    p = default_placement(instance, **config, recompute=draw(st.sampled_from(RECOMPUTE)),
                          zero_stage=draw(st.sampled_from(ZERO)))
    if permute and draw(st.booleans()):
        gpus = draw(st.permutations(range(instance.cluster.num_gpus)))[:p.world_size]
        p = dataclasses.replace(p, gpus=tuple(gpus))
    return p


@st.composite
def instance_and_placement(draw, **kwargs):
    data = draw(instance_dicts(**kwargs))
    instance = build_instance(data)
    return data, instance, draw(placements(instance))


def with_slower_link(data: dict, instance, draw) -> dict:
    """A copy of `data` in which one link (a node pair, an intra-node GPU pair or a cross-node GPU pair) is slower."""
    cluster = instance.cluster
    factor = draw(st.floats(0.05, 0.99))
    kinds = ["intra"] + (["node_pair", "gpu_pair"] if len(cluster.nodes) > 1 else [])
    kind = draw(st.sampled_from(kinds))
    net = data["cluster"]["network"]
    out = {**data, "cluster": {**data["cluster"], "network": dict(net)}}
    new_net = out["cluster"]["network"]
    if kind == "node_pair":
        a, b = draw(st.lists(st.integers(0, len(cluster.nodes) - 1), min_size=2, max_size=2, unique=True))
        value = cluster.inter_gb_per_s[a, b] * factor
        new_net["node_pairs"] = net.get("node_pairs", []) + [
            {"nodes": [cluster.nodes[a].name, cluster.nodes[b].name], "gb_per_s": value}]
    else:
        x, y = draw(st.lists(st.integers(0, cluster.num_gpus - 1), min_size=2, max_size=2, unique=True))
        same = cluster.gpu_node[x] == cluster.gpu_node[y]
        assume(same == (kind == "intra"))
        new_net["gpu_pairs"] = net.get("gpu_pairs", []) + [
            {"gpus": [cluster.gpu_name(x), cluster.gpu_name(y)], "gb_per_s": cluster.bandwidth(x, y) * factor}]
    return out


@PROPERTY
@given(st.data())
def test_slowing_any_link_never_shortens_the_iteration(data):
    inst_dict, instance, p = data.draw(instance_and_placement())
    slower = build_instance(with_slower_link(inst_dict, instance, data.draw))
    before = evaluate(instance, p).iteration_time_s
    after = evaluate(slower, p).iteration_time_s
    assert after >= before * (1 - 1e-12)


@PROPERTY
@given(inst=instance_dicts(min_nodes=2, max_nodes=2), recompute=st.sampled_from(RECOMPUTE),
       zero=st.sampled_from((0, 1)), factor=st.floats(0.05, 0.95))
def test_slowing_the_node_pair_between_two_pipeline_stages_strictly_lengthens_the_iteration(inst, recompute, zero,
                                                                                             factor):
    instance = build_instance(inst)
    g = instance.cluster.nodes[0].num_gpus
    tp = min(g, 2)  # stage 0 = node n0, stage 1 = node n1: every send between stages crosses n0-n1
    try:
        p = default_placement(instance, tp=tp, pp=2, dp=g // tp, recompute=recompute, zero_stage=zero)
    except InputError:
        assume(False)
    inst["cluster"]["network"]["node_pairs"] = [{"nodes": ["n0", "n1"], "gb_per_s": inst["cluster"]["network"][
        "inter_node_gb_per_s"] * factor}]
    before, after = evaluate(instance, p), evaluate(build_instance(inst), p)
    assert after.breakdown["pp_comm_s"] > before.breakdown["pp_comm_s"]
    assert after.iteration_time_s > before.iteration_time_s


@PROPERTY
@given(inst=instance_dicts(max_nodes=2, gpus_per_node=(4, 8)), recompute=st.sampled_from(RECOMPUTE),
       factor=st.floats(0.05, 0.95), pp=st.sampled_from([1, 2]))
def test_slowing_a_gpu_pair_inside_a_tensor_parallel_group_lengthens_the_iteration(inst, recompute, factor, pp):
    instance = build_instance(inst)
    try:
        p = default_placement(instance, tp=2, pp=pp, dp=1, recompute=recompute, zero_stage=1)
    except InputError:
        assume(False)
    # ranks 0 and 1 form the first tp group; they sit on n0:0 and n0:1
    inst["cluster"]["network"]["gpu_pairs"] = [{"gpus": ["n0:0", "n0:1"], "gb_per_s": inst["cluster"]["network"][
        "intra_node_gb_per_s"] * factor}]
    slower = build_instance(inst)
    # NCCL's model (docs/collectives.md): a small collective on LL runs at LL's bandwidth cap whatever the link, so
    # a slower but still faster-than-the-cap pair leaves it unchanged: never shorter
    before, after = evaluate(instance, p), evaluate(slower, p)
    assert after.stages[0].tp_comm_s >= before.stages[0].tp_comm_s
    assert after.iteration_time_s >= before.iteration_time_s
    # the link-bound model (one ring at the group's slowest link): strictly longer
    cost.PHYSICS_TERMS["nccl_algorithms"] = False
    try:
        before, after = evaluate(instance, p), evaluate(slower, p)
    finally:
        cost.PHYSICS_TERMS["nccl_algorithms"] = True
    assert after.stages[0].tp_comm_s > before.stages[0].tp_comm_s
    assert after.iteration_time_s > before.iteration_time_s


PINNED_H100 = {"preset": "h100-sxm-80gb", "matmul_efficiency": 0.75, "efficiency_half_gflop": 20.0,
               "attention_efficiency": 0.45}  # fixed efficiencies: the regressions below must not hinge on calibration


def _slower_pair_violations(data: dict, pair: list[str], factor: float, gpus=None, **config) -> list[str]:
    """Iteration times (ms) before -> after the GPU pair `pair` runs at `factor` of its bandwidth, where shorter."""
    data = {**data, "cluster": {**data["cluster"], "gpu_types": {"h100-sxm-80gb": PINNED_H100}}}
    instance = build_instance(data)
    placement = default_placement(instance, **config)
    if gpus is not None:
        placement = dataclasses.replace(placement, gpus=gpus)
    slow = {**data, "cluster": {**data["cluster"], "network": dict(data["cluster"]["network"])}}
    a, b = (instance.cluster.gpu_index(x) for x in pair)
    slow["cluster"]["network"]["gpu_pairs"] = [{"gpus": pair, "gb_per_s": instance.cluster.bandwidth(a, b) * factor}]
    before = evaluate(instance, placement).iteration_time_s
    after = evaluate(build_instance(slow), placement).iteration_time_s
    return [f"{before * 1e3:.4f} -> {after * 1e3:.4f} ms"] if after < before * (1 - 1e-12) else []


def test_full_recompute_zero3_slower_tp_link_does_not_shorten_the_iteration():
    bad = []
    for intra in (5.0, 10.0, 25.0, 50.0, 100.0):
        for seq in (512, 2048):
            data = small_instance_dict(1, 4, intra=intra, seq_length=seq)
            bad += _slower_pair_violations(data, ["n0:0", "n0:1"], 0.5, tp=2, pp=1, cp=2, dp=1, recompute="full",
                                           zero_stage=3)
    assert not bad, bad


def test_interleaved_slower_tp_link_on_non_critical_stage_does_not_shorten_the_iteration():
    bad = []
    for inter in (2.0, 5.0, 20.0):
        for intra in (50.0, 450.0):
            for seq in (512, 2048):
                data = small_instance_dict(2, 4, intra=intra, inter=inter, seq_length=seq)
                # stage 0 on n0:0-1 and n1:0-1 (dp across nodes); stage 1 (output layer, critical) on the rest
                bad += _slower_pair_violations(data, ["n0:0", "n0:1"], 0.3, gpus=(0, 1, 4, 5, 2, 3, 6, 7), tp=2,
                                               pp=2, dp=2, vpp=2, recompute="none", zero_stage=1)
    assert not bad, bad


def _peak_of(estimate) -> float:
    return estimate.peak_memory_gib


def _sweep(instance, name: str, values, fixed: dict, metric) -> list[tuple[str, float]]:
    """(value, metric(estimate)) of the default placement for each value of one parallel size; sizes the
    instance cannot run are skipped."""
    out = []
    for value in values:
        try:
            out.append((value, metric(evaluate(instance, default_placement(instance, **{name: value}, **fixed)))))
        except InputError:
            continue
    assume(len(out) >= 2)
    return [(f"{name}={v}", m) for v, m in out]


def _assert_weakly_falling(points) -> None:
    for (label_a, a), (label_b, b) in zip(points, points[1:]):
        assert b <= a * (1 + 1e-12), f"{label_a}: {a} GiB, {label_b}: {b} GiB"


@PROPERTY
@given(inst=instance_dicts(min_nodes=2, max_nodes=2, gpus_per_node=(4, 8)), pp=st.sampled_from([1, 2]),
       dp=st.sampled_from([1, 2]), mbs=st.sampled_from([1, 2]), recompute=st.sampled_from(RECOMPUTE),
       zero=st.sampled_from(ZERO))
def test_peak_memory_weakly_falls_as_tp_grows(inst, pp, dp, mbs, recompute, zero):
    fixed = dict(pp=pp, dp=dp, micro_batch_size=mbs, recompute=recompute, zero_stage=zero)
    _assert_weakly_falling(_sweep(build_instance(inst), "tp", (1, 2, 4, 8), fixed, _peak_of))


@PROPERTY
@given(inst=instance_dicts(min_nodes=2, max_nodes=2, gpus_per_node=(4, 8)), tp=st.sampled_from([1, 2]),
       dp=st.sampled_from([1, 2]), mbs=st.sampled_from([1, 2]), recompute=st.sampled_from(RECOMPUTE),
       zero=st.sampled_from(ZERO))
def test_model_state_memory_weakly_falls_as_pp_grows(inst, tp, dp, mbs, recompute, zero):
    """Weights, gradients and optimizer state of the most loaded stage fall with pp, for any model."""
    def model_state(est):
        return max(s.memory.weights_gib + s.memory.gradients_gib + s.memory.optimizer_gib for s in est.stages)

    fixed = dict(tp=tp, dp=dp, micro_batch_size=mbs, recompute=recompute, zero_stage=zero)
    _assert_weakly_falling(_sweep(build_instance(inst), "pp", (1, 2, 4), fixed, model_state))


@PROPERTY
@given(inst=instance_dicts(min_nodes=2, max_nodes=2, gpus_per_node=(4, 8)), tp=st.sampled_from([1, 2]),
       dp=st.sampled_from([1, 2]), mbs=st.sampled_from([1, 2]), recompute=st.sampled_from(RECOMPUTE),
       zero=st.sampled_from(ZERO))
def test_peak_memory_weakly_falls_as_pp_grows(inst, tp, dp, mbs, recompute, zero):
    """Holds for the generated models (vocabulary 32k-50k): the last stage's logits and the first stage's
    embedding move off the other stages as pp grows. Not a law for every model: stage 0 keeps
    min(pp, m) micro-batches of L/pp layers under 1F1B (test below), so a tiny vocabulary with a long
    sequence could make stage 0's per-micro-batch extras outgrow its shrinking weights."""
    fixed = dict(tp=tp, dp=dp, micro_batch_size=mbs, recompute=recompute, zero_stage=zero)
    _assert_weakly_falling(_sweep(build_instance(inst), "pp", (1, 2, 4), fixed, _peak_of))


def test_first_stage_activations_do_not_fall_with_pp_under_1f1b():
    """Documents why peak memory is not monotone in pp: stage 0 holds min(pp, m) micro-batches."""
    data = small_instance_dict(global_batch_size=16, seq_length=4096)
    instance = build_instance(data)
    acts = [evaluate(instance, default_placement(instance, tp=1, pp=pp, dp=1, recompute="none"))
            .stages[0].memory.activations_gib for pp in (2, 4, 8)]
    # min(pp, m) micro-batches x L / pp layers = L layers' activations whatever pp (m = 16 >= pp)
    assert acts[0] == pytest.approx(acts[1], rel=1e-12) == pytest.approx(acts[2], rel=1e-12), acts


@PROPERTY
@given(st.data())
def test_breakdown_sums_to_iteration_time(data):
    _, instance, p = data.draw(instance_and_placement())
    est = evaluate(instance, p)
    assert math.isclose(sum(est.breakdown.values()), est.iteration_time_s, rel_tol=1e-9)
    assert all(v >= 0 for v in est.breakdown.values()), est.breakdown
    assert est.iteration_time_s > 0 and est.peak_memory_gib > 0


@PROPERTY
@given(st.data())
def test_evaluate_is_deterministic(data):
    inst_dict, instance, p = data.draw(instance_and_placement())
    first = evaluate(instance, p).to_dict()
    assert evaluate(instance, p).to_dict() == first
    assert evaluate(build_instance(inst_dict), p).to_dict() == first  # a freshly loaded copy too
