"""torchtitan's pipeline stages with FSDP sync once per step (docs/model.md (C12), docs/programs.md (P9'')).

torch.distributed.pipelining turns FSDP's gradient sync and its reshard after backward off for every backward of
a stage and reduces once after the stage's last backward (`backward_maybe_with_nosync`, `perform_reduce_grad`),
and torchtitan's default `fsdp_reshard_after_forward` keeps the parameters gathered with pp > 1: the gather of the
step's first forward and the reduce-scatter (HSDP: then the replicas' all-reduce) leave the micro-batch and are
exposed once per step. Derived figures on Llama-3 70B (h100_128 on the torchtitan stack), and the exact program
equal to the evaluator and to brute force on seeded small torchtitan instances with pp free, both backends, and to
the evaluator with the schedule free.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from conftest import REPO, seeds_by_backend

from formulation import default_placement, evaluate, instance_from_dict
from formulation.stage_links import stage_links
from formulation.physics import cost, sharding
from test_sharding_exact import programs_equal_the_evaluator, search_equals_brute_force, sharded_instance

# Llama-3 70B layer (h 8192, FFN 28672, 64 heads, 8 KV heads of 128): attention 2 x 8192^2 + 2 x 8192 x 1024,
# MLP 3 x 8192 x 28672, split by tp = 8, plus two RMSNorm weights of 8192 replicated
LAYER_PARAMS_TP8 = (2 * 8192 ** 2 + 2 * 8192 * 1024 + 3 * 8192 * 28672) // 8 + 2 * 8192  # 106,971,136


@pytest.fixture(scope="module")
def titan():
    data = json.loads((REPO / "instances" / "h100_128.json").read_text())
    data["training"]["software_stack"] = "torchtitan"
    return instance_from_dict(data)


def _hsdp(instance, keep: bool = False, pp: int = 4):
    """tp 8, pp 4 (20 layers a stage), dp 4 as 2 shard ranks x 2 replicas, FSDP (zero 3)."""
    p = default_placement(instance, tp=8, pp=pp, zero_stage=3, micro_batch_size=1)
    return dataclasses.replace(p, dp_replicate=2, reshard_after_forward=not keep)


def test_pipelined_fsdp_exposes_one_gather_and_one_reduce_per_step(titan):
    """Per stage of 20 layers: 20 x (max(0, AG - f) + RS + AR) once per step, AG the all-gather of a layer's bf16
    parameters (214 MB) in the slowest of its shard groups of 2, RS the reduce-scatter of its fp32 gradients
    (428 MB) there, AR the all-reduce of the 214 MB gradient shard over the slowest replicate group of 2, f the
    layer's forward compute; the micro-batch carries none of them without resharding (torchtitan's default with
    pp)."""
    p = _hsdp(titan, keep=True)
    assert sharding.grad_sync_once_per_step(titan.training, p)
    cluster = titan.cluster
    links = stage_links(titan, p, 0)
    k = links.constants
    assert k.layer_params == LAYER_PARAMS_TP8 == 106_971_136

    def slowest(kind, message, groups):
        return max(cost.collective_time(kind, message, cost.group_links(cluster, g), cluster) for g in groups)

    est = evaluate(titan, p)
    for i, stage in enumerate(est.stages):
        ag = slowest("all_gather", LAYER_PARAMS_TP8 * 2, p.shard_groups(i))
        rs = slowest("reduce_scatter", LAYER_PARAMS_TP8 * 4, p.shard_groups(i))
        ar = slowest("all_reduce", LAYER_PARAMS_TP8 * 4 / 2, p.replicate_groups(i))
        assert stage.layers == 20 and stage.zero3_comm_s == 0.0
        assert stage.dp_exposed_s == pytest.approx(20 * (max(0.0, ag - k.f_compute) + rs + ar), rel=1e-9), i
    # the iteration adds the slowest stage's once-per-step sync after the schedule, as (C11)'s
    assert est.breakdown["dp_comm_s"] == pytest.approx(max(s.dp_exposed_s for s in est.stages), rel=1e-12)


def test_the_once_per_step_sync_does_not_grow_with_the_micro_batches(titan):
    """Doubling the global batch (512 -> 1024 sequences: 128 -> 256 micro-batches a pipeline) leaves each stage's
    exposed sync as it was; a stage's micro-batch time is that of the same plan unsharded (zero 0), so
    the sync adds only its once-per-step part. Resharded after each forward, each micro-batch's backward gathers
    again (max(0, AG - backward) per layer, the backward of its compute and tp communication) and the reduce
    stays once per step."""
    p = _hsdp(titan, keep=True)
    data = json.loads((REPO / "instances" / "h100_128.json").read_text())
    data["training"].update(software_stack="torchtitan", global_batch_size=1024)
    double = instance_from_dict(data)
    one, two = evaluate(titan, p), evaluate(double, p)
    assert two.num_micro_batches == 2 * one.num_micro_batches
    assert [s.dp_exposed_s for s in two.stages] == [s.dp_exposed_s for s in one.stages]
    plain = evaluate(titan, dataclasses.replace(p, zero_stage=0, dp_replicate=1, reshard_after_forward=True),
                     check=False)
    assert [s.time_per_micro_batch_s for s in one.stages] == pytest.approx(
        [s.time_per_micro_batch_s for s in plain.stages], rel=1e-12)
    kept, resharded = stage_links(titan, p, 0).layer, stage_links(titan, _hsdp(titan), 0).layer
    assert resharded.step == kept.step
    ag = max(cost.collective_time("all_gather", LAYER_PARAMS_TP8 * 2, cost.group_links(titan.cluster, g),
                                  titan.cluster) for g in p.shard_groups(0))
    assert kept.zero3 == 0.0 and resharded.forward == kept.forward
    assert resharded.zero3 == pytest.approx(max(0.0, ag - kept.backward), rel=1e-12)
    assert resharded.backward == pytest.approx(kept.backward + resharded.zero3, rel=1e-12)


def test_without_pipeline_or_on_other_stacks_the_sync_stays_per_micro_batch(titan):
    """pp = 1 (torchtitan's train_step reduces in every micro-batch's backward) and the megatron stack (Megatron-
    FSDP reduce-scatters in every micro-batch) keep (C12)'s per-micro-batch pricing and expose nothing per step."""
    flat = _hsdp(titan, keep=True, pp=1)
    assert not sharding.grad_sync_once_per_step(titan.training, flat)
    lt = stage_links(titan, flat, 0).layer
    assert lt.step == 0.0 and lt.zero3 > 0.0
    data = json.loads((REPO / "instances" / "h100_128.json").read_text())
    megatron = instance_from_dict(data)
    assert not sharding.grad_sync_once_per_step(megatron.training, _hsdp(megatron, keep=True))
    assert stage_links(megatron, _hsdp(megatron, keep=True), 0).layer.step == 0.0


def titan_instance(seed: int) -> dict:
    """test_sharding_exact's small instances (4 GPUs, irregular links, any replica count, both reshard choices)
    on the torchtitan stack with FSDP (zero 3), so that every pp 2 configuration syncs once per step."""
    data = sharded_instance(seed)
    data["name"] = f"titan{seed}"
    data["training"].update(software_stack="torchtitan", zero_stage=[3])
    return data


SEEDS = [1, 3, 5, 7, 2, 4]  # odd seeds have memory to spare, even ones tight memory
QUICK = 2  # the quick suite checks the first two seeds (one backend each); every pair runs with -m slow


@pytest.mark.parametrize("seed,backend", seeds_by_backend(SEEDS, slow_seeds=SEEDS[QUICK:]))
def test_search_with_pipelined_fsdp_equals_brute_force(seed, backend):
    search_equals_brute_force(titan_instance(seed), backend)


@pytest.mark.parametrize("seed,backend", seeds_by_backend(SEEDS, slow_seeds=SEEDS[QUICK:]))
def test_every_pipelined_fsdp_program_equals_the_evaluator(seed, backend):
    instance = instance_from_dict(titan_instance(seed))
    configs = programs_equal_the_evaluator(instance, backend, 0)
    assert any(sharding.grad_sync_once_per_step(instance.training, c) for c in configs), configs


@pytest.mark.parametrize("seed,backend", seeds_by_backend([1, 3]))
def test_pipelined_fsdp_programs_equal_the_evaluator_under_every_schedule(seed, backend):
    """The same with the schedule free (1F1B, interleaved at vpp 2, InterleavedZeroBubble, ZBVZeroBubble: (P12'),
    (P12'') take the once-per-step sync through delta as (P9)'s), eager so the zero-bubble schedules run."""
    data = titan_instance(seed)
    data["model"]["num_hidden_layers"] = 4
    data["training"].update(torch_compile=False, virtual_pipeline_sizes=[1, 2], pipeline_schedules=[
        "1F1B", "Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble"])
    instance = instance_from_dict(data)
    configs = programs_equal_the_evaluator(instance, backend, 0)
    assert {c.schedule for c in configs if sharding.grad_sync_once_per_step(instance.training, c)} == {
        "1f1b", "zero_bubble", "zbv"}, configs


def test_the_incremental_scorer_prices_the_once_per_step_sync_as_the_evaluator(titan):
    """solvers/local/fast_score.py on the pipelined HSDP plan: random GPU swaps and layer moves, each proposal
    scored as evaluate() scores it (the scorer composes the evaluator's own stage functions)."""
    from test_annealing import walk

    config = _hsdp(titan, keep=True).config
    assert sharding.grad_sync_once_per_step(titan.training, config)
    assert walk(titan, config, 150, seed=3, check_every=5) >= 20
