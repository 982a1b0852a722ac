"""Blackwell reference runs (docs/validation.md, formulation/data/reference/README.md): Megatron-Bridge's published
B200 / GB200 / GB300 rows load with the assumptions row_assumptions.csv records, the MoE Model Zoo's GB200 / GB300
rows run on their own catalog types, and a chip whose runs join the fit moves no other chip's figures."""

from __future__ import annotations

import csv
import dataclasses
from collections import Counter

import pytest

from formulation.evaluate import evaluate
from solvers.validation import calibrate, crossval
from solvers.validation.joint_fit import TimeTables, joint_fit
from solvers.validation.runs import REFERENCE_DIR, load_runs, run_from_row


@pytest.fixture(scope="module")
def bridge():
    return {r.row: r for r in crossval.reference_runs() if r.row >= crossval.MEGATRON_BRIDGE_ROW_OFFSET}


def test_megatron_bridge_rows_load_scored_on_their_blackwell_types(bridge):
    assert sorted(bridge) == list(range(1400, 1416))
    assert all(r.skipped_reason is None and r.fitted for r in bridge.values())
    assert Counter(r.gpu_type for r in bridge.values()) == {"b200": 4, "gb200": 6, "gb300": 6}
    assert {crossval.source_family(r.source) for r in bridge.values()} == {"Megatron-Bridge performance summary"}
    assert {r.instance.training.software_stack for r in bridge.values()} == {"megatron"}
    # GB300, 8 GPUs, Llama-3-8B at 8k tokens, global batch 128: 37,556 tokens/s per GPU as published
    assert bridge[1400].measured_iter_s == pytest.approx(128 * 8192 / (37556 * 8))
    assert bridge[1400].measured_how == "from tokens/s"


def test_the_published_tflops_are_the_tokens_with_causal_attention(bridge):
    """Each row's model TFLOP/s over its tokens/s is Megatron-LM's count with half the attention core (causal)
    within 0.5%, not the full count the planner's MFU uses (the 8B rows at 8k tokens 11% below it): times come
    from tokens/s, so the count does not enter them."""
    with open(REFERENCE_DIR / "published_runs_megatron_bridge.csv", newline="") as handle:
        published = [row for row in csv.DictReader(handle)]
    for k, row in enumerate(published):
        model = bridge[1400 + k].instance.model
        full = model.megatron_model_flops(1, 8192) / 8192
        attention = 12.0 * model.num_layers * model.num_attention_heads * model.head_dim * 8192
        per_token = float(row["tflops_per_gpu"]) * 1e12 / float(row["tokens_per_s_per_gpu"])
        assert per_token == pytest.approx(full - attention / 2, rel=0.005)
        assert per_token < 0.97 * full


def test_rack_runs_are_described_as_nodes_of_64_with_the_assumption_recorded(bridge):
    """The NVL72 domain is not modelled yet: GB200 / GB300 runs sit on nodes of 64 GPUs, said per row."""
    for run in bridge.values():
        per_node = run.instance.cluster.nodes[0].num_gpus
        if run.gpu_type == "b200":
            assert per_node == 8 and not any(a.startswith("gpus_per_node") for a in run.assumptions)
        else:
            assert per_node == min(64, run.placement.world_size)
            assert any(a.startswith("gpus_per_node: 72 -> 64") for a in run.assumptions)


def test_mxfp8_and_uneven_pipeline_splits_are_recorded_assumptions(bridge):
    mx = [r for r in bridge.values() if any(a.startswith("precision: mxfp8 -> fp8") for a in r.assumptions)]
    assert len(mx) == 8 and all(r.instance.training.precision == "fp8" for r in mx)
    for row in (1406, 1412, 1414):  # Llama-3.1-405B: 126 layers over pp 8 x vp 8, 8 x 4, 16 x 4 chunks
        split = bridge[row].placement.layers_per_stage
        assert sum(split) == 126 and split[0] == split[-1] == split[1] - 1


def test_a_layers_per_stage_cell_that_does_not_add_up_skips_the_row():
    with open(REFERENCE_DIR / "published_runs_megatron_bridge.csv", newline="") as handle:
        row = next(csv.DictReader(handle))
    run = run_from_row(0, {**row, "inter_node_gb_per_s": "50", "layers_per_stage": "10,20"})
    assert run.skipped_reason and "layers_per_stage" in run.skipped_reason


def test_moe_model_zoo_rack_rows_run_on_gb200_and_gb300():
    runs = {r.row: r for r in load_runs(REFERENCE_DIR / "published_runs_moe.csv")}
    assert [runs[k].gpu_type for k in (2014, 2015, 2016, 2017)] == ["gb200", "gb200", "gb200", "gb300"]
    assert not any("as b200" in flag for r in runs.values() for flag in r.flags)
    # Megatron-Bridge's Qwen3 rows, predicted only: the racks on gb200 / gb300, DGX B200 on b200
    bridge = [r for r in runs.values() if "Megatron-Bridge" in r.source]
    assert Counter(r.gpu_type for r in bridge) == {"gb300": 3, "gb200": 3, "b200": 2}
    assert all(r.skipped_reason is None and not r.fitted for r in bridge)


def _synthetic(rows, efficiency, overhead_s):
    runs = [r for r in calibrate.usable(crossval.reference_runs()) if r.row in rows]
    return [dataclasses.replace(r, measured_iter_s=evaluate(calibrate.with_parameters(
        r, {"matmul_efficiency": efficiency, "iteration_overhead_s": overhead_s}), r.placement,
        check=False).iteration_time_s)
        for r in runs]


def test_a_new_chip_fits_its_efficiency_without_moving_the_other_chips():
    """A100 runs made at (0.70, 0.03 s), Blackwell runs of 4 to 58 s at (0.60, 0.20 s): with the voting rule the
    A100 fit is what the A100 runs alone give and the Blackwell efficiency is fitted at that overhead; without it
    the Blackwell runs pull the shared overhead (the rule is what keeps the other chips still)."""
    a100 = _synthetic((0, 1, 2, 4, 5), 0.70, 0.03)
    blackwell = _synthetic((1402, 1403, 1406, 1414, 1415), 0.60, 0.20)
    both = a100 + blackwell
    tables = TimeTables(both, calibrate.with_parameters)
    alone = joint_fit(a100, calibrate.calibration_key, tables, calibrate.votes_on_overhead)
    joint = joint_fit(both, calibrate.calibration_key, tables, calibrate.votes_on_overhead)
    assert joint.overhead_s == alone.overhead_s == pytest.approx(0.03, abs=0.002)
    assert joint.efficiency["a100-sxm-80gb"] == alone.efficiency["a100-sxm-80gb"]
    assert set(joint.efficiency) == {"a100-sxm-80gb", "b200"}
    assert joint.efficiency["b200"] < 0.60  # the 0.17 s the overhead leaves out is read as slower GEMMs
    unruled = joint_fit(both, calibrate.calibration_key, tables)
    assert unruled.overhead_s > alone.overhead_s + 0.005
