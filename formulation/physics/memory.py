"""Memory per GPU of every pipeline stage (docs/model.md (M1)-(M8)), and what each counter would read.

All quantities are bytes per GPU. The formulas are written so that each stage's memory is an affine
function of its layer count for a fixed configuration, except Megatron-DeepSpeed in bf16, whose stage peaks at
the larger of two affine functions (its gradient-reduction copy, (M8)); the exact program and `layer_capacity` ask
`stage_memory` which layer counts fit, so both stay exact, and the lower bounds that read memory off a line
(solvers/bounds/kinds.py, models with dense and MoE layers) only allow more.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from formulation.inputs.mxfp8 import SCALE_BYTES_PER_ELEMENT
from formulation.physics import cost, layer_kinds, moe_cost, moe_memory, moe_overlap, recompute_modules, sharding
from formulation.physics.schedules import in_flight_layer_microbatches, in_flight_micro_batches
from formulation.physics.v_schedules import output_stage
from formulation.inputs.job import DEEPSPEED, DEEPSPEED_BUCKET_ELEMENTS, PYTORCH_STACKS

GIB = float(1 << 30)


@dataclass(frozen=True)
class StageMemory:
    stage: int
    weights_gib: float
    gradients_gib: float
    optimizer_gib: float
    activations_gib: float
    buffers_gib: float  # ZeRO-3 gather buffers, transient logits
    overhead_gib: float  # CUDA context / NCCL + fragmentation
    limit_gib: float  # memory_limit_fraction x the GPU's memory (smallest GPU of the stage)
    capacity_gib: float  # the GPU's memory (smallest GPU of the stage)
    context_gib: float = 0.0  # (M8) CUDA context: outside PyTorch's allocator, part of overhead_gib
    nccl_gib: float = 0.0  # (M8) NCCL's channel buffers (cudaMalloc'd by NCCL): part of overhead_gib
    workspace_gib: float = 0.0  # (M8) cuBLAS / Transformer Engine workspaces: allocated tensors, part of overhead_gib

    @property
    def total_gib(self) -> float:
        """What nvidia-smi shows for the process (the `nvidia_smi` counter), and what must fit."""
        return (self.weights_gib + self.gradients_gib + self.optimizer_gib + self.activations_gib
                + self.buffers_gib + self.overhead_gib)

    @property
    def allocated_gib(self) -> float:
        """(M8) `torch.cuda.max_memory_allocated`: the tensors alive at the peak (the `allocated_peak` counter)."""
        return (self.weights_gib + self.gradients_gib + self.optimizer_gib + self.activations_gib
                + self.buffers_gib + self.workspace_gib)

    @property
    def reserved_gib(self) -> float:
        """(M8) `torch.cuda.max_memory_reserved` (the `reserved_peak` counter; torchtitan's `memory:` figure): what
        the caching allocator holds, i.e. everything but the CUDA context and NCCL's own buffers (the workspaces are
        allocated tensors, inside it)."""
        return self.total_gib - self.context_gib - self.nccl_gib

    def counter_gib(self, counter: str) -> float:
        """The figure a run measured with `counter`: allocated_peak, reserved_peak or nvidia_smi."""
        return {"allocated_peak": self.allocated_gib, "reserved_peak": self.reserved_gib,
                "nvidia_smi": self.total_gib}[counter]

    @property
    def fits(self) -> bool:
        return self.total_gib <= self.limit_gib * (1 + 1e-12)


@dataclass(frozen=True)
class MemoryCoefficients:
    """Per-GPU bytes of one stage as `fixed + per_layer * layers` for each component (exact-program friendly)."""

    weights: tuple[float, float]
    gradients: tuple[float, float]
    optimizer: tuple[float, float]
    activations: tuple[float, float]
    buffers: tuple[float, float]


def layer_activation_bytes(model, job, p) -> tuple[float, float]:
    """(M4) (bytes kept per layer per micro-batch, working bytes of one layer during its backward).

    Korthikanti et al. 2022 terms from `Model.activation_terms`, per GPU: tp-split terms / tp; replicated
    terms / tp with sequence parallelism (else whole); attention scores / tp unless flash attention, which
    keeps only fp32 softmax statistics (4 a s b / tp). Context parallelism divides the sequence by cp.
    selective recompute drops the scores; full recompute keeps only the layer input 2 s b h (/ tp with
    sequence parallelism) and needs one layer's full activations while it recomputes.
    """
    seq = job.seq_length / p.cp
    split, replicated, scores = model.activation_terms(seq, p.micro_batch_size)
    sp = job.sequence_parallel_size(p.tp)
    if job.flash_attention:
        attention = 4.0 * model.num_attention_heads * seq * p.micro_batch_size / p.tp
    else:
        attention = scores * p.cp / p.tp  # a local query block against the whole key sequence
    if job.precision == "fp8" and job.software_stack != "torchtitan" and cost.term("fp8_saved_inputs"):
        split, replicated = fp8_saved_inputs(model, seq * p.micro_batch_size, split, replicated,
                                             job.fp8_recipe == "mxfp8")
    full_layer = split / p.tp + replicated / sp + attention
    if p.recompute == "none":
        return full_layer, 0.0
    eager_working = eager_backward_working(model, job, p, seq, sp)
    if p.recompute == "selective" and job.software_stack == "torchtitan" and job.flash_attention \
            and cost.term("op_level_selective"):
        return op_level_selective_bytes(model, seq, p.micro_batch_size, p.tp, sp), eager_working or 0.0
    if p.recompute == "selective" and not recompute_modules.recomputes_attention_core(job, p):
        return full_layer, 0.0  # Megatron-Core modules without "core_attn": the attention keeps what it keeps
    if p.recompute == "selective":
        kept = split / p.tp + replicated / sp + (attention if job.flash_attention else 0.0)
        return kept, (0.0 if job.flash_attention else attention)
    return 2.0 * seq * p.micro_batch_size * model.hidden_size / sp, eager_working or full_layer


def eager_backward_working(model, job, p, seq: float, sp: int) -> float | None:
    """(M4) Working bytes of one checkpointed layer's backward in eager torchtitan (no torch.compile), beyond what
    the layers keep: each op's output and, in the backward, its gradient are tensors of their own. Measured op by
    op on torchtitan 9dec370's Llama block (its default `rmsnorm` in fp32, complex rotary, GQA by `repeat_kv`,
    SDPA, SwiGLU) with torch 2.13, weights taking gradients (docs/physics.md `eager_working_memory`,
    docs/measure_torchtitan_memory.py): five [tokens, f] and ten [tokens, h] 16-bit tensors with op-level
    selective checkpointing, six and twelve with full. None where the measurement does not apply (compiled blocks,
    other stacks, other MLPs, no checkpointing)."""
    if not (job.software_stack in PYTORCH_STACKS and not job.torch_compile and model.mlp == "swiglu"
            and job.flash_attention and p.recompute in ("selective", "full") and cost.term("eager_working_memory")):
        return None
    f_units, h_units = (5.0, 10.0) if p.recompute == "selective" else (6.0, 12.0)
    tokens = seq * p.micro_batch_size
    return 2.0 * tokens * (f_units * model.ffn_hidden_size / p.tp + h_units * model.hidden_size / sp)


def fp8_saved_inputs(model, tokens: float, split: float, replicated: float,
                     mxfp8: bool = False) -> tuple[float, float]:
    """(M4) with FP8 (Transformer Engine): a Linear saves its input for the weight gradient in FP8, 1 byte
    instead of 2. The two norm outputs (QKV and fc1 inputs, 2 s b h in `replicated`) and the fc2 input (2 s b f
    in `split`) are the GEMMs' own copies; the projection's input is also the attention output that the
    attention kernel keeps in bf16, so its FP8 copy is one byte more (q wide). MXFP8 (M6'): each of these FP8
    bytes carries 1 / 32 byte of block scales. Returns (split, replicated)."""
    q = model.num_attention_heads * model.head_dim
    f, h = model.ffn_hidden_size, model.hidden_size
    scales = SCALE_BYTES_PER_ELEMENT if mxfp8 else 0.0
    return (split - tokens * f + tokens * q + scales * tokens * (f + q),
            replicated - 2.0 * tokens * h + scales * 2.0 * tokens * h)


def op_level_selective_bytes(model, seq: float, micro_batch: int, tp: int, sp: int) -> float:
    """torchtitan's op-level selective checkpointing keeps, per layer, the block input and the outputs of the
    matmuls it does not recompute (wq, wv, w1, w2 of the seven wq wk wv wo w1 w3 w2: every second one is
    recomputed) and of SDPA (output and fp32 log-sum-exp), all 16-bit: 2 s b (h + q + kv + q + f + h) bytes,
    the head-width and MLP terms split by tp, the two h-wide terms by sequence parallelism."""
    tokens = seq * micro_batch
    q = model.num_attention_heads * model.head_dim
    kv = model.num_kv_heads * model.head_dim
    split = 2.0 * tokens * (q + kv + q + model.ffn_hidden_size) + 4.0 * tokens * model.num_attention_heads
    return split / tp + 2.0 * tokens * 2 * model.hidden_size / sp


def fp8_weight_copy_bytes(job, p, layer_params: float) -> tuple[float, float]:
    """(M6) Transformer Engine keeps an FP8 copy of every layer's GEMM weights and its transpose for the
    backward (1 + 1 byte per parameter), for the whole iteration (reused across micro-batches); with ZeRO-3
    (torchao's FP8 all-gather) only the two layers in flight are unsharded. With FP8 parameters (Megatron-LM
    --fp8-param-gather, `training.fp8_param_gather`) the weight itself is FP8 and nothing is added: its 1 byte
    and the cached transpose's 1 byte stand where the bf16 weight's 2 are counted. MXFP8 (M6'): both copies carry
    1 / 32 byte of scales per parameter. Returns (fixed, per layer)."""
    if job.precision != "fp8" or not cost.term("fp8_weight_copies"):
        return 0.0, 0.0
    scales = 2.0 * SCALE_BYTES_PER_ELEMENT if job.fp8_recipe == "mxfp8" else 0.0  # (M6') row- and column-wise
    if job.fp8_weights and cost.term("fp8_params"):
        return 0.0, layer_params * scales  # the FP8 weight and its transpose (1 + 1) replace the bf16 weight (2)
    if p.zero_stage >= 3:
        return 2 * layer_params * (2.0 + scales), 0.0
    return 0.0, layer_params * (2.0 + scales)


def loss_bytes_per_logit(job, p) -> float:
    """Bytes per logit alive at the loss: a fused cross entropy (Megatron-LM's vocab-parallel one; flash-attn's,
    llm-foundry's default for MPT) keeps the bf16 logits and one fp32 copy it works in place on (2 + 4).
    torchtitan calls PyTorch's cross entropy on `logits.float()` and deletes the logits before the backward; its
    peak, measured with torch 2.13 (docs/physics.md `unfused_loss_buffers`, `compiled_loss`;
    docs/measure_torchtitan_memory.py): eager 12 (the saved fp32 log-softmax, the loss's and the log-softmax's
    fp32 gradients), compiled with the model 4 (`training.compiled_loss`, torchtitan's default with
    torch.compile since 2025-04: Inductor keeps the bf16 logits and writes the bf16 gradient); with tp > 1,
    where torchtitan runs it on vocabulary-sharded DTensors (`loss_parallel`), 16 eager and 10 compiled per local
    logit. `training.fused_cross_entropy` (default: false for torchtitan only) says which."""
    if job.fused_cross_entropy or not cost.term("unfused_loss_buffers"):
        return 6.0
    compiled = job.compiled_loss and cost.term("compiled_loss")
    if p.tp > 1:
        return 10.0 if compiled else 16.0
    return 4.0 if compiled else 12.0


def unsharded_pipeline_bytes(job, p) -> float:
    """torchtitan with pipeline parallelism does not reshard FSDP parameters after forward (its documented
    `reshard_after_forward` default when pp > 1), so a stage keeps its layers' bf16 parameters unsharded and
    accumulates their gradients unsharded in the fp32 reduce dtype across micro-batches: 2 + 4 bytes per local
    parameter, on top of the shards."""
    if job.software_stack == "torchtitan" and p.pp > 1 and p.zero_stage >= 3 and cost.term("fsdp_pp_unsharded"):
        return 6.0
    return 0.0


def _layer_activations(model, job, p, kind: str) -> tuple[float, float]:
    """(M4), (EM2)-(EM3), (M4') (kept, working) bytes of one layer of `kind` and micro-batch: what Megatron-Core's
    recompute modules do not keep is recomputed one layer at a time (working bytes)."""
    if moe_cost.is_moe(model):  # routed tokens and latents
        kept, working = moe_memory.activation_bytes(model, job, p, layer_activation_bytes, kind)
    else:
        kept, working = layer_activation_bytes(model, job, p)
    dropped = recompute_modules.dropped_bytes(model, job, p, kind)
    return kept - dropped, working + dropped


# memory_coefficients depends on the instance, the configuration (not the layers or GPUs), the stage, the kind and
# the physics switches; the annealer asks for the same few thousands of times (a model with both layer kinds six
# times per stage it rescores), so they are kept. The entry holds the instance, which keeps its id from being
# reused while the entry lives.
_COEFFICIENTS: dict = {}
_COEFFICIENTS_LIMIT = 1 << 16


def memory_coefficients(instance, p, stage: int, kind: str | None = None) -> MemoryCoefficients:
    """(M1)-(M6) Per-GPU bytes of `stage` as affine functions of its layer count, the per-layer terms those of a
    layer of `kind` (docs/moe.md (E1)): "dense" or "moe"; None is the model's MoE layer if it has experts, else
    its dense layer. The fixed terms are the stage's whatever its layers' kinds: with full recompute the
    working memory of the layer being recomputed is the heavier kind's (a stage may hold both). `p`: a Config or
    Placement (only its configuration matters)."""
    key = (id(instance), *p.config_key(), stage, kind, *cost.PHYSICS_TERMS.values())
    hit = _COEFFICIENTS.get(key)
    if hit is not None and hit[0] is instance:
        return hit[1]
    value = _memory_coefficients(instance, p, stage, kind)
    if len(_COEFFICIENTS) >= _COEFFICIENTS_LIMIT:
        _COEFFICIENTS.clear()
    _COEFFICIENTS[key] = (instance, value)
    return value


def _memory_coefficients(instance, p, stage: int, kind: str | None) -> MemoryCoefficients:
    model, job = instance.model, instance.training
    kind = kind or ("moe" if model.moe is not None else "dense")
    w_bytes, g_bytes, o_bytes = job.bytes_per_param_state
    layer_params = model.layer_matmul_params / p.tp + model.layer_norm_params
    fixed_params = 0.0
    if stage == 0:
        fixed_params += model.embedding_params / p.tp
    last = output_stage(getattr(p, "schedule", "1f1b"), p.pp)  # the last chunk's rank: 0 in a V (S3)
    if stage == last:
        fixed_params += model.output_params / p.tp + model.hidden_size
    # (M1)-(M3) weights, gradients, optimizer state
    w_div, g_div, o_div = sharding.state_divisors(p)  # over dp_shard x cp (Megatron's distributed optimizer: dp x cp)
    g_bytes += bf16_optimizer_fp32_grad_bytes(job, p)
    per_layer = (layer_params * w_bytes / w_div, layer_params * g_bytes / g_div, layer_params * o_bytes / o_div)
    if moe_cost.is_moe(model):  # (EM1) experts split by ep x etp, their optimizer over expert data parallelism
        per_layer = moe_memory.layer_state_bytes(instance, p, kind)
    weights = (fixed_params * w_bytes / w_div, per_layer[0])
    gradients = (fixed_params * g_bytes / g_div, per_layer[1])
    optimizer = (fixed_params * o_bytes / o_div, per_layer[2])
    # (M4)-(M5) activations
    m = p.num_micro_batches(job.global_batch_size)
    kept, working = _layer_activations(model, job, p, kind)
    if layer_kinds.is_mixed(model):  # the layer being recomputed may be of the other kind
        working = max(working, _layer_activations(model, job, p, "dense" if kind == "moe" else "moe")[1])
    seq = job.seq_length / p.cp
    sbh = seq * p.micro_batch_size * model.hidden_size
    sp = job.sequence_parallel_size(p.tp)
    extra = moe_overlap.extra_warmup(p)  # (EM5) the MoE all-to-all overlap's extra warm-up micro-batch
    schedule = getattr(p, "schedule", "1f1b")
    per_layer_units = in_flight_layer_microbatches(stage, p.pp, p.vpp, m, 1, schedule, extra)
    act_fixed = working
    if stage == 0 and model.dropout:  # embedding dropout mask; its output is the first layer's (counted) input
        act_fixed += in_flight_micro_batches(stage, p.pp, p.vpp, m, schedule, extra) * sbh / sp
    buf_fixed = 0.0
    if stage == last:  # final norm and output-layer inputs; the logits and the loss's buffers
        act_fixed += 4 * sbh / sp
        buf_fixed += seq * p.micro_batch_size * model.vocab_size / p.tp * loss_bytes_per_logit(job, p)
    activations = (act_fixed, kept * per_layer_units)
    # (M6) buffers: ZeRO-3 gathers two layers ahead (bf16) and reduce-scatters one layer's gradients
    if p.zero_stage >= 3:
        buf_fixed += layer_params * (2 * w_bytes + g_bytes)
    buf_fixed += moe_memory.dispatch_buffer_bytes(model, job, p)  # (EM4), 0 for dense models
    buf_fixed += moe_overlap.buffer_bytes(model, job, p)  # (EM5), 0 without the all-to-all overlap
    buf_per_layer = layer_params * unsharded_pipeline_bytes(job, p)
    shard_fixed, shard_per_layer = sharding.sharding_buffer_bytes(p, layer_params, w_bytes, g_bytes, buf_per_layer > 0)
    buf_fixed, buf_per_layer = buf_fixed + shard_fixed, buf_per_layer + shard_per_layer
    if job.software_stack in DEEPSPEED and 1 <= p.zero_stage < 3:
        # DeepSpeed ZeRO-1 stages its reduce-scatter and all-gather through two 16-bit bucket buffers
        buf_fixed += 2 * DEEPSPEED_BUCKET_ELEMENTS * 2.0
    fp8_fixed, fp8_per_layer = fp8_weight_copy_bytes(job, p, model.layer_matmul_params / p.tp)
    return MemoryCoefficients(weights, gradients, optimizer, activations,
                              (buf_fixed + fp8_fixed, buf_per_layer + fp8_per_layer))


def stage_memory(instance, p, stage: int, layers: int, gpu_type, coefficients: MemoryCoefficients | None = None,
                 dense_layers: int = 0, plain: MemoryCoefficients | None = None,
                 plain_layers: int = 0) -> StageMemory:
    """(M7) total = static + dynamic x (1 + fragmentation) + runtime overhead; fits if <= fraction x capacity.
    `dense_layers` of the `layers` are dense layers of a model with both kinds (E1): each component is then
    fixed + per-layer(MoE) x (layers - dense_layers) + per-layer(dense) x dense_layers. Likewise under block
    recompute (M4b) `plain_layers` of them keep their activations, with `plain`'s per-layer terms (those of
    recompute "none"), the others `coefficients`' (full recompute, whose fixed terms hold the working memory of
    the layer being recomputed).

    Weights, gradients and optimizer state live in contiguous buffers allocated once (Megatron-LM's param
    and grad buffers, the distributed optimizer's shards), so only the dynamic allocations (activations,
    temporary buffers) fragment the caching allocator.
    """
    c = coefficients or memory_coefficients(instance, p, stage)
    d = memory_coefficients(instance, p, stage, "dense") if dense_layers else plain
    other = dense_layers or plain_layers

    def gib(name: str) -> float:
        fixed, per_layer = getattr(c, name)
        if d is None:
            return (fixed + per_layer * layers) / GIB
        return (fixed + per_layer * (layers - other) + getattr(d, name)[1] * other) / GIB

    weights, grads, optim = gib("weights"), gib("gradients"), gib("optimizer")
    acts, bufs = gib("activations"), gib("buffers")
    # (M8) DeepSpeed's gradient all-reduce flattens the fp32 gradients into a copy after the backward, when the
    # activations are gone: the stage peaks at the larger of the two
    bufs += max(0.0, gradient_reduction_copy_gib(instance.training, p, weights) - (acts + bufs))
    frag = gpu_type.fragmentation_fraction * (acts + bufs)
    # (M8) the runtime overhead's parts outside the caching allocator, and the workspaces inside it; the rest of it
    # (cuDNN, the allocator's cached free blocks) is reserved memory
    context, nccl = outside_allocator_gib(p, gpu_type.runtime_overhead_gib)
    workspace = min(workspace_gib(instance.training, gpu_type), gpu_type.runtime_overhead_gib - context - nccl)
    return StageMemory(stage=stage, weights_gib=weights, gradients_gib=grads, optimizer_gib=optim,
                       activations_gib=acts, buffers_gib=bufs, overhead_gib=gpu_type.runtime_overhead_gib + frag,
                       limit_gib=instance.training.memory_limit_fraction * gpu_type.memory_gib,
                       capacity_gib=gpu_type.memory_gib, context_gib=context, nccl_gib=nccl,
                       workspace_gib=max(0.0, workspace))


def deepspeed_bf16_optimizer(job, p) -> bool:
    """Megatron-DeepSpeed in bf16 (or FP8) with ZeRO 0-1 runs DeepSpeed's BF16_Optimizer."""
    return job.software_stack in DEEPSPEED and job.precision != "fp16" and p.zero_stage < 2


def bf16_optimizer_fp32_grad_bytes(job, p) -> float:
    """(M1)-(M3) Megatron-DeepSpeed in bf16 with ZeRO 0-1: DeepSpeed wraps Adam in its BF16_Optimizer
    (`deepspeed/runtime/bf16_optimizer.py`), whose `fp32_groups_gradients_flat` is `torch.zeros_like` of the whole
    flat bf16 parameter group: fp32 gradients of the whole local model, 4 bytes per parameter, beside the bf16
    gradients the backward writes (the 2 of `bytes_per_param_state`). Its fp32 master weights and moments are the
    partitioned 12 bytes; the model keeps DeepSpeed's fp16 accounting of 16 / dp there (the step time reads the
    parameter count from it), 4 / dp bytes more than the bf16 optimizer holds. 0 elsewhere."""
    return 4.0 if deepspeed_bf16_optimizer(job, p) else 0.0


def gradient_reduction_copy_gib(job, p, weights_gib: float) -> float:
    """(M8) DeepSpeed's bf16 optimizer reduces the whole fp32 gradient buffer with the engine's
    `buffered_allreduce_fallback`, whose `allreduce_bucket` flattens each bucket (`_flatten_dense_tensors`, a new
    tensor): the buffer is one flat tensor per parameter group, past the 5e8-element bucket limit, so the copy is the
    whole local model's fp32 gradients, 4 bytes per parameter (twice the bf16 weights). 0 on other stacks."""
    return 2.0 * weights_gib if deepspeed_bf16_optimizer(job, p) else 0.0


CUBLAS_WORKSPACE_BYTES = (4096 * 1024 * 8, 4096 * 1024 * 2 + 16 * 1024 * 8)  # Hopper and later, earlier GPUs
TE_WORKSPACE_BYTES = (32 * 1024 * 1024, 4 * 1024 * 1024)


def workspace_gib(job, gpu_type) -> float:
    """(M8) Workspaces PyTorch's allocator hands out once and keeps: cuBLAS's (PyTorch's CublasHandlePool default,
    CUBLAS_WORKSPACE_CONFIG ":4096:8" on Hopper, ":4096:2:16:8" before) and, on the Megatron stacks, Transformer
    Engine's cuBLASLt workspace (32 MiB on Hopper, 4 MiB before). A GPU with FP8 tensor cores counts as Hopper."""
    hopper = 0 if gpu_type.peak_fp8_tflops > 0 else 1
    te = TE_WORKSPACE_BYTES[hopper] if job.software_stack not in PYTORCH_STACKS else 0
    return (CUBLAS_WORKSPACE_BYTES[hopper] + te) / GIB


# (M8) NCCL's per-connection buffers, one per protocol (src/init.cc): Simple NCCL_BUFFSIZE (4 MiB), LL
# 8 lines x 512 threads x 8 steps x 16 bytes (512 KiB), LL128 120 elements x 640 threads x 8 steps x 8 bytes.
NCCL_SIMPLE_BYTES = 1 << 22
NCCL_LL_BYTES = 8 * 512 * 8 * 16
NCCL_LL128_BYTES = 120 * 640 * 8 * 8
NCCL_RING_CHANNELS = 16  # assumed channels of a collective communicator on NVLink (NCCL picks 8-32)
NCCL_P2P_CHANNELS_PER_PEER = 2  # NCCL_NCHANNELS_PER_NET_PEER's default; pipeline send/recv
CUDA_CONTEXT_GIB = 0.5  # CUDA context with lazy module loading (CUDA 11.7+, PyTorch's default), assumed


def nccl_buffer_bytes(channels: int, peers: int, buffsize: int = NCCL_SIMPLE_BYTES) -> float:
    """(M8) Bytes NCCL allocates for `channels` channels to `peers` peers: every connection holds one buffer per
    protocol (LL, LL128, Simple), on one side of the link."""
    return channels * peers * (buffsize + NCCL_LL_BYTES + NCCL_LL128_BYTES)


def outside_allocator_gib(p, runtime_overhead_gib: float) -> tuple[float, float]:
    """(M8) (CUDA context, NCCL buffers) of a rank of configuration `p`, in GiB: a ring (one connection per channel)
    for each collective group larger than one (tp, cp, the data-parallel group dp x cp), two pipeline peers.
    Both are part of `runtime_overhead_gib` (the nvidia-smi figure keeps it whole); scaled down to fit in it
    where a GPU type sets a smaller overhead."""
    groups = sum(1 for size in (p.tp, p.cp, p.dp * p.cp) if size > 1) + sharding.extra_groups(p)
    nccl = groups * nccl_buffer_bytes(NCCL_RING_CHANNELS, 1)
    if p.pp > 1:
        nccl += nccl_buffer_bytes(NCCL_P2P_CHANNELS_PER_PEER, 2)
    context, nccl = CUDA_CONTEXT_GIB, nccl / GIB
    scale = min(1.0, runtime_overhead_gib / (context + nccl)) if context + nccl > 0 else 1.0
    return context * scale, nccl * scale
