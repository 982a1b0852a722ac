"""Megatron-LM's block recompute (`recompute_num_layers` on a placement with recompute "full"; (C4b) and (M4b) in
docs/model.md): the first r layers of each model chunk recompute their forward, the others keep their activations
(megatron/core/transformer/transformer_block.py, `recompute_method == 'block'`). Checked against the two policies
it lies between, the count of recomputed layers by hand, the input checks, the plan file and the exported flags."""

from __future__ import annotations

import csv
import dataclasses
import io
import json

import pytest

from conftest import REPO
from formulation import InputError, evaluate, load_instance
from formulation.data import REFERENCE_DIR
from formulation.placement import default_placement
from formulation.placement_file import load_placement
from solvers.outputs.export import megatron_arguments
from solvers.validation.runs import load_runs


@pytest.fixture(scope="module")
def h100():
    return load_instance(REPO / "instances" / "h100_128.json")


@pytest.fixture(scope="module")
def full(h100):
    """80 layers on pp=4 with vpp=2: 20 layers per stage in two chunks of 10."""
    return default_placement(h100, tp=4, pp=4, cp=1, dp=8, vpp=2, micro_batch_size=1, recompute="full")


def test_recomputed_layers_count_within_each_chunk_as_megatron_core_does(full):
    # block: layer l of a chunk is checkpointed when l < recompute_num_layers; vpp chunks per stage
    assert dataclasses.replace(full, recompute_num_layers=3).recomputed_layers(20) == 6
    assert dataclasses.replace(full, recompute_num_layers=10).recomputed_layers(20) == 20
    assert dataclasses.replace(full, recompute_num_layers=25).recomputed_layers(20) == 20  # capped by the chunk
    assert full.recomputed_layers(20) == 20  # 0: every layer (uniform, one layer per checkpoint)
    assert dataclasses.replace(full, recompute="none").recomputed_layers(20) == 0


def test_zero_or_a_whole_chunk_is_full_recompute(h100, full):
    reference = evaluate(h100, full)
    for r in (10, 11, 40):  # a chunk holds 10 layers
        block = evaluate(h100, dataclasses.replace(full, recompute_num_layers=r))
        assert block.iteration_time_s == reference.iteration_time_s
        assert block.peak_memory_gib == reference.peak_memory_gib


def test_block_lies_between_none_and_full_in_proportion_to_the_recomputed_layers(h100, full):
    """Compute per micro-batch is n_r layers at full recompute's cost and the rest at none's: exactly the
    fraction n_r / L of the way from none to full. Activations fall by the same amount per recomputed layer, and
    stop at full recompute's (which holds the working memory of the layer being recomputed) at a whole chunk."""
    none = evaluate(h100, dataclasses.replace(full, recompute="none"))
    every = evaluate(h100, full)
    acts = {}
    for r in range(1, 10):
        est = evaluate(h100, dataclasses.replace(full, recompute_num_layers=r))
        for stage in range(full.pp):
            n_r, layers = 2 * r, full.layers_per_stage[stage]
            lo, hi, got = none.stages[stage], every.stages[stage], est.stages[stage]
            assert got.compute_s == pytest.approx(lo.compute_s + n_r / layers * (hi.compute_s - lo.compute_s),
                                                  rel=1e-12)
        assert none.iteration_time_s < est.iteration_time_s < every.iteration_time_s
        acts[r] = est.stages[1].memory.activations_gib
    steps = [acts[r] - acts[r + 1] for r in range(1, 9)]
    assert all(step == pytest.approx(steps[0], rel=1e-9) for step in steps) and steps[0] > 0
    # extrapolated to a whole chunk (r = 10), the line meets full recompute's activations
    assert acts[9] - steps[0] == pytest.approx(every.stages[1].memory.activations_gib, rel=1e-9)
    assert every.stages[1].memory.activations_gib < acts[9] < acts[1] < none.stages[1].memory.activations_gib


def test_partial_recompute_fits_where_none_does_not_and_is_faster_than_full(h100, full):
    """The point of the block method: on this 70B-class plan no recompute peaks at 95 GiB against a 64 GiB limit
    (0.8 of 80), full recompute fits with room to spare; recomputing 16 of each stage's 20 layers fits and is
    faster than full."""
    none = evaluate(h100, dataclasses.replace(full, recompute="none"))
    every = evaluate(h100, full)
    block = evaluate(h100, dataclasses.replace(full, recompute_num_layers=8))
    assert not none.fits and every.fits and block.fits
    assert block.iteration_time_s < every.iteration_time_s


@pytest.mark.parametrize("changes, says", [
    ({"recompute": "none"}, 'applies to recompute "full"'),
    ({"recompute": "selective"}, 'applies to recompute "full"'),
])
def test_block_needs_full_recompute(h100, full, tmp_path, changes, says):
    data = {**_plan_dict(full, h100), **changes, "recompute_num_layers": 4}
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    with pytest.raises(InputError, match="recompute_num_layers") as info:
        load_placement(path, h100)
    assert says in str(info.value)


def test_block_is_refused_on_deepspeed_and_negative_counts(h100, full, tmp_path):
    deepspeed = dataclasses.replace(h100, training=dataclasses.replace(h100.training,
                                                                       software_stack="megatron-deepspeed"))
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({**_plan_dict(full, h100), "recompute_num_layers": 4}))
    with pytest.raises(InputError, match="torchtitan and llm-foundry, not megatron-deepspeed"):
        load_placement(path, deepspeed)
    path.write_text(json.dumps({**_plan_dict(full, h100), "recompute_num_layers": -1}))
    with pytest.raises(InputError, match="recompute_num_layers.*>= 0"):
        load_placement(path, h100)


def test_pytorch_stacks_score_a_share_of_checkpointed_blocks(h100, full, tmp_path):
    """FSDP's checkpoint wrapper on a share of the blocks (IBM's fms-fsdp `selective_checkpointing`) or
    torchtitan's every-k-th layer: r of each stage's n layers at full recompute's cost, the rest at none's, on
    FSDP (ZeRO-3) as on Megatron; accepted in a plan file on the torchtitan stack."""
    titan = dataclasses.replace(h100, training=dataclasses.replace(h100.training, software_stack="torchtitan"))
    fsdp = dataclasses.replace(full, tp=1, pp=1, vpp=1, dp=128, layers_per_stage=(80,), zero_stage=3,
                               micro_batch_size=1)
    none = evaluate(titan, dataclasses.replace(fsdp, recompute="none"), check=False)
    every = evaluate(titan, fsdp, check=False)
    for r in (20, 40, 60):
        got = evaluate(titan, dataclasses.replace(fsdp, recompute_num_layers=r), check=False)
        lo, hi = none.stages[0].compute_s, every.stages[0].compute_s
        assert got.stages[0].compute_s == pytest.approx(lo + r / 80 * (hi - lo), rel=1e-12)
        assert none.iteration_time_s < got.iteration_time_s < every.iteration_time_s
        assert every.peak_memory_gib < got.peak_memory_gib < none.peak_memory_gib
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({**_plan_dict(full, h100), "recompute_num_layers": 4}))
    assert load_placement(path, titan).recompute_num_layers == 4


def test_block_is_refused_for_mixture_of_experts_models(tmp_path):
    mixtral = load_instance(REPO / "instances" / "mixtral_8x7b_h100_64.json")
    plan = default_placement(mixtral, tp=1, pp=4, cp=1, dp=16, ep=8, recompute="full")
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({**_plan_dict(plan, mixtral), "recompute_num_layers": 2}))
    with pytest.raises(InputError, match="not modelled for mixture-of-experts"):
        load_placement(path, mixtral)


def test_plan_file_round_trip_and_megatron_flags(h100, full, tmp_path):
    block = dataclasses.replace(full, recompute_num_layers=4)
    data = block.to_dict(h100.cluster)
    assert data["recompute_num_layers"] == 4 and "recompute_num_layers" not in full.to_dict(h100.cluster)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    assert load_placement(path, h100) == block
    flags, _, _ = megatron_arguments(h100, block)
    assert ("--recompute-method", "block") in flags and ("--recompute-num-layers", 4) in flags
    assert ("--recompute-granularity", "full") in flags
    flags, _, _ = megatron_arguments(h100, full)
    assert ("--recompute-method", "uniform") in flags and ("--recompute-num-layers", 1) in flags


def _plan_dict(placement, instance) -> dict:
    return placement.to_dict(instance.cluster)


def test_runs_csv_reads_block_recompute(tmp_path):
    """A user's runs CSV names the block method as `block:r` in its recompute column (docs/validation.md); the
    run is scored between the same run without recompute and with full recompute."""
    header, *rows = (REFERENCE_DIR / "published_runs.csv").read_text().splitlines()
    records = list(csv.DictReader(io.StringIO("\n".join([header, *rows]))))
    base = next(r for r in records if r["model"] == "Llama-3.1-70B" and r["recompute"] in ("", "none")
                and (r["pp"] or "1") != "1")
    variants = {"none": "none", "full": "full", "block": "block:2", "bad": "block:x"}
    path = tmp_path / "mine.csv"
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(records[0]))
        writer.writeheader()
        for value in variants.values():
            writer.writerow({**base, "recompute": value})
    runs = load_runs(path)
    assert runs[2].placement.recompute == "full" and runs[2].placement.recompute_num_layers == 2
    assert "block:<layers per chunk>" in runs[3].skipped_reason
    times = [evaluate(r.instance, r.placement).iteration_time_s for r in runs[:3]]
    assert times[0] < times[2] < times[1]


def test_hint_is_the_fastest_fitting_block_recompute_of_a_full_recompute_plan(tmp_path):
    """`solve` on a job allowed only full recompute: the plan file carries the block-recompute hint, whose layer
    count is the fastest fitting one over every r by brute force and whose time `--evaluate` reproduces."""
    from solvers.outputs.cli import run

    data = json.loads((REPO / "instances" / "small_2x4.json").read_text())
    data["training"]["recompute"] = ["full"]
    instance_path, plan_path = tmp_path / "full_only.json", tmp_path / "plan.json"
    instance_path.write_text(json.dumps(data))
    assert run(["--instance", str(instance_path), "--output", str(plan_path), "--quiet"]) == 0
    plan = json.loads(plan_path.read_text())
    instance = load_instance(instance_path)
    placement = load_placement(plan_path, instance)
    assert placement.recompute == "full" and placement.recompute_num_layers == 0
    fitting = []
    for r in range(1, max(placement.layers_per_stage) // placement.vpp):
        est = evaluate(instance, dataclasses.replace(placement, recompute_num_layers=r))
        if est.fits:
            fitting.append((est.iteration_time_s, r))
    (hint,) = plan["hints"]
    assert (hint["iteration_time_s"], hint["recompute_num_layers"]) == min(fitting)
    assert hint["iteration_time_s"] < plan["estimate"]["iteration_time_s"]
    assert "no bound covers it" in hint["note"]
    assert plan["solver"]["objective_s"] == plan["estimate"]["iteration_time_s"]  # the plan itself is unchanged


def test_no_hint_where_block_recompute_does_not_apply(h100, full):
    from solvers.local.block_recompute import block_recompute_hint

    none = dataclasses.replace(full, recompute="none")
    assert block_recompute_hint(h100, none, evaluate(h100, none)) is None
    titan = dataclasses.replace(h100, training=dataclasses.replace(h100.training, software_stack="torchtitan"))
    assert block_recompute_hint(titan, full, evaluate(titan, full)) is None


def test_torchtitan_files_say_block_recompute_has_no_counterpart_there(h100, full):
    from types import SimpleNamespace

    from solvers.outputs.torchtitan import torchtitan_arguments

    block = dataclasses.replace(full, recompute_num_layers=4)
    _, subcommands, notes = torchtitan_arguments(h100, SimpleNamespace(placement=block,
                                                                       estimate=evaluate(h100, block)))
    assert subcommands == ["activation-checkpoint:full"]
    assert any("first 4 layers of each chunk" in note and "no such option" in note for note in notes)
    _, _, plain_notes = torchtitan_arguments(h100, SimpleNamespace(placement=full, estimate=evaluate(h100, full)))
    assert not any("no such option" in note for note in plain_notes)
