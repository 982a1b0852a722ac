"""The model's own Megatron-LM arguments (solvers/outputs/model_arguments.py): the vocabulary's padding, biases as
each family's code has them, rope scaling."""

from __future__ import annotations

import dataclasses

import pytest

from formulation.inputs.model import model_from_dict
from solvers.outputs.model_arguments import model_arguments, vocab_padding


@pytest.mark.parametrize("vocab, tp, expected", [
    # 128256 = 2^8 x 501, 32000 = 2^8 x 125, 151936 = 2^7 x 1187: the largest 2^k <= 128 with 2^k x tp dividing it
    (128256, 8, (32, 128256)), (128256, 1, (128, 128256)), (32000, 8, (32, 32000)), (151936, 4, (32, 151936)),
    (50257, 2, (1, 50258)),  # GPT-2's odd vocabulary cannot be split over 2 ranks unpadded
])
def test_vocab_padding_keeps_the_planned_vocabulary_where_tp_allows(vocab, tp, expected):
    assert vocab_padding(vocab, tp) == expected


def test_family_biases_are_read_and_counted():
    """Qwen2's code has QKV biases its config does not state (q + 2 kv per layer); a Falcon-style `bias` switch gives
    every linear layer one; Llama's attention_bias gives q, k, v and o biases and is all Megatron cannot say alone."""
    base = {"model_type": "qwen2", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 256}
    qwen2 = model_from_dict(base, "qwen2.json", "")
    plain = model_from_dict({**base, "model_type": "llama"}, "llama.json", "")
    assert qwen2.qkv_bias and not qwen2.attention_bias
    assert qwen2.total_params - plain.total_params == 2 * (4 * 16 + 2 * 2 * 16)
    every = model_from_dict({**base, "model_type": "falcon", "bias": True}, "falcon.json", "")
    assert every.total_params - plain.total_params == 2 * (4 * 16 + 2 * 2 * 16 + 64 + 2 * 128 + 64)
    llama_bias = model_from_dict({**base, "model_type": "llama", "attention_bias": True}, "llama.json", "")
    args, notes = model_arguments(llama_bias, 1024, 1)
    assert ("--add-qkv-bias", None) in args and any("output projection's bias" in note for note in notes)
    # Megatron's default is a bias in every linear layer: biases in the attention alone must not bring the MLP's
    assert ("--disable-bias-linear", None) in args


def test_rope_scaling_and_biases_of_other_families(h100):
    """Llama 3.1's rope scaling, Qwen2's QKV bias (its code has it, its config does not say), GPT-2's biases."""
    llama31 = dataclasses.replace(h100.model, rope_scaling=(("factor", 8.0), ("rope_type", "llama3")))
    qwen2 = dataclasses.replace(h100.model, qkv_bias=True)
    gpt2 = dataclasses.replace(h100.model, qkv_bias=True, attention_bias=True, mlp_bias=True)
    flags = {name: dict(model_arguments(model, 8192, 8)[0]) for name, model in
             (("llama31", llama31), ("qwen2", qwen2), ("gpt2", gpt2))}
    assert "--use-rope-scaling" in flags["llama31"] and flags["llama31"]["--rope-scaling-factor"] == 8.0
    assert "--add-qkv-bias" in flags["qwen2"] and "--disable-bias-linear" in flags["qwen2"]
    assert "--add-qkv-bias" not in flags["gpt2"] and "--disable-bias-linear" not in flags["gpt2"]
