"""Architecture facts of the presets and the closed forms the cost and memory models rest on."""

import pytest

from formulation.inputs.instance import instance_from_dict
from formulation.physics.memory import layer_activation_bytes
from formulation.inputs.model import PRESET_DIR, model_from_dict, read_json_file
from formulation.placement import Placement


def preset(name):
    path = PRESET_DIR / f"{name}.json"
    return model_from_dict(read_json_file(path, str(path), "model"), str(path), "")


@pytest.mark.parametrize("name, billions", [("llama3-8b", 8.03), ("llama3-70b", 70.55), ("llama3.1-405b", 405.85),
                                            ("gpt3-175b", 174.6)])
def test_preset_parameter_counts_match_published_sizes(name, billions):
    assert preset(name).total_params / 1e9 == pytest.approx(billions, rel=0.01)


def test_megatron_flop_formula_reduces_to_the_72_formula_for_gpt():
    m = preset("gpt3-175b")
    B, s, L, h, V = 8, 2048, m.num_layers, m.hidden_size, m.vocab_size
    expected = 72 * B * s * L * h * h * (1 + s / (6 * h) + V / (12 * L * h))
    assert m.megatron_model_flops(B, s) == pytest.approx(expected, rel=1e-12)


def _gpt_instance(tp, seq=2048, heads=64, hidden=6144, sp=True, flash=False):
    data = {"name": "t", "model": {"num_hidden_layers": 4, "hidden_size": hidden, "intermediate_size": 4 * hidden,
                                   "num_attention_heads": heads, "vocab_size": 51200, "hidden_act": "gelu"},
            "training": {"global_batch_size": 4, "seq_length": seq, "flash_attention": flash, "sequence_parallel": sp},
            "cluster": {"gpu_types": {"a100-sxm-80gb": {}}, "nodes": [{"name": "n", "gpu_type": "a100-sxm-80gb",
                                                                        "gpus": 8}],
                        "network": {"intra_node_gb_per_s": 300, "inter_node_gb_per_s": 25}}}
    return instance_from_dict(data)


@pytest.mark.parametrize("tp, sp", [(1, False), (8, False), (8, True)])
def test_gpt_activations_equal_korthikanti_closed_form(tp, sp):
    """s b h (10 + 24/t + 5 a s / (h t)) without sequence parallelism, s b h (34 + 5 a s / h) / t with it."""
    inst = _gpt_instance(tp, sp=sp)
    p = Placement(tp=tp, pp=1, cp=1, dp=1, vpp=1, micro_batch_size=4, recompute="none", zero_stage=0,
                  layers_per_stage=(4,), gpus=tuple(range(tp)))
    s, b, h, a = 2048, 4, 6144, 64
    per_layer, _ = layer_activation_bytes(inst.model, inst.training, p)
    if sp:
        expected = s * b * h * (34 + 5 * a * s / h) / tp
    else:
        expected = s * b * h * (10 + 24 / tp + 5 * a * s / (h * tp))
    assert per_layer == pytest.approx(expected, rel=1e-12)


def test_selective_recompute_keeps_34_sbh_over_t():
    inst = _gpt_instance(8)
    p = Placement(tp=8, pp=1, cp=1, dp=1, vpp=1, micro_batch_size=4, recompute="selective", zero_stage=0,
                  layers_per_stage=(4,), gpus=tuple(range(8)))
    kept, _ = layer_activation_bytes(inst.model, inst.training, p)
    assert kept == pytest.approx(2048 * 4 * 6144 * 34 / 8, rel=1e-12)
