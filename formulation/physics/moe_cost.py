"""Mixture-of-experts and latent-attention layers: compute, expert-parallel communication and model FLOPs
(docs/moe.md (E1)-(E8)). Dense models never reach this module's MoE terms: `layer_compute` hands them to
formulation/physics/cost.py unchanged.

Layer kinds (E1): a model whose layers differ (DeepSeek-V3's first three dense layers, Qwen's `mlp_only_layers`)
has a dense and an MoE layer, each costed here (`kind` = "dense" or "moe"); a stage adds up the layers it holds
(formulation/physics/layer_kinds.py). Without `kind` the functions give the pattern's mean layer (share phi of
MoE layers), which the bounds and the GPU-type choice use; for a model of one kind it is that kind's layer.
"""

from __future__ import annotations

import dataclasses
import math

from formulation.physics import cost, grouped_gemm

# Rows of one tile of a grouped GEMM (CUTLASS / Transformer Engine grouped GEMMs tile M by 128): an expert whose
# token count does not fill its last tile still pays for the whole tile (E4).
GROUPED_GEMM_TILE_ROWS = 128


def is_moe(model) -> bool:
    """The model has experts or latent attention: costed here rather than by cost.layer_compute alone."""
    return model.moe is not None or model.mla is not None


def moe_fraction(model) -> float:
    """Share of the layers that are MoE layers (0 for a dense model)."""
    return model.moe.num_moe_layers / model.num_layers if model.moe else 0.0


def kind_share(model, kind: str | None) -> float:
    """The MoE share of the layer a cost function describes: the mean layer (None), a dense (0) or an MoE (1)
    layer. A dense model has no MoE layer."""
    if kind is None:
        return moe_fraction(model)
    if kind not in ("dense", "moe"):
        raise ValueError(f"layer kind must be 'dense' or 'moe', got {kind!r}")
    return 1.0 if kind == "moe" and model.moe is not None else 0.0


def attention_params(model) -> int:
    """Weights of one layer's attention projections: MLA's down/up projections or GQA's Q, K, V, O."""
    return model.mla.params(model.hidden_size, model.num_attention_heads) if model.mla else model.attention_params


def attention_head_dims(model) -> tuple[int, int]:
    """(query/key head width, value head width): MLA's nope + rope and v_head_dim, else head_dim twice."""
    if model.mla:
        return model.mla.qk_nope_head_dim + model.mla.qk_rope_head_dim, model.mla.v_head_dim
    return model.head_dim, model.head_dim


def routed_tokens(job, p) -> float:
    """(E2) Token copies one GPU sends to the experts per MoE layer and micro-batch: top-k of its tokens; with
    tp > 1 Megatron-Core requires sequence parallelism, so each tp rank routes tokens / tp of them."""
    return p.micro_batch_size * job.seq_length / p.cp / p.tp


def expert_tokens(model, job, p) -> float:
    """(E3) Token copies the busiest GPU's local experts process per MoE layer and micro-batch: the top-k copies
    of its own share of tokens (uniform routing), x etp (expert tensor parallelism gathers its group's tokens),
    x the load-imbalance factor."""
    return model.moe.topk * routed_tokens(job, p) * p.etp * job.moe_load_imbalance


def expert_matmul_time(model, job, p, gpu_type) -> float:
    """(E4) The routed experts' GEMMs of one MoE layer, forward, on the busiest GPU.

    FLOPs: 2 x token copies x (matrices x h x f_e / etp). With grouped GEMM the local experts run as one kernel
    at the efficiency of their total work, each expert's rows padded to whole tiles of 128; without it each
    expert is its own GEMM at the efficiency of its own (small) size. Either way each expert's GEMMs run slower
    than the calibrated large GEMM by the shape factor of (E4a) (`expert_shape_slowdown`)."""
    moe = model.moe
    local = moe.num_experts // p.ep
    copies = expert_tokens(model, job, p)
    per_row = 2.0 * model.mlp_matrices * model.hidden_size * moe.expert_ffn_hidden_size / p.etp
    per_expert = copies / local
    fp8 = cost.fp8_gemms(job, gpu_type)
    if job.moe_grouped_gemm:
        rows = math.ceil(per_expert / GROUPED_GEMM_TILE_ROWS) * GROUPED_GEMM_TILE_ROWS
        padded = rows * local * per_row
        return (gpu_type.matmul_time(padded, padded / 1e9, fp8=fp8)
                * expert_shape_slowdown(model, p, gpu_type, rows))
    return (local * gpu_type.matmul_time(per_expert * per_row, per_expert * per_row / 1e9, fp8=fp8)
            * expert_shape_slowdown(model, p, gpu_type, per_expert))


def expert_shape_slowdown(model, p, gpu_type, rows: float) -> float:
    """(E4a) One expert's GEMMs (rows tokens, h, f_e / etp) over their time at the calibrated efficiency: the
    published grouped-GEMM kernel data's shape curve (formulation/physics/grouped_gemm.py); 1 with the term
    `grouped_gemm_shape` off."""
    if not cost.term("grouped_gemm_shape") or rows <= 0:
        return 1.0
    return grouped_gemm.expert_gemm_slowdown(gpu_type, rows, model.hidden_size,
                                             model.moe.expert_ffn_hidden_size / p.etp, model.mlp_matrices)


def router_time(model, job, p, gpu_type) -> float:
    """(E4) The router's GEMM, forward: 2 x tokens / tp x h x E (each tp rank routes its sequence-parallel share),
    in 16 bits also in FP8 runs."""
    flops = 2.0 * routed_tokens(job, p) * model.hidden_size * model.moe.num_experts
    return gpu_type.matmul_time(flops, flops / 1e9)


def permute_bytes(model, job, p) -> float:
    """(E6) The dispatcher's permute and unpermute of the k copies, forward: read + write each, 4 k passes over
    [tokens / tp, h] 16-bit values."""
    return 4 * model.moe.topk * routed_tokens(job, p) * model.hidden_size * 2.0


def _moe_matmul_time(model, job, p, gpu_type, tokens: float) -> float:
    """Forward GEMMs of one MoE layer: attention projections, shared experts (split by tp), the router and the
    routed experts."""
    moe, h = model.moe, model.hidden_size
    dense = 2.0 * tokens * (attention_params(model) + model.mlp_matrices * h * moe.shared_expert_ffn_hidden_size)
    fp8 = cost.fp8_gemms(job, gpu_type)
    flops = dense / p.tp
    return (gpu_type.matmul_time(flops, flops / 1e9, fp8=fp8) + router_time(model, job, p, gpu_type)
            + expert_matmul_time(model, job, p, gpu_type))


def layer_compute(model, job, p, gpu_type, kind: str | None = None) -> cost.LayerTimes:
    """(C1)-(C3) for any model; for MoE / latent-attention models a layer of `kind` or (None) the
    pattern-weighted mean layer (E1)."""
    if not is_moe(model):
        return cost.layer_compute(model, job, p, gpu_type)
    tokens = p.micro_batch_size * job.seq_length / p.cp
    share = kind_share(model, kind)
    fp8 = cost.fp8_gemms(job, gpu_type)
    dense_flops = 2.0 * tokens * (attention_params(model) + model.mlp_params) / p.tp
    dense = gpu_type.matmul_time(dense_flops, dense_flops / 1e9, fp8=fp8) if share < 1 else 0.0
    moe = _moe_matmul_time(model, job, p, gpu_type, tokens) if share > 0 else 0.0
    # (E5) attention core: QK^T at the query/key width, AV at the value width; causal halves with flash attention
    dqk, dv = attention_head_dims(model)
    attn_flops = 2.0 * tokens * job.seq_length * model.num_attention_heads * (dqk + dv) / p.tp
    if job.flash_attention:
        attn_flops /= 2
    attention = cost.attention_time(attn_flops, job, p, gpu_type)
    return cost.LayerTimes(matmul_fwd=(1 - share) * dense + share * moe, attention_fwd=attention,
                           elementwise_fwd=elementwise_bytes(model, job, p, gpu_type, kind)
                           / (gpu_type.hbm_gb_per_s * 1e9))


def elementwise_bytes(model, job, p, gpu_type, kind: str | None = None) -> float:
    """(E6) (C3) with the MLP activation over the width a token actually passes (shared experts + top-k expert
    widths in an MoE layer), plus the dispatcher's permute and unpermute of the k copies (read + write each,
    forward: 4 k passes over [tokens / tp, h])."""
    if model.moe is None:
        return cost.elementwise_bytes(model, job, p, gpu_type)
    moe, share = model.moe, kind_share(model, kind)
    width = moe.shared_expert_ffn_hidden_size + moe.topk * moe.expert_ffn_hidden_size
    mean_width = (1 - share) * model.ffn_hidden_size + share * width
    base = cost.elementwise_bytes(dataclasses.replace(model, ffn_hidden_size=round(mean_width)), job, p, gpu_type)
    return base + share * permute_bytes(model, job, p)


def dispatch_bytes(model, job, p) -> float:
    """(E7) Bytes one GPU sends in one dispatch (and again in one combine) with the all-to-all dispatcher:
    its top-k token copies of h 16-bit values, of which (ep - 1) / ep go to other ranks (uniform routing), x the
    load-imbalance factor for the busiest receiver."""
    moe = model.moe
    copies = moe.topk * routed_tokens(job, p) * job.moe_load_imbalance
    return copies * 2.0 * model.hidden_size


def all_to_all_time(message: float, links: cost.GroupLinks, cluster) -> float:
    """(E7) One all-to-all in which every GPU sends `message` bytes spread evenly over the n members of its
    group (its own share stays). On a group over N nodes with k members on the least populated node, that node's
    GPUs send (k - 1) / n of the message over NVLink and (n - k) / n over their own NIC, both at once: the time is
    the slower of the two (at NCCL's line-rate share, as the other collectives) plus one step of latency."""
    n = links.size
    if n <= 1 or message <= 0:
        return 0.0
    if links.nodes == 1:
        intra_eff = cost.collective_efficiency(cluster)[0]
        return (n - 1) / n * message / (intra_eff * links.intra_gb_per_s * 1e9) + cluster.intra_latency_s
    k = links.per_node
    return _both_levels((k - 1) / n * message, (n - k) / n * message, links, cluster)


def _both_levels(intra_bytes: float, inter_bytes: float, links: cost.GroupLinks, cluster) -> float:
    """A GPU's bytes over NVLink and over its NIC moving at once, each at NCCL's line-rate share: the slower of
    the two plus one inter-node latency step ((E7), (E7'))."""
    intra_eff, inter_eff = cost.collective_efficiency(cluster)
    intra = intra_bytes / (intra_eff * links.intra_gb_per_s * 1e9) if intra_bytes > 0 else 0.0
    inter = inter_bytes / (inter_eff * links.inter_gb_per_s * 1e9)
    return max(intra, inter) + cluster.inter_latency_s


def remote_nodes_per_token(model, links: cost.GroupLinks) -> float:
    """(E7') Other nodes of an expert-parallel group that one token's top-k experts sit on, in expectation under
    uniform routing, seen from a GPU on the group's least populated node (k of its n members): the N - 1 other
    nodes hold E (n - k) / n of the E experts between them, E_r each, and a node is missed when all k_top distinct
    experts fall elsewhere: (N - 1) (1 - prod_{i < k_top} (E - E_r - i) / (E - i))."""
    n, nodes, k = links.size, links.nodes, links.per_node
    if nodes <= 1:
        return 0.0
    experts, top = model.moe.num_experts, model.moe.topk
    per_node = experts * (n - k) / (n * (nodes - 1))
    missed = math.prod(max(0.0, experts - per_node - i) / (experts - i) for i in range(top))
    return (nodes - 1) * (1 - missed)


def deepep_time(model, job, p, links: cost.GroupLinks, cluster) -> float:
    """(E7') One dispatch (or combine) with DeepEP's normal kernels (Megatron-Core's flex dispatcher): a token
    crosses the network once per other node its experts sit on (to the GPU of the same local rank there), and
    NVLink forwards it to the experts' GPUs. Per GPU: (T / t) rho 2h bytes x `remote_nodes_per_token` over its NIC
    and k_top (T / t) rho 2h (k - 1) / k over NVLink (the copies that land on another GPU of a node), both at once,
    at NCCL's line-rate shares as (E7), plus one latency step. Inside one node it is (E7)'s all-to-all."""
    copies = dispatch_bytes(model, job, p)  # k_top (T / t) rho 2h
    if links.nodes <= 1:
        return all_to_all_time(copies, links, cluster)
    k = links.per_node
    return _both_levels(copies * (k - 1) / k, copies / model.moe.topk * remote_nodes_per_token(model, links),
                        links, cluster)


def ep_layer_comm(model, job, p, links: cost.GroupLinks, cluster) -> float:
    """(E7) Token dispatch and combine of one MoE layer, forward, over one expert-parallel group: two
    all-to-alls (alltoall dispatcher), two DeepEP transfers (deepep, (E7')) or an all-gather of the tokens and a
    reduce-scatter of the outputs over the group (allgather dispatcher). Backward moves the same again (counted by
    the caller)."""
    if p.ep == 1 or model.moe is None:
        return 0.0
    if job.moe_token_dispatcher == "deepep":
        return 2 * deepep_time(model, job, p, links, cluster)
    if job.moe_token_dispatcher == "alltoall":
        return 2 * all_to_all_time(dispatch_bytes(model, job, p), links, cluster)
    gathered = p.ep * routed_tokens(job, p) * 2.0 * model.hidden_size
    return (cost.collective_time("all_gather", gathered, links, cluster)
            + cost.collective_time("reduce_scatter", gathered, links, cluster))


def etp_layer_comm(model, job, p, links: cost.GroupLinks, cluster) -> float:
    """(E7) Expert tensor parallelism, one MoE layer, forward: the received token copies are all-gathered over the
    etp group before the experts and the outputs reduce-scattered after them."""
    if p.etp == 1 or model.moe is None:
        return 0.0
    gathered = expert_tokens(model, job, p) * 2.0 * model.hidden_size
    return (cost.collective_time("all_gather", gathered, links, cluster)
            + cost.collective_time("reduce_scatter", gathered, links, cluster))


def layer_params_per_gpu(model, p, kind: str | None = None) -> tuple[float, float]:
    """(non-expert, expert) parameters per GPU of a layer of `kind` or (None) the mean layer (E1): attention,
    dense MLP or shared experts split by tp, the router and norms replicated, routed experts split by ep x etp."""
    h = model.hidden_size
    attention = attention_params(model) / p.tp + model.layer_norm_params
    if model.moe is None:
        return attention + model.mlp_params / p.tp, 0.0
    moe, share = model.moe, kind_share(model, kind)
    moe_layer = model.mlp_matrices * h * moe.shared_expert_ffn_hidden_size / p.tp + h * moe.num_experts
    dense = model.mlp_params / p.tp
    experts = moe.num_experts * model.mlp_matrices * h * moe.expert_ffn_hidden_size / (p.ep * p.etp)
    return attention + (1 - share) * dense + share * moe_layer, share * experts


def model_flops(model, sequences: float, seq: int, causal: bool = False) -> float:
    """(E8) One iteration's model FLOPs as Megatron-LM counts them (forward + backward = 3 x forward, full
    attention, no recompute), with the active weights of each layer: attention, dense MLP or shared + top-k
    experts + router; attention core 2 s (d_qk + d_v) per head and token (`causal`: half of it, as newer
    Megatron-LM counts); the output layer."""
    if not is_moe(model):
        if causal:
            raise ValueError("the causal attention count is defined for MoE / MLA models only")
        return model.megatron_model_flops(sequences, seq)
    h, a = model.hidden_size, model.num_attention_heads
    dqk, dv = attention_head_dims(model)
    core = (1.0 if causal else 2.0) * seq * a * (dqk + dv)
    per_token = 2.0 * model.num_layers * attention_params(model) + model.num_layers * core
    moe = model.moe
    if moe is None:
        per_token += 2.0 * model.num_layers * model.mlp_params
    else:
        active = model.mlp_matrices * h * (moe.shared_expert_ffn_hidden_size + moe.topk * moe.expert_ffn_hidden_size)
        per_token += 2.0 * (moe.num_moe_layers * (active + h * moe.num_experts)
                            + (model.num_layers - moe.num_moe_layers) * model.mlp_params)
    per_token += 2.0 * h * model.vocab_size
    return 3.0 * sequences * seq * per_token
