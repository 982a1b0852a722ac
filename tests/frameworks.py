"""The real frameworks (the `frameworks` extra) for the tests: imported or skipped, and Megatron's groups as
megatron-core itself builds them.

With LLM_PLANNER_REQUIRE_FRAMEWORKS=1 (set by .ci/run) a framework that fails to import fails the test instead of
skipping it, so CI cannot pass without having run them.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
from pathlib import Path
from unittest import mock

import pytest

# Megatron-LM's group_desc of each group the plan cares about (megatron/core/parallel_state.py)
GROUP_DESCS = {"tp": "TENSOR_MODEL_PARALLEL_GROUP", "cp": "CONTEXT_PARALLEL_GROUP", "dp": "DATA_PARALLEL_GROUP",
               "dp-cp": "DATA_PARALLEL_GROUP_WITH_CP", "pp": "PIPELINE_MODEL_PARALLEL_GROUP"}
RANK_TOKENS = {"tp": "tp", "cp": "cp", "dp": "dp", "dp-cp": "dp-cp", "pp": "pp"}
EXPERT_GROUP_DESCS = {"ep": "EXPERT_MODEL_PARALLEL_GROUP", "tp": "EXPERT_TENSOR_PARALLEL_GROUP",
                      "dp": "EXPERT_DATA_PARALLEL_GROUP", "tp-ep": "EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP"}


def require(module: str):
    """Import `module`, or skip the test (fail it under LLM_PLANNER_REQUIRE_FRAMEWORKS=1)."""
    try:
        return importlib.import_module(module)
    except Exception as error:  # torchtitan fails with ImportError or RuntimeError when a dependency is missing
        if os.environ.get("LLM_PLANNER_REQUIRE_FRAMEWORKS") == "1":
            pytest.fail(f"{module} is required here (LLM_PLANNER_REQUIRE_FRAMEWORKS=1) but fails to import: {error}")
        pytest.skip(f"{module} not importable ({error}); pip install -e '.[frameworks]'")


class _RecordedGroup:
    def __init__(self, ranks, desc):
        self.ranks, self.desc = list(ranks), desc


def initialize_model_parallel_groups(tp: int, cp: int, dp: int, pp: int, ep: int = 1, etp: int | None = None,
                                     descs: dict[str, str] = GROUP_DESCS, instances: int = 1
                                     ) -> dict[str, list[list[int]]]:
    """The groups megatron-core's real `initialize_model_parallel` creates, in creation order (the dense ones, or
    with `descs=EXPERT_GROUP_DESCS` the expert ones for `ep` and `etp`).

    torch.distributed is told it runs `tp*cp*dp*pp` ranks and `new_group` records its ranks and group_desc
    instead of creating a communicator; every rank creates every group, so rank 0's calls list them all.
    `instances`: num_distributed_optimizer_instances (its intra-instance groups under INTRA_PARTIAL_DATA_PARALLEL_
    GROUP_WITH_CP).
    """
    parallel_state = require("megatron.core.parallel_state")
    dist = require("torch.distributed")
    created: list[_RecordedGroup] = []

    def new_group(ranks=None, group_desc=None, **_):
        created.append(_RecordedGroup(ranks, group_desc))
        return created[-1]

    fake = dict(is_initialized=lambda: True, get_world_size=lambda *a, **k: tp * cp * dp * pp,
                get_rank=lambda *a, **k: 0, new_group=new_group)
    with mock.patch.multiple(dist, **fake):
        parallel_state.destroy_model_parallel()
        try:
            parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                                                     context_parallel_size=cp, expert_model_parallel_size=ep,
                                                     expert_tensor_parallel_size=etp,
                                                     num_distributed_optimizer_instances=instances)
        finally:
            parallel_state.destroy_model_parallel()
    return {name: [g.ranks for g in created if g.desc == desc] for name, desc in descs.items()}


def rank_generator_groups(tp: int, cp: int, dp: int, pp: int) -> dict[str, list[list[int]]]:
    """The groups of megatron-core's `RankGenerator` with initialize_model_parallel's default order."""
    parallel_state = require("megatron.core.parallel_state")
    generator = parallel_state.RankGenerator(tp=tp, ep=1, dp=dp, pp=pp, cp=cp, order="tp-cp-ep-dp-pp")
    return {name: generator.get_ranks(token) for name, token in RANK_TOKENS.items()}


def rank_generator_expert_groups(etp: int, ep: int, expert_dp: int, pp: int) -> dict[str, list[list[int]]]:
    """The expert groups of megatron-core's expert `RankGenerator`, as initialize_model_parallel builds it."""
    parallel_state = require("megatron.core.parallel_state")
    generator = parallel_state.RankGenerator(tp=etp, ep=ep, dp=expert_dp, pp=pp, cp=1, order="tp-cp-ep-dp-pp")
    return {token: generator.get_ranks(token) for token in EXPERT_GROUP_DESCS}


# ---- the model Megatron-LM builds from the exported arguments ------------------------------------------------

MEGATRON_LM_FLAGS = json.loads((Path(__file__).with_name("megatron_lm_flags.json")).read_text())["options"]
# One CPU process holds the whole model: its parameter count is the model's (the parallel sizes only split it), and
# the fused kernels (Transformer Engine, Apex) are off, as they change no parameter.
_WHOLE_MODEL = dict(apply_rope_fusion=False, bias_activation_fusion=False, masked_softmax_fusion=False,
                    bias_dropout_fusion=False, gradient_accumulation_fusion=False, persist_layer_norm=False,
                    tensor_model_parallel_size=1, pipeline_model_parallel_size=1, context_parallel_size=1,
                    expert_model_parallel_size=1, expert_tensor_parallel_size=1, sequence_parallel=False,
                    tp_comm_overlap=False, virtual_pipeline_model_parallel_size=None, pipeline_model_parallel_layout=None,
                    num_layers_in_first_pipeline_stage=None, num_layers_in_last_pipeline_stage=None,
                    recompute_granularity=None, recompute_method=None, recompute_num_layers=None, recompute_modules=None,
                    fp8=None, fp8_param=False, moe_grouped_gemm=False, moe_token_dispatcher_type="allgather",
                    moe_enable_deepep=False, moe_flex_dispatcher_backend="deepep", use_cpu_initialization=True,
                    perform_initialization=False, bf16=False, fp16=False, cp_comm_type=None)


def _moe_freq_type(text: str):
    """Megatron-LM's `moe_freq_type`: an integer, or a Python list expression of 0/1 per layer."""
    return eval(text, {"__builtins__": {}}) if "[" in text else int(text)  # noqa: S307 - Megatron-LM does the same


_TYPES = {"int": int, "float": float, "str": str, "moe_freq_type": _moe_freq_type}


def megatron_lm_namespace(argv: list[str]) -> argparse.Namespace:
    """`argv` read as Megatron-LM core_v0.16.1's parser reads it (tests/megatron_lm_flags.json, written from
    `add_megatron_arguments`): each option with its dest, action, type, nargs and default; an unknown option fails."""
    parser = argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False)
    for flag, option in MEGATRON_LM_FLAGS.items():
        default = option["default"]
        if isinstance(default, str) and default.startswith("<"):  # an object Megatron's parser builds (enum, dtype)
            default = None
        kind = option["action"]
        if kind in ("storetrue", "storefalse"):
            parser.add_argument(flag, dest=option["dest"], action=f"store_{kind[5:]}", default=default)
        elif kind == "storeconst":
            parser.add_argument(flag, dest=option["dest"], action="store_const", const=option["const"], default=default)
        elif kind == "store":
            parser.add_argument(flag, dest=option["dest"], nargs=option["nargs"], default=default,
                                type=_TYPES.get(option["type"], str))
    namespace, unknown = parser.parse_known_args(argv)
    if unknown:
        raise ValueError(f"not options of Megatron-LM core_v0.16.1: {unknown}")
    return namespace


def megatron_grad_reduce_dtype(args: argparse.Namespace) -> str:
    """The dtype Megatron-LM core_v0.16.1 accumulates and reduces gradients in, from its parsed arguments: its
    validate_args under --bf16 (`if args.grad_reduce_in_bf16: args.accumulate_allreduce_grads_in_fp32 = False`,
    `elif not args.accumulate_allreduce_grads_in_fp32 and args.main_grads_dtype == torch.float32: ... = True`),
    then the DDP config's grad_reduce_in_fp32 = accumulate_allreduce_grads_in_fp32 (training.py), else the
    parameters' dtype."""
    fp32 = args.accumulate_allreduce_grads_in_fp32
    if args.bf16 and args.grad_reduce_in_bf16:
        fp32 = False
    elif args.bf16 and args.main_grads_dtype == "fp32":
        fp32 = True
    return "fp32" if fp32 else "bf16" if args.bf16 else "fp16"


def megatron_transformer_config(args: argparse.Namespace):
    """`core_transformer_config_from_args` of Megatron-LM core_v0.16.1 for the fields that shape the model (every
    config field the arguments name, the activation, query groups, experts), on one process (`_WHOLE_MODEL`)."""
    config_module = require("megatron.core.transformer.transformer_config")
    torch = require("torch")
    config_class = config_module.MLATransformerConfig if args.multi_latent_attention else config_module.TransformerConfig
    kw = {f.name: getattr(args, f.name) for f in dataclasses.fields(config_class)
          if hasattr(args, f.name) and f.init and getattr(args, f.name) is not None}
    kw.update(num_moe_experts=args.num_experts, num_query_groups=args.num_query_groups if args.group_query_attention
              else None, layernorm_epsilon=args.layernorm_epsilon)
    if args.swiglu:
        kw.update(activation_func=torch.nn.functional.silu, gated_linear_unit=True, bias_activation_fusion=False)
    if args.rope_type is None:
        kw.pop("rope_type", None)
    kw.update(_WHOLE_MODEL)
    kw = {k: v for k, v in kw.items() if k in {f.name for f in dataclasses.fields(config_class)}}
    return config_class(**kw)


def megatron_gpt_model(argv: list[str]):
    """(megatron-core's `GPTModel` built on the meta device as pretrain_gpt.py's `gpt_builder` builds it from `argv`,
    Megatron-LM's padded vocabulary size)."""
    torch = require("torch")
    parallel_state = require("megatron.core.parallel_state")
    specs = require("megatron.core.models.gpt.gpt_layer_specs")
    gpt = require("megatron.core.models.gpt")
    args = megatron_lm_namespace(argv)
    multiple = args.make_vocab_size_divisible_by * args.tensor_model_parallel_size  # _vocab_size_with_padding
    padded_vocab = -(-args.vocab_size // multiple) * multiple
    config = megatron_transformer_config(args)
    with _single_process(parallel_state), torch.device("meta"):
        if args.num_experts:
            spec = specs.get_gpt_decoder_block_spec(config, use_transformer_engine=False,
                                                    normalization=args.normalization)
        else:
            spec = specs.get_gpt_layer_local_spec(None, False, args.qk_layernorm, args.multi_latent_attention,
                                                  normalization=args.normalization)
        if args.multi_latent_attention:
            _parameter_free_core_attention(spec)
        # without Transformer Engine, megatron-core 0.16.1 still finds HAVE_TE true in multi_latent_attention (its
        # TE names are mocks there) and fails on isinstance(..., TELinear): tell it the truth
        mla = require("megatron.core.transformer.multi_latent_attention")
        with mock.patch.object(mla, "HAVE_TE", False):
            model = _build_gpt(gpt, args, config, spec, padded_vocab)
    return model, padded_vocab


def _build_gpt(gpt, args, config, spec, padded_vocab: int):
    """GPTModel with the arguments pretrain_gpt.py's `gpt_builder` (Megatron-LM core_v0.16.1) passes."""
    return gpt.GPTModel(config=config, transformer_layer_spec=spec, vocab_size=padded_vocab,
                         max_sequence_length=args.max_position_embeddings, pre_process=True, post_process=True,
                         share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights,
                         position_embedding_type=args.position_embedding_type, rotary_percent=args.rotary_percent,
                         rotary_base=args.rotary_base, rope_scaling=args.use_rope_scaling)


def _parameter_free_core_attention(spec) -> None:
    """Multi-latent attention needs Transformer Engine's DotProductAttention (megatron-core's local one takes no
    `k_channels`: "unexpected keyword argument") and this CPU test has no Transformer Engine. Core attention holds
    no parameters in either (softmax(QK^T)V), so a parameter-free module takes its place in each layer's spec."""
    torch = require("torch")

    class CoreAttention(torch.nn.Module):
        def __init__(self, *args, **kwargs):
            super().__init__()

    for layer in getattr(spec, "layer_specs", [spec]):
        layer.submodules.self_attention.submodules.core_attention = CoreAttention


class _OneRankGroup:
    def rank(self) -> int:
        return 0

    def size(self) -> int:
        return 1


class _single_process:
    """megatron-core's model-parallel state for one rank holding everything (torch.distributed faked)."""

    def __init__(self, parallel_state):
        self.parallel_state = parallel_state
        dist = require("torch.distributed")
        fake = dict(is_initialized=lambda: True, get_world_size=lambda *a, **k: 1, get_rank=lambda *a, **k: 0,
                    new_group=lambda *a, **k: _OneRankGroup(), get_process_group_ranks=lambda *a, **k: [0])
        self.patch = mock.patch.multiple(dist, **fake)
        # MLA's rotary embedding asks CUDA for its device unless told to initialise on the CPU
        self.cuda = mock.patch.object(require("torch").cuda, "current_device", lambda: "cpu")

    def __enter__(self):
        self.patch.__enter__()
        self.cuda.__enter__()
        self.parallel_state.destroy_model_parallel()
        self.parallel_state.initialize_model_parallel()
        return self

    def __exit__(self, *exc):
        self.parallel_state.destroy_model_parallel()
        self.cuda.__exit__(*exc)
        return self.patch.__exit__(*exc)


# ---- a Hugging Face model's parameters, from its config.json -------------------------------------------------

def hf_parameter_count(config: dict) -> int:
    """Parameters of the model transformers builds from `config` (its modelling files for Llama, Mixtral,
    Qwen3-MoE, DeepSeek-V3 and GPT-2), written out module by module apart from the planner's count. Buffers
    (DeepSeek-V3's e_score_correction_bias) and multi-token prediction layers (not built by transformers) are not
    parameters."""
    family, h, vocab = config["model_type"], config.get("hidden_size", config.get("n_embd")), config["vocab_size"]
    if family == "gpt2":  # wte, wpe; per layer ln_1, c_attn, c_proj, ln_2, c_fc, c_proj (all with biases); ln_f
        f = config.get("n_inner") or 4 * h
        layer = 2 * h + (3 * h * h + 3 * h) + (h * h + h) + 2 * h + (h * f + f) + (f * h + h)
        return vocab * h + config["n_positions"] * h + config["n_layer"] * layer + 2 * h
    heads = config["num_attention_heads"]
    total = vocab * h * (1 if config.get("tie_word_embeddings") else 2) + h  # embed_tokens, lm_head, final norm
    return total + sum(_hf_attention(config, h, heads) + _hf_mlp(config, h, i) + 2 * h
                       for i in range(config["num_hidden_layers"]))


def _hf_attention(config: dict, h: int, heads: int) -> int:
    if "kv_lora_rank" in config:  # DeepSeek-V3: q_a_proj, q_a_layernorm, q_b_proj, kv_a_proj_with_mqa, ...
        nope, rope, v, kv_rank = (config[k] for k in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                                                      "kv_lora_rank"))
        q_rank = config.get("q_lora_rank")
        q = h * heads * (nope + rope) if q_rank is None else h * q_rank + q_rank + q_rank * heads * (nope + rope)
        return q + h * (kv_rank + rope) + kv_rank + kv_rank * heads * (nope + v) + heads * v * h
    d = config.get("head_dim") or h // heads
    kv = config.get("num_key_value_heads") or heads
    bias = (heads * d + 2 * kv * d + h) if config.get("attention_bias") else 0
    norms = 2 * d if config["model_type"] in ("qwen3", "qwen3_moe") else 0  # q_norm, k_norm
    return h * heads * d + 2 * h * kv * d + heads * d * h + bias + norms


def _hf_mlp(config: dict, h: int, layer: int) -> int:
    family = config["model_type"]
    if family == "mixtral":  # block_sparse_moe: gate, experts w1, w2, w3
        return h * config["num_local_experts"] + config["num_local_experts"] * 3 * h * config["intermediate_size"]
    if family == "qwen3_moe" and layer not in config.get("mlp_only_layers", []) \
            and (layer + 1) % config.get("decoder_sparse_step", 1) == 0:
        return h * config["num_experts"] + config["num_experts"] * 3 * h * config["moe_intermediate_size"]
    if family == "deepseek_v3" and layer >= config["first_k_dense_replace"] and layer % config["moe_layer_freq"] == 0:
        width = config["moe_intermediate_size"]
        return h * config["n_routed_experts"] + (config["n_routed_experts"] + config["n_shared_experts"]) * 3 * h * width
    return 3 * h * config["intermediate_size"]


# ---- torchtitan's model flavours ---------------------------------------------------------------------------------

def _configs(obj):
    """Every dataclass config inside a torchtitan model config (depth first)."""
    yield obj
    for field in dataclasses.fields(obj):
        values = getattr(obj, field.name)
        for value in values if isinstance(values, list) else [values]:
            if dataclasses.is_dataclass(value) and not isinstance(value, type):
                yield from _configs(value)


def torchtitan_flavour_facts(module: str, flavour: str) -> dict:
    """What torchtitan's `model_registry(flavour)` of `torchtitan.models.<module>` builds (on the meta device): its
    parameter count and the architectural fields `solvers.outputs.torchtitan.Flavour` records."""
    torch = require("torch")
    config = require(f"torchtitan.models.{module}").model_registry(flavour).model
    with torch.device("meta"):
        params = sum(p.numel() for p in config.build().parameters())
    ropes = {(c.theta, c.scaling, c.scaling_factor if c.scaling == "llama" else c.rope_factor)
             for c in _configs(config) if hasattr(c, "theta") and hasattr(c, "scaling")}
    eps = {c.eps for c in _configs(config) if type(c).__qualname__ == "RMSNorm.Config"}
    assert len(ropes) == 1 and len(eps) == 1, (ropes, eps)
    theta, scaling, factor = ropes.pop()
    return dict(params=params, num_layers=len(config.layers), hidden_size=config.dim, vocab_size=config.vocab_size,
                rope_theta=float(theta), rope_scaling=None if scaling == "none" else (scaling, float(factor)),
                norm_eps=eps.pop(), tied=bool(getattr(config, "enable_weight_tying", False)))
