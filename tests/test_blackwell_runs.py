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


def test_rack_runs_run_on_trays_in_nvlink_domains_as_the_launcher_segments_them(bridge):
    """GB200 / GB300 runs sit on trays of 4 GPUs (the hosts, a NIC per GPU), the trays of a rack on one NVLink
    domain: Megatron-Bridge's launcher asks Slurm for segments of the tray count up to 18, else its largest divisor
    up to 18, so 2 trays for 8 GPUs, 16 for 64 and 4 racks of 16 for 256. Recorded per row."""
    for run in bridge.values():
        cluster = run.instance.cluster
        if run.gpu_type == "b200":
            assert cluster.nodes[0].num_gpus == 8 and cluster.domain_of_node is None
            assert not any(a.startswith(("gpus_per_node", "nvlink_domain_gpus")) for a in run.assumptions)
            continue
        trays = run.placement.world_size // 4
        segment = trays if trays <= 18 else max(d for d in range(1, 19) if trays % d == 0)
        assert [n.num_gpus for n in cluster.nodes] == [4] * trays
        assert cluster.domain_of_node == tuple(k // segment for k in range(trays))
        assert any(a.startswith("gpus_per_node: 72 -> 4") for a in run.assumptions)
        assert any(a.startswith(f"nvlink_domain_gpus: blank -> {4 * segment}") for a in run.assumptions)
    assert {len(set(bridge[row].instance.cluster.domain_of_node)) for row in (1412, 1413, 1414, 1415)} == {4}


def test_the_racks_price_as_the_nodes_of_64_they_replaced(bridge):
    """Racks of 16 trays at one NVLink figure are what nodes of 64 GPUs were (R1-R2, docs/racks.md): the 256-GPU
    runs' times are unchanged by the re-expression, to the evaluator's rounding."""
    for row in (1408, 1412, 1414):
        run = bridge[row]
        data = run.instance.cluster
        nodes64 = dataclasses.replace(run.instance, cluster=_as_nodes_of(run, 64))
        assert evaluate(nodes64, run.placement, check=False).iteration_time_s == pytest.approx(
            evaluate(run.instance, run.placement, check=False).iteration_time_s, rel=1e-9)
        assert data.domain_of_node is not None and nodes64.cluster.domain_of_node is None


def _as_nodes_of(run, per_node):
    from formulation.inputs.instance import instance_from_dict
    from solvers.validation.run_cluster import cluster_section
    inter = 100.0 if run.gpu_type == "gb300" else 50.0  # the rows' scale-out figures (row_assumptions.csv)
    section = cluster_section(run.gpu_type, run.placement.world_size, per_node, 900.0, inter)
    return instance_from_dict({"name": "x", "model": {"preset": "llama3-8b"},
                               "training": {"global_batch_size": 8, "seq_length": 8},
                               "cluster": section}, "test").cluster


def test_a_domain_size_that_does_not_tile_the_run_is_refused():
    from solvers.validation.run_cluster import cluster_section
    assert cluster_section("gb200", 256, 4, 900, 50, 64)["nvlink_domains"] == {"nodes_per_domain": 16, "prefix": "rack"}
    assert "nvlink_domains" not in cluster_section("gb200", 256, 64, 900, 50)
    with pytest.raises(ValueError, match="nvlink_domain_gpus"):
        cluster_section("gb200", 256, 4, 900, 50, 72)  # 64 trays do not cut into racks of 18
    with pytest.raises(ValueError, match="nvlink_domain_gpus"):
        cluster_section("gb200", 256, 4, 900, 50, 66)  # not whole trays


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
    # every rack row on trays of 4 in NVLink domains of up to 64 GPUs (16 trays), none on nodes of 64
    for run in runs.values():
        if run.gpu_type in ("gb200", "gb300"):
            cluster = run.instance.cluster
            assert {n.num_gpus for n in cluster.nodes} == {4}
            assert len(set(cluster.domain_of_node)) == max(1, run.placement.world_size // 64)


def test_nemo_long_sequence_tflops_count_the_full_attention_core():
    """NeMo's long-sequence page (rows 88-104) computed TFLOPS with `nemo/utils/flops_formulas.py` `llama2` /
    `llama3` as of its B200 table (NVIDIA/NeMo 19fadb67b0, 2025-05-08): gbs s l h^2 (12 + 12 g/a + 18 f/h + 12 s/h
    + 6 V/(l h)), the attention core undiscounted (the causal 0.5 came in 6251117f4c, 2025-08-09). The loader's
    Megatron-LM count is that formula, so the times it derives are the page's; a causal reading would shorten the
    cp rows' (32k tokens and more) times to at most 0.74 of them (docs/validation.md)."""
    rows = {r.row: r for r in crossval.reference_runs() if 88 <= r.row <= 104}
    assert len(rows) == 17
    for run in rows.values():
        m, t = run.instance.model, run.instance.training
        b, s, l, h = t.global_batch_size, t.seq_length, m.num_layers, m.hidden_size
        g, a, f, v = m.num_kv_heads, m.num_attention_heads, m.ffn_hidden_size, m.vocab_size
        nemo = b * s * l * h * h * (12 + 12 * g / a + 18 * f / h + 12 * s / h + 6 * v / (l * h))
        assert m.megatron_model_flops(b, s) == pytest.approx(nemo, rel=1e-5)
        assert run.measured_how == "from TFLOP/s (Megatron-LM formula)"
        causal = nemo - b * s * l * h * h * 6 * s / h
        assert (causal / nemo < 0.74) == (s >= 32768)


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
