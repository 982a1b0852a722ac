"""Megatron-Core's selective recompute by module (`--recompute-modules`, TransformerConfig.recompute_modules): the
activations each module's recompute does not keep (M4') and what recomputing them costs in the backward (C4').

Megatron-Core's modules: "core_attn" (its default, and what `selective` has meant since Korthikanti et al. 2022),
"layernorm" (input_layernorm and pre_mlp_layernorm), "moe_act" (the experts' activation function), "mla_up_proj"
(MLA's up projections and RoPE), "mlp" (a dense layer's MLP), "moe" (the whole MoE layer), "shared_experts".
"layernorm", "moe_act" and "mla_up_proj" discard their outputs after use and recompute them just before the backward
needs them; the others checkpoint the module (keep its input, run its forward again in the backward). The list given
replaces the default: `--recompute-modules layernorm moe_act` does not recompute the attention core.

Per layer and micro-batch on one GPU: T = mbs x seq / cp tokens, sp the sequence-parallel split, k the token copies
the busiest GPU's experts process (moe_cost.expert_tokens), f_e / f_s the expert / shared-expert widths, all 16-bit:
- layernorm: a norm's output (2 T h / sp bytes) where the norm is its own module. Transformer Engine fuses a dense
  layer's two norms into the GEMMs that follow (LayerNormLinear keeps the normalised input it needs), so only the
  pre-MLP norm of an MoE layer (the router and the dispatcher read it) and the input norm of an MLA layer (its down
  projections are plain GEMMs) are affected. Recompute: the norm again, 4 bytes per element at HBM bandwidth.
- moe_act: the activation's output, 2 k f_e / etp bytes; recompute reads the first GEMM's output (2 f_e for SwiGLU,
  f_e for GELU) and writes f_e.
- mla_up_proj: the full-width queries, keys and values (as the memory model counts them, 6 T a d / tp with d the
  widest head) are recomputed from the kept latents: the up-projection GEMMs again.
- mlp: a dense layer's MLP terms (the first GEMM's output and the activation's, fc2's input) and fc1's input; the MLP
  GEMMs and activation again.
- moe: the routed activations (EM2) and the shared experts' terms; the router, the permute, the experts' and shared
  experts' GEMMs and their activation again, and the dispatch and combine once more (one more forward pass of the
  expert-parallel communication, `ep_passes`).
- shared_experts: the shared experts' MLP terms; their GEMMs again.
Each term is of a layer of one kind (docs/moe.md (E1)): "mlp" acts on dense layers (a dense model's, or the dense
layers of a model with both kinds), the MoE modules on MoE layers, "layernorm" on the norms each kind has apart.
"""

from __future__ import annotations

from formulation.inputs.job import DEFAULT_RECOMPUTE_MODULES
from formulation.physics import cost, moe_cost, moe_memory

NORM_BYTES_PER_ELEMENT = 4.0  # a norm's recompute reads its 16-bit input and writes its 16-bit output


def active(job, p) -> frozenset:
    """The modules the placement recomputes: the job's list under `selective` on the megatron stack (torchtitan's
    selective recompute is op-level, formulation/physics/cost.py), nothing otherwise."""
    if p.recompute != "selective" or job.software_stack != "megatron":
        return frozenset()
    return frozenset(job.recompute_modules)


def uses_default(job) -> bool:
    return tuple(job.recompute_modules) == DEFAULT_RECOMPUTE_MODULES


def recomputes_attention_core(job, p) -> bool:
    """`selective` recomputes the attention core: always before Megatron-Core's modules (megatron-deepspeed), and on
    the megatron stack when "core_attn" is among the job's modules."""
    return p.recompute == "selective" and (job.software_stack != "megatron" or "core_attn" in job.recompute_modules)


def _tokens(job, p) -> float:
    return p.micro_batch_size * job.seq_length / p.cp


def _separate_norms(model, moe_layer: bool) -> int:
    """Norms of one layer that are modules of their own (see the module docstring): the MoE layer's pre-MLP norm, an
    MLA layer's input norm."""
    return (1 if moe_layer and model.moe is not None else 0) + (1 if model.mla is not None else 0)


def dropped_bytes(model, job, p, kind: str | None = None) -> float:
    """(M4') Bytes per layer and micro-batch that the active modules do not keep, of a layer of `kind` ("dense" /
    "moe"; None: an MoE layer where the model has experts). Also the working bytes of the one layer being
    recomputed at a time."""
    modules = active(job, p)
    if not modules - {"core_attn"}:
        return 0.0
    tokens, h = _tokens(job, p), model.hidden_size
    sp = job.sequence_parallel_size(p.tp)
    moe_layer = model.moe is not None and kind != "dense"
    fp8_inputs = job.precision == "fp8" and job.software_stack != "torchtitan"  # (M4) FP8 GEMM inputs, 1 byte
    dropped = 0.0
    if "layernorm" in modules:
        dropped += _separate_norms(model, moe_layer) * 2.0 * tokens * h / sp
    if "mlp" in modules and not moe_layer:
        fc2_input = tokens * model.ffn_hidden_size if fp8_inputs else 0.0
        dropped += (model.mlp_kept_units * tokens * model.ffn_hidden_size - fc2_input) / p.tp
        dropped += (1.0 if fp8_inputs else 2.0) * tokens * h / sp
    if moe_layer:
        shared = model.mlp_kept_units * tokens * model.moe.shared_expert_ffn_hidden_size / p.tp
        if "moe" in modules:
            dropped += moe_memory.routed_activation_bytes(model, job, p) + shared
        else:
            if "moe_act" in modules:
                dropped += 2.0 * moe_cost.expert_tokens(model, job, p) * model.moe.expert_ffn_hidden_size / p.etp
            if "shared_experts" in modules:
                dropped += shared
    if "mla_up_proj" in modules and model.mla is not None:
        widest = max(moe_cost.attention_head_dims(model))
        dropped += 6.0 * tokens * model.num_attention_heads * widest / p.tp
    return dropped


def ep_passes(job, p) -> int:
    """Extra forward passes of the expert-parallel communication per MoE layer: the "moe" recompute dispatches and
    combines the tokens once more."""
    return 1 if "moe" in active(job, p) else 0


def extra_backward_time(model, job, p, gpu_type, attention_fwd: float, kind: str | None = None) -> float:
    """(C4') Extra backward compute of a layer of `kind` ("dense" / "moe"; None: the pattern's mean layer) for the
    active modules (seconds, one micro-batch); `attention_fwd` is the attention core's forward ("core_attn")."""
    modules = active(job, p)
    tokens, h = _tokens(job, p), model.hidden_size
    sp = job.sequence_parallel_size(p.tp)
    hbm = gpu_type.hbm_gb_per_s * 1e9
    fp8 = cost.fp8_gemms(job, gpu_type)
    share = moe_cost.kind_share(model, kind)  # the MoE share of the layer described (docs/moe.md (E1))

    def gemm(flops: float) -> float:
        return gpu_type.matmul_time(flops, flops / 1e9, fp8=fp8) if flops > 0 else 0.0

    def activation(width: float, rows: float) -> float:  # the MLP activation over `rows` tokens of `width`
        return cost.activation_units(model, job) * rows * width * 2.0 / hbm

    extra = attention_fwd if "core_attn" in modules else 0.0
    if "layernorm" in modules:
        norms = share * (1 if model.moe is not None else 0) + (1 if model.mla is not None else 0)
        extra += norms * NORM_BYTES_PER_ELEMENT * tokens * h / sp / hbm
    if "mlp" in modules and share < 1:
        extra += (1 - share) * (gemm(2.0 * tokens * model.mlp_params / p.tp)
                                + activation(model.ffn_hidden_size / p.tp, tokens))
    if model.moe is not None and share > 0:
        moe = model.moe
        shared = gemm(2.0 * tokens * model.mlp_matrices * h * moe.shared_expert_ffn_hidden_size / p.tp) + activation(
            moe.shared_expert_ffn_hidden_size / p.tp, tokens)
        copies = moe_cost.expert_tokens(model, job, p)
        expert_act = activation(moe.expert_ffn_hidden_size / p.etp, copies)
        if "moe" in modules:
            extra += share * (moe_cost.router_time(model, job, p, gpu_type) + expert_act + shared
                              + moe_cost.expert_matmul_time(model, job, p, gpu_type)
                              + moe_cost.permute_bytes(model, job, p) / hbm)
        else:
            if "moe_act" in modules:
                extra += share * expert_act
            if "shared_experts" in modules:
                extra += share * shared
    if "mla_up_proj" in modules and model.mla is not None:
        mla, a = model.mla, model.num_attention_heads
        dqk = mla.qk_nope_head_dim + mla.qk_rope_head_dim
        per_token = mla.kv_lora_rank * a * (mla.qk_nope_head_dim + mla.v_head_dim)
        if mla.q_lora_rank is not None:
            per_token += mla.q_lora_rank * a * dqk
        extra += gemm(2.0 * tokens * per_token / p.tp)
    return extra
