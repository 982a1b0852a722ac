"""Mixture-of-experts configs load as Hugging Face writes them: parameter counts against the published figures,
the layer patterns of each family, and that they load for planning (tests/test_moe_plans.py plans them)."""

from __future__ import annotations

import pytest

from conftest import build_instance, small_instance_dict
from formulation.errors import InputError
from formulation.inputs.model import PRESET_DIR, model_from_dict, read_json_file
from formulation.inputs.moe import parameter_counts


def preset(name: str, **changes):
    path = PRESET_DIR / f"{name}.json"
    data = {**read_json_file(path, str(path), "model"), **changes}
    return model_from_dict(data, str(path), "", allow_moe=True)


# Published totals and active parameters (model cards; Mixtral: Jiang et al. 2024, "46.7B, 12.9B active";
# Mixtral-8x22B: "141B, 39B active"; Qwen3-30B-A3B: "30.5B, 3.3B activated"; Qwen3-235B-A22B: "235B, 22B
# activated"; DeepSeek-V3: "671B, 37B activated",
# without its multi-token prediction module).
@pytest.mark.parametrize("name,total_b,active_b", [
    ("mixtral-8x7b", 46.7, 12.9), ("mixtral-8x22b", 141, 39), ("qwen3-30b-a3b", 30.5, 3.3),
    ("qwen3-235b-a22b", 235, 22), ("deepseek-v3", 671, 37)])
def test_parameter_counts_match_the_published_figures(name, total_b, active_b):
    counts = parameter_counts(preset(name))
    # the figures are rounded to their last digit
    assert counts.total / 1e9 == pytest.approx(total_b, abs=0.5 * 10 ** -_decimals(total_b) + 1e-9)
    assert counts.active / 1e9 == pytest.approx(active_b, abs=0.6 * 10 ** -_decimals(active_b))


def _decimals(x: float) -> int:
    text = repr(x)
    return len(text.partition(".")[2]) if "." in text else 0


def test_deepseek_v3_layers_latent_attention_and_multi_token_prediction():
    model = preset("deepseek-v3")
    assert model.moe.layer_pattern[:4] == (0, 0, 0, 1) and model.moe.num_moe_layers == 58
    assert model.moe.shared_expert_ffn_hidden_size == 2048 and model.moe.topk == 8
    assert model.mla.q_lora_rank == 1536 and model.mla.kv_lora_rank == 512
    # the checkpoint's 685B are the 671B model and a 14B MTP module holding its own copies of the embedding
    # and output head (2 x 0.93B); the training-time module alone is the rest
    counts = parameter_counts(model)
    head = 2 * model.vocab_size * model.hidden_size
    assert (counts.total + counts.mtp + head) / 1e9 == pytest.approx(685, abs=1.0)
    every_other = preset("deepseek-v3", moe_layer_freq=2)
    assert every_other.moe.layer_pattern[:6] == (0, 0, 0, 0, 1, 0)


def test_qwen_layer_pattern_follows_sparse_step_and_dense_only_layers():
    model = preset("qwen3-30b-a3b", decoder_sparse_step=2, mlp_only_layers=[3])
    assert model.moe.layer_pattern[:6] == (0, 1, 0, 0, 0, 1)
    dense = [i for i, moe in enumerate(model.moe.layer_pattern) if not moe]
    assert model.moe.num_moe_layers == model.num_layers - len(dense)
    with pytest.raises(InputError) as info:
        preset("qwen3-30b-a3b", mlp_only_layers=[48])
    assert info.value.field == "mlp_only_layers"


def test_an_expert_count_of_one_is_a_dense_model():
    base = {"num_hidden_layers": 2, "hidden_size": 512, "intermediate_size": 1024, "num_attention_heads": 8,
            "vocab_size": 1000, "hidden_act": "silu"}
    assert model_from_dict({**base, "num_local_experts": 1}, "c.json", "").moe is None


def test_an_moe_instance_loads_for_planning():
    data = small_instance_dict(2, 4, global_batch_size=16)
    data["model"] = {"preset": "qwen3-30b-a3b"}
    model = build_instance(data).model
    assert model.moe.num_experts == 128 and model.moe.num_moe_layers == 48


def test_expert_groups_need_ep_times_etp_to_divide_the_stage():
    from formulation.placement import Placement
    p = Placement(tp=2, pp=1, cp=1, dp=4, vpp=1, micro_batch_size=1, recompute="none", zero_stage=1,
                  layers_per_stage=(4,), gpus=tuple(range(8)))
    assert p.ep_groups(0, 4, 2).tolist() == [[0, 2, 4, 6], [1, 3, 5, 7]]  # etp fastest, then ep
    assert p.expert_dp_groups(0, 2, 2).tolist() == [[0, 4], [1, 5], [2, 6], [3, 7]]
    with pytest.raises(ValueError, match="does not divide"):
        p.ep_groups(0, 3, 1)
