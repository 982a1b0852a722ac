"""The memory counters (docs/model.md (M8)) against derived figures, and the measured peaks (docs/memory.md)."""

import csv

import pytest

from formulation.evaluate import evaluate
from formulation.inputs.instance import instance_from_dict
from formulation.physics.memory import (GIB, NCCL_P2P_CHANNELS_PER_PEER, NCCL_RING_CHANNELS, loss_bytes_per_logit,
                                        memory_coefficients, nccl_buffer_bytes, workspace_gib)
from formulation.placement import Placement, even_split
from solvers.validation.memory_runs import (COUNTERS, MEMORY_PEAKS, TARGET_MEDIAN_ABS_ERROR, over_capacity_runs,
                                            validate_memory_peaks)


def _dict(stack="megatron", n=8, zero=1):
    return {"name": "memory counters", "model": {"preset": "llama3-8b"},
            "training": {"global_batch_size": 64, "seq_length": 4096, "precision": "bf16", "software_stack": stack,
                         "zero_stage": [zero], "recompute": ["full"]},
            "cluster": {"gpu_types": {"h100-sxm-80gb": {}},
                        "nodes": [{"count": max(1, n // 8), "gpu_type": "h100-sxm-80gb", "gpus": min(8, n)}],
                        "network": {"intra_node_gb_per_s": 450, "inter_node_gb_per_s": 50}}}


def _instance(stack="megatron", tp=1, pp=1, dp=8, zero=1):
    return instance_from_dict(_dict(stack, tp * pp * dp, zero), "test")


def _placement(inst, tp, pp, dp, zero=1):
    return Placement(tp=tp, pp=pp, cp=1, dp=dp, vpp=1, micro_batch_size=1, recompute="full", zero_stage=zero,
                     layers_per_stage=even_split(inst.model.num_layers, pp), gpus=tuple(range(tp * pp * dp)))


def test_nccl_buffers_are_channels_times_peers_times_the_three_protocol_buffers():
    # NCCL src/init.cc: Simple 1 << 22, LL 8 x 512 x 8 x 16 = 524288, LL128 120 x 640 x 8 x 8 = 4915200 bytes
    assert nccl_buffer_bytes(1, 1) == 4194304 + 524288 + 4915200
    assert nccl_buffer_bytes(16, 1) == 16 * 9633792 == 154140672
    assert nccl_buffer_bytes(2, 2, buffsize=1 << 20) == 4 * ((1 << 20) + 524288 + 4915200)


def test_counters_nest_and_the_outside_allocator_parts_are_the_derived_figures():
    inst = _instance(tp=8, pp=2, dp=4)
    stage = evaluate(inst, _placement(inst, 8, 2, 4)).stages[0].memory
    assert stage.allocated_gib < stage.reserved_gib < stage.total_gib
    assert stage.counter_gib("nvidia_smi") == stage.total_gib
    # tp and dp rings, one connection per channel; two pipeline peers
    nccl = (2 * nccl_buffer_bytes(NCCL_RING_CHANNELS, 1) + nccl_buffer_bytes(NCCL_P2P_CHANNELS_PER_PEER, 2)) / GIB
    assert stage.nccl_gib == pytest.approx(nccl)
    assert stage.total_gib - stage.reserved_gib == pytest.approx(stage.context_gib + nccl)
    # the nvidia-smi figure (what must fit) keeps the whole runtime overhead: unchanged by the split
    gpu = next(iter(inst.cluster.gpu_types.values()))
    dynamic = stage.activations_gib + stage.buffers_gib
    assert stage.total_gib == pytest.approx(stage.allocated_gib - stage.workspace_gib + gpu.runtime_overhead_gib
                                            + gpu.fragmentation_fraction * dynamic)


def test_workspaces_are_cublas_and_transformer_engine_defaults():
    # PyTorch's CUBLAS_WORKSPACE_CONFIG default ":4096:8" on Hopper (8 x 4 MiB), ":4096:2:16:8" before; Transformer
    # Engine's cuBLASLt workspace 32 MiB on Hopper, 4 MiB before; torchtitan runs no Transformer Engine
    h100 = _instance().cluster.gpu_types["h100-sxm-80gb"]
    assert workspace_gib(_instance().training, h100) * GIB == 32 * 2 ** 20 + 32 * 2 ** 20
    assert workspace_gib(_instance(stack="torchtitan", zero=3).training, h100) * GIB == 32 * 2 ** 20
    a100 = instance_from_dict({**_dict("megatron"), "cluster": {
        "gpu_types": {"a100-sxm-80gb": {}}, "nodes": [{"count": 1, "gpu_type": "a100-sxm-80gb", "gpus": 8}],
        "network": {"intra_node_gb_per_s": 300, "inter_node_gb_per_s": 25}}}, "test")
    gpu = a100.cluster.gpu_types["a100-sxm-80gb"]
    assert workspace_gib(a100.training, gpu) * GIB == 4096 * 1024 * 2 + 16 * 1024 * 8 + 4 * 2 ** 20
    inst = _instance()
    stage = evaluate(inst, _placement(inst, 1, 1, 8)).stages[0].memory
    assert stage.allocated_gib - stage.workspace_gib == pytest.approx(
        stage.weights_gib + stage.gradients_gib + stage.optimizer_gib + stage.activations_gib + stage.buffers_gib)


def test_fused_cross_entropy_keeps_bf16_logits_and_one_fp32_copy():
    inst = _instance(tp=2, pp=2, dp=2)
    p = _placement(inst, 2, 2, 2)
    assert loss_bytes_per_logit(inst.training, p) == 6.0
    last = memory_coefficients(inst, p, 1, "dense")
    first = memory_coefficients(inst, p, 0, "dense")
    logits = inst.training.seq_length * 1 * inst.model.vocab_size / 2  # tokens x local vocabulary
    assert last.buffers[0] - first.buffers[0] == pytest.approx(6.0 * logits)  # 2 bf16 + 4 fp32 per logit


def test_deepspeed_bf16_optimizer_keeps_a_whole_fp32_gradient_buffer():
    # DeepSpeed bf16_optimizer.py: fp32_groups_gradients_flat is zeros_like(the whole flat bf16 group), beside the
    # bf16 gradients; fp32 master weights and Adam moments are the dp-partitioned part (kept at DeepSpeed's fp16
    # accounting of 16 bytes, 4 more than the bf16 optimizer's 12)
    inst = _instance(stack="megatron-deepspeed", tp=1, pp=1, dp=8)
    assert inst.training.bytes_per_param_state == (2.0, 2.0, 16.0)  # what the time model reads: 16-bit reduction
    stage = evaluate(inst, _placement(inst, 1, 1, 8)).stages[0].memory
    assert stage.gradients_gib == pytest.approx(3 * stage.weights_gib)  # 2 + 4 bytes against 2, not divided by dp
    assert stage.optimizer_gib == pytest.approx(stage.weights_gib * 16 / 2 / 8)
    fp16 = instance_from_dict({**_dict("megatron-deepspeed"), "training": {
        **_dict("megatron-deepspeed")["training"], "precision": "fp16"}}, "test")
    assert evaluate(fp16, _placement(fp16, 1, 1, 8)).stages[0].memory.gradients_gib == pytest.approx(
        stage.weights_gib)  # the fp16 ZeRO-1 optimizer partitions its fp32 gradients: 16-bit ones only
    # after the backward, engine.allreduce_bucket flattens the whole fp32 gradient buffer into a new tensor (4 bytes
    # per parameter, twice the bf16 weights) while the activations are gone: with full recompute it is the peak
    assert stage.activations_gib + stage.buffers_gib == pytest.approx(2 * stage.weights_gib)
    megatron = evaluate(_instance(), _placement(_instance(), 1, 1, 8)).stages[0].memory
    assert megatron.activations_gib + megatron.buffers_gib < stage.weights_gib  # no such copy elsewhere


def test_every_measured_row_names_its_source_url_and_counter():
    with open(MEMORY_PEAKS, newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) >= 40
    assert len({r["source"] for r in rows}) >= 4
    for r in rows:
        assert r["source"].strip() and r["url"].startswith("https://") and r["notes"].strip()
        assert r["counter"] in COUNTERS


def test_measured_peaks_held_out_by_source_within_the_target():
    result = validate_memory_peaks()
    assert result["pooled"]["rows"] >= 40 and result["sources"] >= 4
    assert result["pooled"]["median_abs_error"] <= TARGET_MEDIAN_ABS_ERROR
    for counter, st in result["by_counter"].items():
        assert st["median_abs_error"] <= TARGET_MEDIAN_ABS_ERROR, counter


def test_no_measured_run_is_put_over_its_gpu_memory_and_every_measured_oom_is_called():
    assert over_capacity_runs() == []
    ooms = validate_memory_peaks()["measured_oom"]
    assert ooms and not any(o["predicted_to_fit"] for o in ooms)


def test_plan_estimates_carry_each_counter():
    inst = _instance(tp=2, pp=2, dp=2)
    est = evaluate(inst, _placement(inst, 2, 2, 2))
    for stage, d in zip(est.stages, est.to_dict()["stages"]):
        assert d["memory"]["allocated_peak_gib"] == stage.memory.counter_gib("allocated_peak")
        assert d["memory"]["reserved_peak_gib"] == stage.memory.counter_gib("reserved_peak")
        assert d["memory"]["total_gib"] == stage.memory.counter_gib("nvidia_smi")
        assert d["memory"]["allocated_peak_gib"] < d["memory"]["reserved_peak_gib"] < d["memory"]["total_gib"]


def test_a_bad_memory_file_is_one_line_naming_the_row(tmp_path):
    from formulation.errors import InputError
    from solvers.validation.memory_runs import load_memory_rows

    with open(MEMORY_PEAKS, newline="", encoding="utf-8") as handle:
        header, first = handle.readline(), handle.readline()
    bad = tmp_path / "peaks.csv"
    bad.write_text(header + first.replace("reserved_peak", "peak_of_something"), encoding="utf-8")
    with pytest.raises(InputError, match="row 0"):
        load_memory_rows(bad)
    bad.write_text("source,url\nx,https://x\n", encoding="utf-8")
    with pytest.raises(InputError, match="missing columns: counter, measured_gib"):
        load_memory_rows(bad)


def test_exact_program_equals_brute_force_where_the_reduction_copy_is_the_peak():
    # a stage of Megatron-DeepSpeed in bf16 peaks at the larger of two lines in its layer count; the exact program
    # reads which counts fit from stage_memory, so it still finds the brute force's optimum (tests/test_exact.py)
    from test_exact import brute_force, small_instance
    from formulation.physics.memory import gradient_reduction_copy_gib
    from solvers import solve

    data, node_level = small_instance(3)
    data["training"].update(software_stack="megatron-deepspeed", recompute=["full"], seq_length=512, zero_stage=[0, 1])
    data["model"]["vocab_size"] = 8000
    inst = instance_from_dict(data, "test")
    result = solve(inst, solver="cpsat", time_limit=120)
    assert result.solver.status == "optimal"
    assert result.estimate.iteration_time_s == pytest.approx(brute_force(inst, data, node_level), rel=1e-6)
    p = result.placement
    assert any(gradient_reduction_copy_gib(inst.training, p, s.memory.weights_gib)
               >= s.memory.activations_gib + s.memory.buffers_gib - 1e-12 for s in result.estimate.stages)
