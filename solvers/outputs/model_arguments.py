"""The model's architecture and its experts as Megatron-LM arguments: every field the planner costs (shape,
vocabulary and its padding, biases, norms, positions and rope scaling, latent attention, experts and router), so
that pretrain_gpt.py builds the model the plan was made for; what Megatron cannot express comes back as a note."""

from __future__ import annotations

from formulation.placement import Placement

# Megatron-LM's Llama 3.1 rope scaling fixes these (megatron/core/models/common/embeddings/rotary_pos_embedding.py)
_MEGATRON_LLAMA3_SCALING = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
# and MLATransformerConfig's YaRN settings without a flag (megatron/core/transformer/transformer_config.py)
_MLA_YARN_DEFAULTS = {"original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1}


def vocab_padding(vocab_size: int, tp: int) -> tuple[int, int]:
    """(--make-vocab-size-divisible-by, padded vocabulary): Megatron-LM pads the vocabulary up to a multiple of
    that value x tp; the largest divisor of 128 that leaves the model's vocabulary as it is, where one exists."""
    for divisor in (128, 64, 32, 16, 8, 4, 2, 1):
        if vocab_size % (divisor * tp) == 0:
            return divisor, vocab_size
    return 1, -(-vocab_size // tp) * tp


def _shape_arguments(model, tp: int) -> tuple[list[tuple[str, object]], list[str]]:
    """Layers, widths, heads, the MLP, norms, biases and the vocabulary."""
    args: list[tuple[str, object]] = [
        ("--num-layers", model.num_layers), ("--hidden-size", model.hidden_size),
        ("--ffn-hidden-size", model.ffn_hidden_size), ("--num-attention-heads", model.num_attention_heads),
        # MLA: the value head width, as the published DeepSeek-V3 / Kimi scripts pass (128); hidden / heads
        # (56 for DeepSeek-V3) describes no projection of an MLA layer
        ("--kv-channels", model.mla.v_head_dim if model.mla is not None else model.head_dim)]
    notes = []
    if model.num_kv_heads != model.num_attention_heads:
        args += [("--group-query-attention", None), ("--num-query-groups", model.num_kv_heads)]
    if model.mlp == "swiglu":
        args.append(("--swiglu", None))
    args.append(("--normalization", "RMSNorm" if model.norm == "rmsnorm" else "LayerNorm"))
    if model.norm_eps is not None:
        args.append(("--norm-epsilon", model.norm_eps))
    if model.qk_norm or model.mla is not None:  # Qwen3's per-head norms; MLA's latent norms (DeepSeek)
        args.append(("--qk-layernorm", None))
    if not (model.attention_bias and model.mlp_bias):  # Megatron's default is a bias in every linear layer
        args.append(("--disable-bias-linear", None))
    if model.attention_bias != model.mlp_bias:
        notes.append("Megatron-LM's --add-bias-linear gives every linear layer a bias or none; this model has "
                     f"biases only in its {'attention' if model.attention_bias else 'MLP'}: "
                     + ("written as --add-qkv-bias, without the output projection's bias (h per layer)"
                        if model.attention_bias else "written without them (--disable-bias-linear)"))
    if model.qkv_bias and not (model.attention_bias and model.mlp_bias):
        args.append(("--add-qkv-bias", None))
    if not model.tie_word_embeddings:
        args.append(("--untie-embeddings-and-output-weights", None))
    divisor, padded = vocab_padding(model.vocab_size, tp)
    args += [("--vocab-size", model.vocab_size), ("--make-vocab-size-divisible-by", divisor)]
    notes.append(f"the vocabulary is {model.vocab_size:,} entries, padded to {padded:,} at tp={tp}"
                 + ("" if padded == model.vocab_size else f" ({padded - model.vocab_size} rows the plan does not "
                    "count: no divisor keeps it)")
                 + ": a tokenizer of that size (--vocab-size is what NullTokenizer reads; it adds one for EOD)")
    return args, notes


def _position_arguments(model, seq_length: int) -> tuple[list[tuple[str, object]], list[str]]:
    """Position embeddings: learned, or rotary with its base and scaling."""
    if model.learned_position_embeddings:
        notes = [] if seq_length <= model.max_position_embeddings else [
            f"seq_length {seq_length} exceeds the model's {model.max_position_embeddings} learned positions"]
        return [("--position-embedding-type", "learned_absolute"),
                ("--max-position-embeddings", model.max_position_embeddings)], notes
    args: list[tuple[str, object]] = [
        ("--position-embedding-type", "rope"),
        ("--max-position-embeddings", max(seq_length, model.max_position_embeddings)),
        ("--rotary-base", round(model.rope_theta))]
    notes = [] if model.rope_theta == round(model.rope_theta) else [
        f"Megatron-LM's --rotary-base is an integer; the model's rope_theta is {model.rope_theta}"]
    scaling = dict(model.rope_scaling or ())
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind in (None, "default"):
        if model.mla is not None:
            args.append(("--rope-type", "rope"))  # MLATransformerConfig's default is YaRN
    elif kind == "llama3":
        args += [("--use-rope-scaling", None), ("--rope-scaling-factor", float(scaling["factor"]))]
        if float(scaling["factor"]) != 8.0:
            notes.append("pretrain_gpt.py (Megatron-LM core_v0.16.1 gpt_builder) does not pass --rope-scaling-factor "
                         f"to GPTModel, which uses 8; the model's factor is {scaling['factor']}: pass it in your builder")
        fixed = {k: v for k, v in _MEGATRON_LLAMA3_SCALING.items() if k in scaling and scaling[k] != v}
        if fixed:
            notes.append(f"Megatron-LM fixes {', '.join(f'{k} = {v}' for k, v in _MEGATRON_LLAMA3_SCALING.items())} "
                         f"of Llama 3.1's rope scaling; the model has {fixed}: change them in its RotaryEmbedding")
    elif kind == "yarn" and model.mla is not None:
        args += [("--rope-type", "yarn"), ("--rotary-scaling-factor", float(scaling["factor"]))]
        args += [(f"--{key.replace('_', '-')}", float(scaling[key])) for key in ("mscale", "mscale_all_dim")
                 if key in scaling]
        unflagged = {k: scaling[k] for k, v in _MLA_YARN_DEFAULTS.items() if k in scaling and scaling[k] != v}
        if unflagged:
            notes.append(f"MLATransformerConfig's YaRN {_MLA_YARN_DEFAULTS} have no flag; the model has {unflagged}")
    elif kind == "linear" and float(scaling["factor"]).is_integer():
        args.append(("--rotary-seq-len-interpolation-factor", int(scaling["factor"])))
    else:
        notes.append(f"rope scaling {dict(scaling)} has no Megatron-LM flag here: the model trains without it")
    return args, notes


def model_arguments(model, seq_length: int, tp: int) -> tuple[list[tuple[str, object]], list[str]]:
    """Megatron-LM's flags for every architectural field of `model` (the mixture-of-experts and latent-attention
    flags apart: `moe_arguments`), so that pretrain_gpt.py builds the model the plan costed."""
    shape, shape_notes = _shape_arguments(model, tp)
    position, position_notes = _position_arguments(model, seq_length)
    notes = shape_notes + position_notes
    if model.mtp_layers:
        notes.append(f"the model's {model.mtp_layers} multi-token prediction module(s) are not in the plan (the "
                     "planner costs the model without them); add --mtp-num-layers to train them")
    return shape + position, notes


def moe_arguments(model, job, p: Placement) -> list[tuple[str, object]]:
    """Megatron-LM's mixture-of-experts and multi-head latent attention flags (docs/moe.md); none for dense."""
    args: list[tuple[str, object]] = []
    moe = model.moe
    if moe is not None:
        dense = [i for i, kind in enumerate(moe.layer_pattern) if not kind]
        args += [("--num-experts", moe.num_experts), ("--moe-router-topk", moe.topk),
                 ("--moe-ffn-hidden-size", moe.expert_ffn_hidden_size),
                 ("--expert-model-parallel-size", p.ep), ("--expert-tensor-parallel-size", p.etp),
                 ("--moe-token-dispatcher-type", "flex" if job.moe_token_dispatcher == "deepep"
                  else job.moe_token_dispatcher)]
        if job.moe_token_dispatcher == "deepep":  # the flex dispatcher with DeepEP's kernels
            args.append(("--moe-enable-deepep", None))
        if job.moe_grouped_gemm:
            args.append(("--moe-grouped-gemm", None))
        if p.moe_a2a_overlap:  # (E10) the all-to-all beside the other micro-batch's compute, weight gradients delayed
            args += [("--overlap-moe-expert-parallel-comm", None), ("--delay-wgrad-compute", None)]
        if dense:  # Megatron-LM's list form, 1 = MoE layer
            args.append(("--moe-layer-freq", "[" + ",".join(str(k) for k in moe.layer_pattern) + "]"))
        if moe.shared_expert_ffn_hidden_size:
            args.append(("--moe-shared-expert-intermediate-size", moe.shared_expert_ffn_hidden_size))
        args += router_arguments(moe.router)
    mla = model.mla
    if mla is not None:
        args += [("--multi-latent-attention", None), ("--kv-lora-rank", mla.kv_lora_rank),
                 ("--qk-head-dim", mla.qk_nope_head_dim), ("--qk-pos-emb-head-dim", mla.qk_rope_head_dim),
                 ("--v-head-dim", mla.v_head_dim)]
        if mla.q_lora_rank is not None:
            args.append(("--q-lora-rank", mla.q_lora_rank))
    return args


def router_arguments(router) -> list[tuple[str, object]]:
    """How tokens choose experts: score function, group-limited routing, scaling, expert bias. Megatron-LM
    renormalises the top-k weights (softmax over the chosen logits; sigmoid scores divided by their sum);
    --moe-router-pre-softmax keeps softmax weights over all experts unrenormalised (norm_topk_prob false)."""
    if router is None:
        return []
    args: list[tuple[str, object]] = []
    if router.score != "softmax":
        args.append(("--moe-router-score-function", router.score))
    elif not router.renormalise:
        args.append(("--moe-router-pre-softmax", None))
    if router.groups:
        args += [("--moe-router-num-groups", router.groups), ("--moe-router-group-topk", router.group_topk)]
    if router.scaling is not None and router.scaling != 1:
        args.append(("--moe-router-topk-scaling-factor", router.scaling))
    if router.expert_bias:
        args.append(("--moe-router-enable-expert-bias", None))
    return args
