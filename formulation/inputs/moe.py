"""Mixture-of-experts layers and multi-head latent attention, read from Hugging Face configs as they are.

Families and their keys:
- Mixtral: `num_local_experts`, `num_experts_per_tok`; every layer is MoE and `intermediate_size` is an
  expert's FFN width.
- Qwen2-MoE / Qwen3-MoE: `num_experts`, `num_experts_per_tok`, `moe_intermediate_size` (an expert),
  `shared_expert_intermediate_size` (Qwen2-MoE's always-on expert), `decoder_sparse_step` and `mlp_only_layers`.
  Layer i is MoE when (i + 1) % decoder_sparse_step == 0 and i is not in mlp_only_layers (transformers'
  Qwen3MoeDecoderLayer); the other layers are dense with `intermediate_size`.
- DeepSeek-V2 / V3: `n_routed_experts`, `n_shared_experts` (each `moe_intermediate_size` wide),
  `num_experts_per_tok`, `first_k_dense_replace`, `moe_layer_freq`: layer i is MoE when i >= first_k_dense_replace
  and i % moe_layer_freq == 0 (transformers' DeepseekV3DecoderLayer); dense layers use `intermediate_size`.
  Multi-head latent attention: `q_lora_rank` (null: no query compression, V2-Lite), `kv_lora_rank`,
  `qk_nope_head_dim`, `qk_rope_head_dim`, `v_head_dim`. Multi-token prediction (`num_nextn_predict_layers`) is
  kept as a count and its parameters are reported apart from the model's: it is a training-time extra module
  (one more MoE layer and a 2h x h projection per depth, sharing the embedding and output head), which the
  published totals (DeepSeek-V3: 671B, 37B active) leave out.

The router's architecture (score function, group-limited routing, scaling of the routed output, expert bias,
renormalised top-k) changes no cost or memory at this level and is kept for the launch files; aux-loss weights and
other training settings are accepted and ignored. The layer pattern uses Megatron-LM's `--moe-layer-freq` list form: 1 = MoE, 0 = dense.
"""

from __future__ import annotations

from dataclasses import dataclass

from formulation.errors import Section

# Keys that say a config is mixture-of-experts (checked before anything else is read).
MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
# Router and training settings that do not change the parameter count, cost or memory modelled here.
MOE_IGNORED = (
    "num_experts_per_tok", "router_aux_loss_coef", "output_router_logits", "router_jitter_noise",
    "aux_loss_alpha", "ep_size", "seq_aux", "quantization_config", "auto_map",
    "norm_topk_prob", "n_group", "topk_group", "topk_method", "routed_scaling_factor", "scoring_func",  # a dense
    # config may carry them; a MoE config's router reads them (`_router`)
)
MLA_KEYS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


@dataclass(frozen=True)
class MoE:
    """The experts of a model: how many, how many a token uses, their width and which layers have them."""

    num_experts: int
    topk: int
    expert_ffn_hidden_size: int
    shared_expert_ffn_hidden_size: int  # always-on experts' total width (0: none)
    layer_pattern: tuple[int, ...]  # per layer: 1 = MoE, 0 = dense (Megatron-LM --moe-layer-freq list)
    router: "Router | None" = None  # None: softmax over the experts, top-k renormalised (Mixtral)

    @property
    def num_moe_layers(self) -> int:
        return sum(self.layer_pattern)


@dataclass(frozen=True)
class LatentAttention:
    """DeepSeek's multi-head latent attention: queries and keys/values through low-rank projections."""

    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int

    def params(self, hidden: int, heads: int) -> int:
        """Weights of one layer's attention, the two latent RMSNorms included."""
        qk = heads * (self.qk_nope_head_dim + self.qk_rope_head_dim)
        if self.q_lora_rank is None:
            q = hidden * qk
        else:  # down-projection, its RMSNorm, up-projection
            q = hidden * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * qk
        kv = (hidden * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank
              + self.kv_lora_rank * heads * (self.qk_nope_head_dim + self.v_head_dim))
        return q + kv + heads * self.v_head_dim * hidden


def read_moe(sec: Section, layers: int, ffn: int | None) -> tuple[MoE | None, int | None]:
    """The model's experts (None for a dense config) and the dense layers' FFN width (None: every layer is MoE
    and the config's `intermediate_size`, if any, was an expert's). Consumes the family's keys from `sec`. An
    expert count of 0 or 1 (written by some dense configs) means dense."""
    for key in MOE_KEYS:
        if sec.has(key) and sec.data[key] in (None, 0, 1):
            sec.raw(key)
            return None, ffn
    if sec.has("num_local_experts"):  # Mixtral: intermediate_size is the experts' width
        experts = sec.integer("num_local_experts", minimum=1)
        router = _router(sec, renormalise=True)
        return MoE(experts, _topk(sec, experts), sec.integer("intermediate_size"), 0, (1,) * layers, router), None
    if sec.has("n_routed_experts"):  # DeepSeek-V2/V3
        experts = sec.integer("n_routed_experts", minimum=1)
        width = sec.integer("moe_intermediate_size")
        shared = sec.integer("n_shared_experts", default=0, minimum=0) * width
        first_dense = sec.integer("first_k_dense_replace", default=0, minimum=0, maximum=layers)
        freq = sec.integer("moe_layer_freq", default=1, minimum=1)
        pattern = tuple(int(i >= first_dense and i % freq == 0) for i in range(layers))
        return MoE(experts, _topk(sec, experts), width, shared, pattern, _router(sec)), ffn
    if sec.has("num_experts"):  # Qwen2-MoE / Qwen3-MoE
        experts = sec.integer("num_experts", minimum=1)
        width = sec.integer("moe_intermediate_size")
        shared = sec.integer("shared_expert_intermediate_size", default=0, minimum=0)
        step = sec.integer("decoder_sparse_step", default=1, minimum=1)
        dense_only = sec.items("mlp_only_layers", default=[], non_empty=False)
        if any(not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < layers for i in dense_only):
            raise sec.error("mlp_only_layers", f"expected layer indices from 0 to {layers - 1}, got {dense_only!r}")
        pattern = tuple(int((i + 1) % step == 0 and i not in dense_only) for i in range(layers))
        return MoE(experts, _topk(sec, experts), width, shared, pattern, _router(sec)), ffn
    if sec.has("num_experts_per_tok") and sec.data["num_experts_per_tok"] not in (None, 0):
        # routing without experts: a mixture-of-experts config that lost its expert count, not a dense model
        raise sec.error("num_experts_per_tok", "given without an expert count: add num_local_experts (Mixtral), "
                                               "n_routed_experts (DeepSeek) or num_experts (Qwen-MoE)")
    return None, ffn


@dataclass(frozen=True)
class Router:
    """How a token's experts are chosen and weighted (HF keys of DeepSeek-V2/V3 and Qwen-MoE configs)."""

    score: str = "softmax"  # scoring_func: "softmax" or "sigmoid"
    renormalise: bool = True  # norm_topk_prob: the top-k weights sum to one
    groups: int | None = None  # n_group: experts in groups, tokens choose ...
    group_topk: int | None = None  # topk_group: ... among the best groups only
    scaling: float | None = None  # routed_scaling_factor
    expert_bias: bool = False  # topk_method "noaux_tc": a per-expert bias for load balancing (a buffer)


def _router(sec: Section, renormalise: bool | None = None) -> Router:
    """The router's settings; Mixtral's code always renormalises (its config has no key for it)."""
    def optional(key: str, read):
        return None if sec.raw(key, None) is None else read(key)

    groups = optional("n_group", sec.integer)
    limited = groups is not None and groups > 1
    return Router(score=sec.string("scoring_func", default="softmax", choices=("softmax", "sigmoid")),
                  renormalise=sec.boolean("norm_topk_prob", default=False) if renormalise is None else renormalise,
                  groups=groups if limited else None, group_topk=optional("topk_group", sec.integer) if limited else None,
                  scaling=optional("routed_scaling_factor", sec.number),
                  expert_bias=sec.raw("topk_method", None) == "noaux_tc")


def _topk(sec: Section, experts: int) -> int:
    return sec.integer("num_experts_per_tok", minimum=1, maximum=experts)


def read_latent_attention(sec: Section) -> LatentAttention | None:
    """Multi-head latent attention where the config has `kv_lora_rank`; consumes its keys."""
    if not sec.has("kv_lora_rank"):
        return None
    q_rank = sec.raw("q_lora_rank", None)
    if q_rank is not None:
        q_rank = sec.integer("q_lora_rank", minimum=1)
    return LatentAttention(q_rank, sec.integer("kv_lora_rank", minimum=1), sec.integer("qk_nope_head_dim", minimum=1),
                           sec.integer("qk_rope_head_dim", minimum=0), sec.integer("v_head_dim", minimum=1))


@dataclass(frozen=True)
class ParameterCounts:
    total: int  # every weight of the model (multi-token prediction modules apart)
    active: int  # the weights one token goes through: shared parts, its top-k experts, the router
    mtp: int  # multi-token prediction modules (training only)


def parameter_counts(model) -> ParameterCounts:
    """Total and active parameters of a dense or MoE `Model`: the one count (`Model.total_params` reads it).
    A tied output layer shares the embedding's weights; the final norm adds h (2h for LayerNorm)."""
    h, heads = model.hidden_size, model.num_attention_heads
    attention = model.mla.params(h, heads) if model.mla else model.attention_params
    per_dense = attention + model.layer_norm_params + model.mlp_params
    ends = model.embedding_params + model.output_params + model.norm_params
    if model.tie_word_embeddings:
        ends -= model.vocab_size * h
    moe = model.moe
    if moe is None:
        total = model.num_layers * per_dense + ends
        return ParameterCounts(total, total, 0)
    expert = model.mlp_matrices * h * moe.expert_ffn_hidden_size + model.mlp_bias_params(moe.expert_ffn_hidden_size)
    shared = (model.mlp_matrices * h * moe.shared_expert_ffn_hidden_size
              + (model.mlp_bias_params(moe.shared_expert_ffn_hidden_size) if moe.shared_expert_ffn_hidden_size else 0))
    base = attention + model.layer_norm_params + shared + h * moe.num_experts  # the router
    dense_layers = model.num_layers - moe.num_moe_layers
    total = dense_layers * per_dense + moe.num_moe_layers * (base + moe.num_experts * expert) + ends
    active = dense_layers * per_dense + moe.num_moe_layers * (base + moe.topk * expert) + ends
    mtp_layer = base + moe.num_experts * expert
    mtp = model.mtp_layers * (mtp_layer + 2 * h * h + 3 * h)  # enorm, hnorm, projection, shared head norm
    return ParameterCounts(total, active, mtp)
