"""MXFP8 (`training.fp8_recipe: mxfp8`, formulation/inputs/mxfp8.py): FP8 with one E8M0 scale per 32 elements, as
Transformer Engine runs it on Blackwell. Against the format's own arithmetic: the same GEMM time as FP8 with
delayed scaling, and 1/32 byte of scales per FP8 byte kept (two FP8 copies per weight, one per saved input); the
exported arguments are Megatron-LM's."""

from __future__ import annotations

import copy
import subprocess

import pytest

from conftest import REPO
from formulation import InputError, default_placement, evaluate, instance_from_dict, load_instance
from formulation.physics.memory import fp8_saved_inputs, fp8_weight_copy_bytes
from frameworks import megatron_lm_namespace
from solvers.outputs.export import megatron_args_script


def _gb200(recipe: str | None, precision: str = "fp8", gpu: str = "gb200") -> dict:
    data = {"name": "mx", "model": {"preset": "llama3-8b"},
            "training": {"global_batch_size": 64, "seq_length": 8192, "precision": precision,
                         "software_stack": "megatron"},
            "cluster": {"gpu_types": {gpu: {"preset": gpu}},
                        "nodes": [{"name": "tray0", "gpu_type": gpu, "gpus": 4},
                                  {"name": "tray1", "gpu_type": gpu, "gpus": 4}],
                        "nvlink_domains": {"nodes_per_domain": 2, "gb_per_s": 900},
                        "network": {"intra_node_gb_per_s": 900, "inter_node_gb_per_s": 48}}}
    if recipe:
        data["training"]["fp8_recipe"] = recipe
    return data


def test_mxfp8_runs_at_the_fp8_peak_and_keeps_its_scales():
    delayed, mx = instance_from_dict(_gb200(None)), instance_from_dict(_gb200("mxfp8"))
    p = default_placement(mx, tp=2, pp=2)
    a, b = evaluate(delayed, p), evaluate(mx, p)
    assert b.iteration_time_s == pytest.approx(a.iteration_time_s, rel=1e-12)  # same GEMMs at the same peak
    assert a.peak_memory_gib < b.peak_memory_gib < 1.02 * a.peak_memory_gib
    model, tokens = mx.model, 8192.0
    # a saved input: 1 byte + 1/32 of scales for each FP8 element (fc2 and projection inputs, the two norm outputs)
    split_d, rep_d = fp8_saved_inputs(model, tokens, 0.0, 0.0)
    split_m, rep_m = fp8_saved_inputs(model, tokens, 0.0, 0.0, mxfp8=True)
    q = model.num_attention_heads * model.head_dim
    assert split_m - split_d == pytest.approx(tokens * (model.ffn_hidden_size + q) / 32)
    assert rep_m - rep_d == pytest.approx(2 * tokens * model.hidden_size / 32)
    # a weight: row-wise and column-wise copies, 2/32 byte of scales per parameter beside its FP8 bytes
    params = 1e9
    assert fp8_weight_copy_bytes(mx.training, p, params) == (0.0, pytest.approx(params * 2 / 32))
    assert fp8_weight_copy_bytes(delayed.training, p, params) == (0.0, 0.0)


@pytest.mark.parametrize("data,expected", [
    (_gb200("mxfp8", precision="bf16"), "training.fp8_recipe: mxfp8 is an FP8 recipe"),
    (_gb200("mxfp8", gpu="h100-sxm-80gb"), "GPU type 'h100-sxm-80gb' has none"),
    (_gb200("nvfp4"), "training.fp8_recipe: expected one of delayed, mxfp8"),
])
def test_mxfp8_where_it_cannot_run_is_a_one_line_error(data, expected):
    with pytest.raises(InputError) as info:
        instance_from_dict(data)
    assert expected in str(info.value) and "\n" not in str(info.value)


def test_a_custom_type_may_declare_mx_tensor_cores():
    data = _gb200("mxfp8", gpu="h100-sxm-80gb")
    data["cluster"]["gpu_types"]["h100-sxm-80gb"]["mxfp8"] = True
    assert instance_from_dict(data).training.fp8_recipe == "mxfp8"
    assert not load_instance(REPO / "instances" / "h100_128.json").cluster.gpu_types["h100-sxm-80gb"].mxfp8


class _Plan:
    def __init__(self, instance, placement):
        self.placement, self.estimate = placement, evaluate(instance, placement)


def test_mxfp8_arguments_are_megatrons(tmp_path):
    mx = instance_from_dict(_gb200("mxfp8"))
    script = tmp_path / "megatron_args.sh"
    script.write_text(megatron_args_script(mx, _Plan(mx, default_placement(mx, tp=2, pp=2))))
    shell = f'source "{script}"; printf "%s\\n" "${{MEGATRON_ARGS[@]}}"'
    argv = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, check=True).stdout.splitlines()
    args = megatron_lm_namespace(argv)
    assert (args.fp8, args.fp8_recipe) == ("e4m3", "mxfp8")
    delayed = copy.deepcopy(_gb200(None))
    d = instance_from_dict(delayed)
    script.write_text(megatron_args_script(d, _Plan(d, default_placement(d, tp=2, pp=2))))
    argv = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, check=True).stdout.splitlines()
    assert (megatron_lm_namespace(argv).fp8, megatron_lm_namespace(argv).fp8_recipe) == ("hybrid", "delayed")
