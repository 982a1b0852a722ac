"""Memory of mixture-of-experts and latent-attention layers (docs/moe.md (EM1)-(EM4)): what changes against the
dense layer of formulation/physics/memory.py. Every term is per GPU and affine in the stage's layer count of each
kind (E1): `kind` "moe" (the default) is an MoE layer, "dense" a dense layer of the same model (its own MLP, no
experts, no routed tokens; latent attention as in every layer)."""

from __future__ import annotations

import dataclasses

from formulation.physics import moe_cost


def layer_state_bytes(instance, p, kind: str = "moe") -> tuple[float, float, float]:
    """(EM1) (weights, gradients, optimizer state) bytes per GPU of one layer of `kind`. Non-expert parameters follow (M1)-(M3); the routed experts are split by ep x etp,
    and with the distributed optimizer (zero 1) their optimizer state is sharded over the expert-data-parallel
    group (tp x cp x dp / (ep x etp) ranks), as Megatron-Core's distributed optimizer does."""
    job = instance.training
    w_bytes, g_bytes, o_bytes = job.bytes_per_param_state
    dense, experts = moe_cost.layer_params_per_gpu(instance.model, p, kind)
    dense_shard = p.dp * p.cp if p.zero_stage >= 1 else 1
    expert_shard = p.expert_dp if p.zero_stage >= 1 else 1
    params = dense + experts
    return params * w_bytes, params * g_bytes, (dense / dense_shard + experts / expert_shard) * o_bytes


def attention_view(model, kind: str = "moe"):
    """The model as the dense activation formulas (M4) should see an MoE / MLA layer: the MLP term is the shared
    experts' width in an MoE layer (the routed tokens are added by `routed_activation_bytes`), the dense width in
    a dense layer, MLA's queries and keys at their
    full head width with as many key/value heads as query heads (values, narrower, counted at the key width)."""
    changes = {}
    if model.moe is not None and kind == "moe":
        changes["ffn_hidden_size"] = model.moe.shared_expert_ffn_hidden_size
    if model.mla is not None:
        changes["head_dim"] = max(moe_cost.attention_head_dims(model))
        changes["num_kv_heads"] = model.num_attention_heads
    return dataclasses.replace(model, **changes, moe=None, mla=None)


def latent_bytes(model, job, p) -> float:
    """(EM3) MLA's compressed query and key/value latents (q_lora_rank + kv_lora_rank + the shared rope key) kept
    for the up-projections' backward, 16-bit, per layer and micro-batch, split by sequence parallelism."""
    if model.mla is None:
        return 0.0
    mla = model.mla
    width = (mla.q_lora_rank or 0) + mla.kv_lora_rank + mla.qk_rope_head_dim
    tokens = p.micro_batch_size * job.seq_length / p.cp
    return 2.0 * tokens * width / job.sequence_parallel_size(p.tp)


def routed_activation_bytes(model, job, p) -> float:
    """(EM2) Bytes an MoE layer keeps per micro-batch for its routed tokens, on the busiest GPU: per token copy
    the permuted expert input (h, x etp: gathered), the first expert GEMM's output (2 f_e / etp for SwiGLU's gate
    and up, f_e for GELU) and the activation's output (f_e / etp), 16-bit; the unpermuted expert outputs of
    the GPU's own copies (h) for the weighted combine; the router's fp32 probabilities (E per routed token)."""
    moe = model.moe
    if moe is None:
        return 0.0
    f_e, h = moe.expert_ffn_hidden_size, model.hidden_size
    widths = (3.0 if model.mlp == "swiglu" else 2.0) * f_e / p.etp
    copies = moe_cost.expert_tokens(model, job, p)
    own = moe.topk * moe_cost.routed_tokens(job, p)
    router = 4.0 * moe_cost.routed_tokens(job, p) * moe.num_experts
    return 2.0 * copies * (h + widths) + 2.0 * own * h + router


def activation_bytes(model, job, p, dense_bytes, kind: str = "moe") -> tuple[float, float]:
    """(EM2)-(EM3) (kept, working) bytes per layer of `kind` and micro-batch: the dense formula
    `dense_bytes(model, job, p)` on the attention view, plus the latents and (MoE layers) the routed tokens, which
    full recompute does not keep (they are recomputed with the layer: working bytes of the layer being
    recomputed)."""
    kept, working = dense_bytes(attention_view(model, kind), job, p)
    routed = routed_activation_bytes(model, job, p) if kind == "moe" else 0.0
    extra = latent_bytes(model, job, p) + routed
    if p.recompute == "full":
        return kept, working + extra
    return kept + extra, working


def dispatch_buffer_bytes(model, job, p) -> float:
    """(EM4) The token dispatcher's send and receive buffers of the layer in flight (one at a time): 2 x the
    dispatched bytes (all-to-all: the k copies, x etp after its gather; all-gather: the ep group's tokens)."""
    if model.moe is None:
        return 0.0
    if job.moe_token_dispatcher in ("alltoall", "deepep"):  # DeepEP's own buffers assumed the same size
        return 2.0 * moe_cost.dispatch_bytes(model, job, p) * p.etp
    return 2.0 * p.ep * moe_cost.routed_tokens(job, p) * 2.0 * model.hidden_size
