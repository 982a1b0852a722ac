"""Megatron-Core's MoE all-to-all overlap (docs/moe.md (E10), (EM5)): where it runs, its exposed time by hand,
the exact program against brute force and the evaluator with the overlap in the space (both backends), the lower
bounds, its memory, and its Megatron-LM flags as megatron-core's own TransformerConfig validates them."""

from __future__ import annotations

import argparse
import dataclasses
import math

import pytest
from conftest import seeds_by_backend, small_instance_dict
from test_bounds import brute_force_optimum
from test_moe_exact import moe_exact_instance
from test_moe_plans import mixtral
from test_oneway_uneven import bounds_below_brute_force, maps, programs_match_brute_force

from formulation import evaluate, instance_from_dict
from formulation.errors import InputError
from formulation.physics import cost, moe_overlap
from formulation.physics.memory import memory_coefficients
from formulation.physics.stage import layer_time, stage_constants
from formulation.placement import default_placement
from formulation.space import configurations


def test_the_space_offers_the_overlap_exactly_where_megatron_core_runs_it():
    """Megatron-Core 0.16's TransformerConfig: ep > 1, alltoall or flex (deepep) dispatcher, no full recompute,
    interleaving when pp > 1; the job's choices restrict it, and a placement outside the rules is refused."""
    inst = mixtral(virtual_pipeline_sizes=[1, 2], max_micro_batch_size=1)
    space = list(configurations(inst))
    with_overlap = [c for c in space if c.moe_a2a_overlap]
    assert with_overlap and all(c.ep > 1 and c.recompute != "full" and (c.pp == 1 or c.vpp > 1)
                                for c in with_overlap)
    plain = {dataclasses.replace(c, moe_a2a_overlap=False) for c in with_overlap}
    assert plain <= set(space)  # each also without it
    assert {c for c in space if not c.moe_a2a_overlap and moe_overlap.problem(inst.model, inst.training, c) is None} \
        == plain
    assert not any(c.moe_a2a_overlap for c in configurations(mixtral(moe_token_dispatcher="allgather")))
    assert not any(c.moe_a2a_overlap for c in configurations(mixtral(moe_a2a_overlap=False)))
    assert all(c.moe_a2a_overlap for c in configurations(mixtral(moe_a2a_overlap=[True])))
    p = default_placement(inst, tp=1, pp=2, dp=8, ep=8, vpp=1)
    reasons = {"vpp": dataclasses.replace(p, moe_a2a_overlap=True),
               "full": dataclasses.replace(p, vpp=2, recompute="full", moe_a2a_overlap=True),
               "expert parallelism": dataclasses.replace(p, vpp=2, ep=1, moe_a2a_overlap=True)}
    for words, bad in reasons.items():
        with pytest.raises(InputError, match=f"moe_a2a_overlap: .*{words}"):
            evaluate(inst, bad)


def test_only_the_megatron_stack_takes_it(instance_file):
    data = small_instance_dict()
    data["training"].update({"software_stack": "torchtitan", "moe_a2a_overlap": True})
    with pytest.raises(InputError, match="training.moe_a2a_overlap: .*software_stack megatron"):
        instance_from_dict(data)
    data["training"]["moe_a2a_overlap"] = "yes"
    data["training"]["software_stack"] = "megatron"
    with pytest.raises(InputError, match="training.moe_a2a_overlap: expected true, false or a list"):
        instance_from_dict(data)


def test_exposed_expert_communication_by_hand():
    """One MoE layer, per micro-batch: without the overlap ep x passes; with it max(E / 2, E - (f + b)), E = ep x
    passes (the contention share 1/2 of overlapped collectives), split over forward and backward as the passes."""
    inst = mixtral(virtual_pipeline_sizes=[2])
    p = default_placement(inst, tp=1, pp=2, dp=8, ep=8, vpp=2)
    off = stage_constants(inst, p, 0, inst.cluster.gpu_type_of(0))
    on = stage_constants(inst, dataclasses.replace(p, moe_a2a_overlap=True), 0, inst.cluster.gpu_type_of(0))
    assert (off.ep_overlap, on.ep_overlap, on.ep_passes) == (False, True, 2)
    window = on.f_compute + on.b_compute
    num, den = cost.dp_overlap_exposed()
    for ep in (0.1 * window, 0.4 * window, 2.0 * window):  # compute-bound, at the share, communication-bound
        total = 2 * ep
        expected = max(num / den * total, total - window)
        plain = layer_time(off, False, 0.0, 0.0, 0.0, 0.0, ep)
        hidden = layer_time(on, False, 0.0, 0.0, 0.0, 0.0, ep)
        assert plain.ep == pytest.approx(total)
        assert hidden.ep == pytest.approx(expected)
        assert hidden.forward - on.f_compute == pytest.approx(expected / 2)
        assert hidden.backward - on.b_compute == pytest.approx(expected / 2)
    assert layer_time(on, False, 0, 0, 0, 0, 2.0 * window).ep == pytest.approx(3.0 * window)  # E - W, not E / 2


def test_memory_holds_one_more_micro_batch_and_the_overlap_buffers():
    """(EM5) pp = 1: two micro-batches' activations in flight instead of one; with interleaving one more chunk
    (layers / vpp); buffers: a second set of dispatch buffers and the experts' output gradients held for the
    delayed weight gradients, busiest GPU copies x (2 f_e + h) x 2 bytes."""
    inst = mixtral(virtual_pipeline_sizes=[1, 2])
    model = inst.model
    p = default_placement(inst, tp=1, pp=1, dp=16, ep=8)
    off, on = (memory_coefficients(inst, dataclasses.replace(p, moe_a2a_overlap=o), 0) for o in (False, True))
    assert on.activations[1] == pytest.approx(2 * off.activations[1])
    copies = 2 * 4096 * 1.25  # top-2 of a micro-batch of 4096 tokens, x the 1.25 load imbalance
    dispatch = 2 * copies * 2 * model.hidden_size
    delayed = 2 * copies * (2 * model.moe.expert_ffn_hidden_size + model.hidden_size)
    assert on.buffers[0] - off.buffers[0] == pytest.approx(dispatch + delayed)
    q = default_placement(inst, tp=1, pp=2, dp=8, ep=8, vpp=2)
    off, on = (memory_coefficients(inst, dataclasses.replace(q, moe_a2a_overlap=o), 0) for o in (False, True))
    warmup = 2 * 1 + 1 * 2 + 1  # stage 0 of pp 2, vpp 2: (pp - 1) 2 + (vpp - 1) pp + 1 chunks
    assert on.activations[1] / off.activations[1] == pytest.approx((warmup + 1) / warmup)


def overlap_instance(seed: int, fast_links: bool) -> tuple[object, bool]:
    """test_moe_exact's seeded instances with the overlap as the only choice where it runs (recompute none, the
    alltoall dispatcher); `fast_links` False: slow links, so that the communication exceeds the compute that
    hides it (the E - W branch), True: the share branch."""
    data, gpu_level = moe_exact_instance(seed)
    t = data["training"]
    t.update({"recompute": ["none"], "moe_token_dispatcher": "alltoall", "moe_a2a_overlap": [False, True],
              "expert_tensor_parallel_sizes": [1], "virtual_pipeline_sizes": [1, 2]})
    if not fast_links:  # every link a hundred times slower
        net = data["cluster"]["network"]
        net["intra_node_gb_per_s"] /= 100
        net["inter_node_gb_per_s"] /= 100
        for pair in net.get("gpu_pairs", []) + net.get("node_pairs", []):
            pair["gb_per_s"] = round(pair["gb_per_s"] / 100, 3)
    return instance_from_dict(data), gpu_level


_BEST: dict = {}


def overlap_optima(seed: int, fast_links: bool):
    key = (seed, fast_links)
    if key not in _BEST:
        instance, gpu_level = overlap_instance(seed, fast_links)
        all_maps = list(maps(instance, gpu_level))
        _BEST[key] = instance, {c: brute_force_optimum(instance, c, all_maps) for c in configurations(instance)}
    return _BEST[key]


CASES = [(2, False), (2, True), (5, False), (0, True)]
SLOW_CASES = [(1, False), (3, True), (6, False), (7, True), (9, False), (10, True)]


def _cases():
    return CASES + [pytest.param(*case, marks=pytest.mark.slow) for case in SLOW_CASES]


@pytest.mark.parametrize("case,backend", seeds_by_backend(CASES + SLOW_CASES, slow_seeds=SLOW_CASES))
def test_program_equals_brute_force_and_the_evaluator_with_the_overlap(case, backend):
    """Every configuration with the overlap: the exact program's optimum is its brute-force minimum (every
    partition and map scored by evaluate()) and the evaluator's time of the decoded placement, to 1e-6 (the quick
    suite one backend per case in turn, every pair with the slow checks)."""
    seed, fast_links = case
    instance, best = overlap_optima(seed, fast_links)
    overlapped = [c for c in best if c.moe_a2a_overlap]
    assert overlapped, "the instance must offer the overlap"
    assert programs_match_brute_force(instance, best, backend, overlapped) >= 1


@pytest.mark.parametrize("seed,fast_links", _cases())
def test_bounds_stay_below_brute_force_with_the_overlap(seed, fast_links):
    instance, best = overlap_optima(seed, fast_links)
    assert bounds_below_brute_force(instance, best) >= 2


def test_the_overlap_hides_expert_communication_on_the_seeded_instances():
    """The check can fail: on slow links the overlap's configurations beat their plain twins by what compute
    hides, and the brute-force optima differ (the overlap is a real choice, not a relabelling)."""
    instance, best = overlap_optima(2, False)
    pairs = [(best[dataclasses.replace(c, moe_a2a_overlap=False)], t) for c, t in best.items()
             if c.moe_a2a_overlap and t < math.inf]
    assert pairs and all(on < off for off, on in pairs)


def test_exported_flags_pass_megatron_cores_own_config_checks(tmp_path):
    """megatron_args.sh of an overlapped Mixtral plan carries --overlap-moe-expert-parallel-comm and
    --delay-wgrad-compute; Megatron-LM core_v0.16.1's parser reads them and megatron-core's TransformerConfig,
    built with the plan's parallel sizes, accepts them (its __post_init__ asserts Megatron-Core's rules); with
    full recompute the same config is refused."""
    frameworks = pytest.importorskip("frameworks")
    pytest.importorskip("megatron.core")
    from solvers.outputs.export import megatron_arguments
    inst = mixtral(virtual_pipeline_sizes=[2])
    p = dataclasses.replace(default_placement(inst, tp=2, pp=2, dp=4, ep=8, vpp=2, recompute="selective"),
                            moe_a2a_overlap=True)
    args, _, env = megatron_arguments(inst, p)
    assert env["CUDA_DEVICE_MAX_CONNECTIONS"] == "32"
    flags = [flag for flag, _ in args]
    assert "--overlap-moe-expert-parallel-comm" in flags and "--delay-wgrad-compute" in flags
    argv = []
    for flag, value in args:
        argv += [flag] + ([] if value is None else list(map(str, value)) if isinstance(value, tuple) else [str(value)])
    ns = frameworks.megatron_lm_namespace(argv)
    assert ns.overlap_moe_expert_parallel_comm and ns.delay_wgrad_compute
    # the model's config as the frameworks tests build it (one process, every size 1), then the plan's sizes as
    # Megatron-LM's validate_args derives them from the parsed arguments
    plain = argparse.Namespace(**{**vars(ns), "overlap_moe_expert_parallel_comm": False, "delay_wgrad_compute": False})
    config = frameworks.megatron_transformer_config(plain)
    vpp = ns.num_layers // ns.pipeline_model_parallel_size // ns.num_layers_per_virtual_pipeline_stage
    sizes = dict(expert_model_parallel_size=ns.expert_model_parallel_size,
                 pipeline_model_parallel_size=ns.pipeline_model_parallel_size, virtual_pipeline_model_parallel_size=vpp,
                 pipeline_dtype=config.params_dtype, moe_token_dispatcher_type=ns.moe_token_dispatcher_type,
                 bf16=ns.bf16, overlap_moe_expert_parallel_comm=ns.overlap_moe_expert_parallel_comm,
                 delay_wgrad_compute=ns.delay_wgrad_compute, recompute_granularity=ns.recompute_granularity)
    assert (sizes["expert_model_parallel_size"], vpp, sizes["recompute_granularity"]) == (8, 2, "selective")
    dataclasses.replace(config, **sizes)  # __post_init__ runs megatron-core's checks: no assertion
    with pytest.raises(AssertionError, match="full recomputation"):
        dataclasses.replace(config, **{**sizes, "recompute_granularity": "full", "recompute_method": "uniform",
                                       "recompute_num_layers": 1})
    with pytest.raises(AssertionError, match="virtual_pipeline_model_parallel_size"):
        dataclasses.replace(config, **{**sizes, "virtual_pipeline_model_parallel_size": None})


def test_a_plan_file_keeps_the_overlap():
    """The placement's document carries `moe_a2a_overlap` only when on, and reads back to the same placement;
    the report says whether the plan overlaps and what it changes."""
    from formulation.placement_file import placement_from_document
    from solvers.outputs.plan_notes import overlap_line
    inst = mixtral(virtual_pipeline_sizes=[2])
    p = default_placement(inst, tp=1, pp=2, dp=8, ep=8, vpp=2)
    assert "moe_a2a_overlap" not in p.to_dict(inst.cluster)
    on = dataclasses.replace(p, moe_a2a_overlap=True)
    assert on.to_dict(inst.cluster)["moe_a2a_overlap"] is True
    assert placement_from_document(on.to_dict(inst.cluster), inst, "<plan>") == on
    est_on, est_off = evaluate(inst, on), evaluate(inst, p)
    assert overlap_line(inst, on, est_on).startswith("MoE all-to-all overlap: on")
    assert f"{est_off.iteration_time_s:.4f} s -> {est_on.iteration_time_s:.4f} s" in overlap_line(inst, on, est_on)
    assert overlap_line(inst, p, est_off).startswith("MoE all-to-all overlap: off (with it this placement: "
                                                     f"{est_on.iteration_time_s:.4f} s")
    full = dataclasses.replace(p, recompute="full")
    assert "full recompute" in overlap_line(inst, full, evaluate(inst, full))
