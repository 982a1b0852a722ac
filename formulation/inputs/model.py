"""The transformer being trained: architecture, presets, and per-layer parameters, FLOPs and activations.

Field names follow Hugging Face `config.json`. Dense decoder-only models: Llama-style (RMSNorm, SwiGLU,
GQA, rotary, no dropout) and GPT-style (LayerNorm, GELU MLP, learned positions, dropout). The fields that change
no cost (rotary base and scaling, norm epsilon) are kept so the launch files build the same model
(solvers/outputs/export.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from formulation.data import MODELS_DIR
from formulation.errors import InputError, Section, decode_text, parse_json, read_input_bytes
from formulation.inputs.moe import MOE_IGNORED, LatentAttention, MoE, parameter_counts, read_latent_attention, read_moe

PRESET_DIR = MODELS_DIR

_HF_ACTIVATIONS = {"silu": "swiglu", "swiglu": "swiglu", "gelu": "gelu", "gelu_new": "gelu", "gelu_fast": "gelu",
                   "gelu_pytorch_tanh": "gelu", "relu": "gelu"}
# Keys of HF configs that do not change cost or memory; accepted and ignored so real config.json files load.
# A sliding window (Mistral, Qwen2) only shortens attention, so ignoring it keeps the estimate conservative.
_HF_IGNORED = {
    "architectures", "torch_dtype", "dtype", "transformers_version", "bos_token_id", "eos_token_id",
    "pad_token_id", "initializer_range", "use_cache", "pretraining_tp", "max_position_embeddings",
    "_name_or_path", "sliding_window", "use_sliding_window", "max_window_layers", "layer_types",
    "use_parallel_residual", "rotary_pct", "partial_rotary_factor", "rotary_emb_base", "classifier_dropout",
    "tokenizer_class", "n_positions", "n_ctx", "summary_type", "summary_use_proj", "summary_activation",
    "summary_proj_to_labels", "summary_first_dropout", "scale_attn_weights", "reorder_and_upcast_attn",
    "scale_attn_by_inverse_layer_idx",
}
# Dropout probabilities of HF configs: dropout masks cost memory, so any positive one turns `dropout` on and all
# zero turns it off (GPT-NeoX-20B, Pythia, Qwen2 train without); with none given the activation decides.
_HF_DROPOUT = ("hidden_dropout", "attention_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop", "hidden_dropout_prob",
               "attention_probs_dropout_prob")
_HF_NULLABLE = ("num_key_value_heads", "head_dim", "rope_scaling")  # written as null: the default applies
_HF_NORM_EPS = ("rms_norm_eps", "layer_norm_epsilon", "layer_norm_eps")
# Families whose modelling code has biases that their config.json does not state (transformers' modelling files):
# every linear layer (GPT-2, GPT-BigCode, GPT-NeoX, OPT, BLOOM, Phi), the QKV projection only (Qwen2, Qwen2-MoE);
# and the families that normalise queries and keys per head (Qwen3's q_norm and k_norm, RMSNorms of head_dim).
_ALL_BIASES = ("gpt2", "gpt_bigcode", "gpt_neox", "opt", "bloom", "phi")
_QKV_BIAS = ("qwen2", "qwen2_moe")
_QK_NORM = ("qwen3", "qwen3_moe")


@dataclass(frozen=True)
class Model:
    """A dense decoder. Sizes are those of the whole model (before any parallel split)."""

    name: str
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    vocab_size: int
    head_dim: int
    tie_word_embeddings: bool = False
    mlp: str = "swiglu"  # "swiglu" (3 matrices) or "gelu" (2 matrices)
    norm: str = "rmsnorm"  # "rmsnorm" or "layernorm"
    dropout: bool = False  # GPT-style dropout stores 1-byte masks
    learned_position_embeddings: bool = False
    max_position_embeddings: int = 0
    moe: MoE | None = None  # experts (formulation/inputs/moe.py); None: dense
    mla: LatentAttention | None = None  # multi-head latent attention; None: standard (GQA) attention
    mtp_layers: int = 0  # multi-token prediction depths (DeepSeek-V3), counted apart
    qkv_bias: bool = False  # biases of the query, key and value projections
    attention_bias: bool = False  # a bias of the attention output projection
    mlp_bias: bool = False  # biases of the MLP (and expert) projections
    qk_norm: bool = False  # RMSNorm of each query and key head (Qwen3)
    rope_theta: float = 10000.0  # rotary base (no cost: kept for the launch files)
    rope_scaling: tuple[tuple[str, object], ...] | None = None  # HF rope_scaling items (Llama 3.1's "llama3", YaRN)
    norm_eps: float | None = None  # epsilon of the norms; None: the config gives none

    # ---- parameters -------------------------------------------------------------------------------
    def mlp_bias_params(self, width: int) -> int:
        """Biases of one MLP (or expert) of `width`: its up (and gate) outputs and its down output."""
        return (self.mlp_matrices - 1) * width + self.hidden_size if self.mlp_bias else 0

    @property
    def layer_bias_params(self) -> int:
        """Biases of one layer's attention and dense MLP."""
        q, kv = self.num_attention_heads * self.head_dim, self.num_kv_heads * self.head_dim
        return ((q + 2 * kv) if self.qkv_bias else 0) + (self.hidden_size if self.attention_bias else 0)

    @property
    def attention_params(self) -> int:
        q = self.num_attention_heads * self.head_dim
        kv = self.num_kv_heads * self.head_dim
        return self.hidden_size * (q + 2 * kv) + q * self.hidden_size

    @property
    def mlp_matrices(self) -> int:
        """Weight matrices of one MLP (or one expert): gate, up and down for SwiGLU, up and down for GELU."""
        return 3 if self.mlp == "swiglu" else 2

    @property
    def mlp_params(self) -> int:
        return self.mlp_matrices * self.hidden_size * self.ffn_hidden_size + self.mlp_bias_params(self.ffn_hidden_size)

    @property
    def layer_matmul_params(self) -> int:
        """Parameters of one layer that tensor parallelism splits (the weight matrices)."""
        return self.attention_params + self.mlp_params

    @property
    def norm_params(self) -> int:
        """Weights of one norm over the hidden size (LayerNorm: scale and bias)."""
        return self.hidden_size * (2 if self.norm == "layernorm" else 1)

    @property
    def layer_norm_params(self) -> int:
        """Norm weights and biases of one layer (attention biases, QK norms), counted as replicated across
        tensor-parallel ranks (the split ones are well under 0.1% of a layer). A dense MLP's biases are in
        `mlp_params`, each expert's in its own count."""
        return 2 * self.norm_params + 2 * self.head_dim * self.qk_norm + self.layer_bias_params

    @property
    def embedding_params(self) -> int:
        pos = self.max_position_embeddings * self.hidden_size if self.learned_position_embeddings else 0
        return self.vocab_size * self.hidden_size + pos

    @property
    def output_params(self) -> int:
        """Output layer. Megatron-LM keeps a copy of a tied embedding on the last stage, so count it either way."""
        return self.vocab_size * self.hidden_size

    @property
    def total_params(self) -> int:
        return parameter_counts(self).total

    # ---- FLOPs (one forward pass, whole layer, `tokens` tokens of sequences of length `seq`) ---------
    def layer_matmul_flops(self, tokens: float) -> float:
        return 2.0 * tokens * self.layer_matmul_params

    def layer_attention_flops(self, tokens: float, seq: float, causal: bool = True) -> float:
        """QK^T and attention-times-V: 4 * tokens * seq * heads * head_dim; a causal mask skips half."""
        full = 4.0 * tokens * seq * self.num_attention_heads * self.head_dim
        return full / 2 if causal else full

    def output_layer_flops(self, tokens: float) -> float:
        return 2.0 * tokens * self.hidden_size * self.vocab_size

    def megatron_model_flops(self, sequences: float, seq: int) -> float:
        """FLOPs of one iteration (forward + backward) by Megatron-LM's `num_floating_point_operations`.

        12 B s L h^2 [ (1 + g/a + s/h) q/h + (f/h) * (3/2 if SwiGLU) + V / (2 L h) ]: full (non-causal)
        attention, no recompute. Used for MFU and model TFLOP/s so figures compare with Megatron-LM logs.
        """
        h, L = self.hidden_size, self.num_layers
        q_ratio = self.num_attention_heads * self.head_dim / h
        gated = 1.5 if self.mlp == "swiglu" else 1.0
        return 12.0 * sequences * seq * L * h * h * (
            (1 + self.num_kv_heads / self.num_attention_heads + seq / h) * q_ratio
            + self.ffn_hidden_size / h * gated
            + self.vocab_size / (2.0 * L * h))

    # ---- activations (bytes per layer per micro-batch, 16-bit, before tp/cp division) --------------
    @property
    def mlp_kept_units(self) -> float:
        """Bytes an MLP keeps for the backward per token and unit of its width, 16-bit: SwiGLU's gate and up outputs
        and the activation (2 + 2 + 2), GELU's first output and the activation (2 + 2)."""
        return 6.0 if self.mlp == "swiglu" else 4.0

    def activation_terms(self, seq: int, micro_batch: int) -> tuple[float, float, float]:
        """(tp-split bytes, bytes replicated across tp unless sequence parallel, attention-score bytes).

        Korthikanti et al. 2022 count 34 s b h + 5 a s^2 b for a GPT layer: 24 s b h split by tp (Q, K, V,
        attention output, the two MLP matrices' inputs/outputs), 10 s b h replicated (two norm inputs, the
        QKV and fc1 inputs, two dropout masks) and 5 a s^2 b for the scores (softmax 2, dropout mask 1,
        dropout output 2). Derived here for GQA (K and V are g/a of Q) and SwiGLU (fc1 writes gate and up,
        2 f each, fc2 reads f): split = 2(Q) + 4 g/a (K, V) + 2 (output) + MLP; MLP = 2f/h*(2 + 2) for GELU
        and 2f/h*(2 + 1) for SwiGLU, in units of s b h bytes.
        """
        sbh = float(seq) * micro_batch * self.hidden_size
        q_ratio = self.num_attention_heads * self.head_dim / self.hidden_size
        kv_ratio = self.num_kv_heads * self.head_dim / self.hidden_size
        ffn_ratio = self.ffn_hidden_size / self.hidden_size
        mlp = ffn_ratio * self.mlp_kept_units
        split = sbh * (2 * q_ratio + 4 * kv_ratio + 2 * q_ratio + mlp)
        replicated = sbh * (8.0 + (2.0 if self.dropout else 0.0))
        scores = float(self.num_attention_heads) * seq * seq * micro_batch * (5.0 if self.dropout else 2.0)
        return split, replicated, scores


def model_from_dict(data: dict, file: str, path: str = "model", allow_moe: bool = True) -> Model:
    """Build a `Model` from Hugging Face `config.json` fields (strict: unknown keys are errors), mixture-of-experts
    and latent-attention configs included (docs/moe.md); `allow_moe` is kept for callers of the earlier
    signature and no longer refuses anything."""
    if isinstance(data, dict):  # sizes written as null mean the default
        data = {k: v for k, v in data.items() if not (k in _HF_NULLABLE and v is None)}
    sec = Section(data, file, path)
    if "text_config" in data:
        # Multimodal wrappers (LLaVA, Mllama, ...) nest the language model, which is what is planned; the vision
        # tower is not. The wrapper's name and tie_word_embeddings apply where the text config has none.
        sub = sec.section("text_config")
        inherited = {k: data[k] for k in ("name", "_name_or_path", "tie_word_embeddings") if k in data}
        return model_from_dict({**inherited, **sub.data}, file, sub.path, allow_moe)
    stem = Path(file).parent.name if Path(file).name == "config.json" else Path(file).stem
    name = sec.string("name", default=sec.data.get("_name_or_path") or stem)
    # GPT-2 names where the config uses them; a size given under neither name is reported by its HF name
    layers = sec.integer("n_layer" if sec.has("n_layer") and not sec.has("num_hidden_layers") else "num_hidden_layers")
    hidden = sec.integer("n_embd" if sec.has("n_embd") and not sec.has("hidden_size") else "hidden_size")
    heads = sec.integer("n_head" if sec.has("n_head") and not sec.has("num_attention_heads") else "num_attention_heads")
    kv_heads = sec.integer("num_key_value_heads", default=heads)
    act = sec.string("hidden_act", default=sec.data.get("activation_function", "silu"))
    sec.raw("activation_function", None)
    if act not in _HF_ACTIVATIONS:
        raise sec.error("hidden_act", f"expected one of {', '.join(sorted(_HF_ACTIVATIONS))}; got {act!r}")
    mlp = _HF_ACTIVATIONS[act]
    ffn_default = 4 * hidden if mlp == "gelu" else None
    if sec.has("intermediate_size") or ffn_default is None:
        ffn = sec.integer("intermediate_size")
    else:
        ffn = sec.integer("n_inner", default=None) or ffn_default
    sec.raw("n_inner", None)
    vocab = sec.integer("vocab_size")
    if hidden % heads and not sec.has("head_dim"):
        raise sec.error("num_attention_heads", f"hidden_size {hidden} is not divisible by {heads} heads; give head_dim")
    head_dim = sec.integer("head_dim", default=hidden // heads)
    if heads % kv_heads:
        raise sec.error("num_key_value_heads", f"num_attention_heads {heads} is not divisible by {kv_heads} kv heads")
    tie = sec.boolean("tie_word_embeddings", default=False)
    norm = sec.string("norm", default="rmsnorm" if mlp == "swiglu" else "layernorm", choices=("rmsnorm", "layernorm"))
    probabilities = [sec.number(k, positive=False, minimum=0.0, maximum=1.0) for k in _HF_DROPOUT if sec.has(k)]
    dropout = sec.boolean("dropout", default=any(p > 0 for p in probabilities) if probabilities else mlp == "gelu")
    learned = sec.boolean("learned_position_embeddings", default=False)
    max_pos = sec.integer("max_position_embeddings", default=0, minimum=0)
    moe, _ = read_moe(sec, layers, ffn)
    mla = read_latent_attention(sec)
    mtp = sec.integer("num_nextn_predict_layers", default=0, minimum=0)
    extras = _read_launch_fields(sec)
    for key in list(data):
        if key in _HF_IGNORED or key in MOE_IGNORED:
            sec.raw(key)
    sec.done()
    model = Model(name=name, num_layers=layers, hidden_size=hidden, ffn_hidden_size=ffn, num_attention_heads=heads,
                  num_kv_heads=kv_heads, vocab_size=vocab, head_dim=head_dim, tie_word_embeddings=tie, mlp=mlp,
                  norm=norm, dropout=dropout, learned_position_embeddings=learned, max_position_embeddings=max_pos,
                  moe=moe, mla=mla, mtp_layers=mtp, **extras)
    return model


def _read_launch_fields(sec: Section) -> dict:
    """Biases, QK norms, rotary base and scaling and the norm epsilon: HF keys where the config has them, else the
    family's modelling code (`model_type`)."""
    family = sec.string("model_type", default="")
    every = sec.boolean("bias", default=family in _ALL_BIASES)  # Falcon, Phi: one switch for every linear layer
    attention = sec.boolean("attention_bias", default=every)  # Llama family: q, k, v and o projections
    eps = [sec.number(k, positive=False, minimum=0.0) for k in _HF_NORM_EPS if sec.has(k)]
    scaling = sec.raw("rope_scaling", None)
    if scaling is not None:
        if not isinstance(scaling, dict) or not all(isinstance(v, (int, float, str, list)) for v in scaling.values()):
            raise sec.error("rope_scaling", f"expected an object of numbers and strings, got {scaling!r}")
        scaling = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in scaling.items()))
    return dict(qkv_bias=attention or family in _QKV_BIAS, attention_bias=attention,
                mlp_bias=sec.boolean("mlp_bias", default=every), qk_norm=family in _QK_NORM,
                rope_theta=sec.number("rope_theta", default=sec.number("rotary_emb_base", default=10000.0)),
                rope_scaling=scaling, norm_eps=eps[0] if eps else None)


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.json"))


def read_json_file(path: Path, file: str, field: str) -> dict:
    """A referenced JSON object (preset, HF config.json). Problems with the document as a whole are reported at
    the referencing `field` of `file`, naming the path; a bad field inside it names that file and field."""
    if path.is_dir():
        raise InputError(file, field, f"{path} is a directory; expected the config.json file (inside it?)")
    raw = read_input_bytes(path, file, field)
    try:
        data = parse_json(decode_text(raw, str(path)), str(path))
    except InputError as exc:
        if exc.field != "<root>":
            raise
        raise InputError(file, field, f"{path}: {exc.problem}") from None
    if not isinstance(data, dict):
        raise InputError(file, field, f"{path}: expected a JSON object at the top level")
    return data


def load_model_section(data: dict, file: str, base_dir: Path) -> Model:
    """The instance's `model` section: HF fields inline, `{"preset": name}` or `{"hf_config": path}`."""
    sec = Section(data, file, "model")
    if sec.has("preset"):
        name = sec.string("preset")
        sec.done()
        path = PRESET_DIR / f"{name}.json"
        if name not in preset_names():  # a name, not a path: "../x" must not reach other files
            raise sec.error("preset", f"unknown preset {name!r}; expected one of {', '.join(preset_names())}")
        return model_from_dict(read_json_file(path, file, "model.preset"), str(path), "")
    if sec.has("hf_config"):
        rel = sec.string("hf_config")
        sec.done()
        path = (base_dir / rel).resolve()
        if path == Path(file).resolve():
            raise sec.error("hf_config", "refers to the instance file itself; expected a Hugging Face config.json")
        return model_from_dict(read_json_file(path, file, "model.hf_config"), str(path), "")
    return model_from_dict(data, file, "model")
