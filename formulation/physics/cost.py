"""Time of computation and communication, and the pipeline schedule (docs/model.md (C1)-(C14)).

Conventions: times in seconds, message sizes in bytes, bandwidths in GB/s (1e9 bytes/s) per GPU and
direction, as nccl-tests reports bus bandwidth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from formulation.inputs.job import PYTORCH_STACKS
from formulation.physics import collectives

# Fraction of the message each GPU moves (nccl-tests: busbw = algbw x this factor).
COLLECTIVE_FACTOR = {
    "all_reduce": lambda n: 2.0 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
}
# Sequential latency steps of the ring algorithm.
COLLECTIVE_STEPS = {"all_reduce": lambda n: 2 * (n - 1), "reduce_scatter": lambda n: n - 1,
                    "all_gather": lambda n: n - 1}


# Physics terms that can be switched on and off one at a time (ablations in docs/physics.md).
PHYSICS_TERMS = {
    "fp8_gemm": True,  # FP8 GEMMs at the FP8 peak (off: FP8 runs scored as bf16)
    "fp8_small_gemms": True,  # ... with the shape curve's fixed time unchanged by the FP8 peak (C1)
    "op_level_selective": True,  # torchtitan's selective checkpointing recomputes every other matmul
    "op_level_selective_gathers": True,  # ... and, outside its save list, the tp all-gathers (C4)
    "eager_elementwise": True,  # torchtitan without torch.compile runs unfused elementwise kernels
    # NCCL reaches a fraction of nominal link speed (nccl-tests): leave-one-source-out 6.0% -> 5.4% pooled
    # with it on (docs/physics.md); the exact programs take their collective constants from collective_time
    "collective_efficiency": True,
    # NCCL's ring crosses nodes on every NIC while NVLink carries the rest: levels at once, not one after the other
    "rail_ring": True,
    # NCCL's tuning model (docs/collectives.md): ring and tree, LL / LL128 / Simple, latencies growing with the ranks
    # and nodes, the least-time choice; off: one ring at alpha per step (k - 1 intra-, N - 1 inter-node steps)
    "nccl_algorithms": True,
    # PyTorch FSDP's BACKWARD_POST prefetch (fsdp_backward_prefetch: post, llm-foundry) exposes the backward's
    # gathers and reduce-scatters (C12); off: read as "pre"
    "fsdp_post_prefetch": True,
    "fp8_weight_copies": True,  # FP8 weight copies and transposes in memory
    "fp8_params": True,  # ... or FP8 weights in place of the bf16 ones (--fp8-param-gather, NeMo's FP8 recipe)
    "fp8_saved_inputs": True,  # Transformer Engine saves GEMM inputs for the backward in FP8
    "imperfect_tp_overlap": True,  # overlapped (async) tp communication still costs part of its time
    "imperfect_dp_overlap": True,  # so does the dp gradient reduce-scatter / parameter all-gather hidden by compute
    "unfused_loss_buffers": True,  # torchtitan's fp32 cross entropy keeps log-softmax and its gradient
    "compiled_loss": True,  # ... unless torch.compile compiles the loss: the bf16 logits and gradient only
    "eager_working_memory": True,  # eager torchtitan's checkpointed backward holds each op's output and gradient
    "fsdp_pp_unsharded": True,  # torchtitan keeps FSDP parameters unsharded across micro-batches with pp
    # context parallelism's ring steps off the diagonal are non-causal attention calls, faster per FLOP (C2)
    "noncausal_ring_steps": True,
    # flash attention runs calls shorter than 2k tokens below its catalog figure (C2): cp's chunks of short sequences
    "short_attention_calls": True,
    # a fixed time per iteration (optimizer launches, loss and grad-norm all-reduces, logging), fitted with the
    # efficiencies (solvers/validation/joint_fit.py); off: the fits hold it at 0
    "iteration_overhead": True,
    # an expert's GEMMs (few token rows, narrow FFN) run below the calibrated large-GEMM efficiency, by the shape
    # curve of published grouped-GEMM kernel measurements (docs/moe.md (E4a)); off: at the large GEMM's
    "grouped_gemm_shape": True,
}
# Share of an overlapped tensor-parallel collective that stays on the critical path even when GEMMs could hide
# it: the communication kernels take SMs and HBM bandwidth from the GEMMs they run beside. torchtitan's
# published async-TP benchmark hides 53% (Llama-3.1-70B, 256 H100) and 46% (8B, 64 H100) of the tp
# communication the plain-TP runs expose (docs/physics.md): 1/2. A ratio of small integers, so that the exact
# program keeps integer coefficients on time variables.
TP_OVERLAP_EXPOSED = (1, 2)


def tp_overlap_exposed() -> tuple[int, int]:
    """(numerator, denominator) of the share of overlapped tp communication left exposed."""
    return TP_OVERLAP_EXPOSED if term("imperfect_tp_overlap") else (0, 1)


def dp_overlap_exposed() -> tuple[int, int]:
    """(numerator, denominator) of the share of an overlapped dp collective left exposed: the same contention
    share as tp's (the collective's kernels take SMs and HBM bandwidth from the compute that hides it)."""
    return TP_OVERLAP_EXPOSED if term("imperfect_dp_overlap") else (0, 1)
# Fraction of a nominal link speed NCCL's bus bandwidth reaches for large messages: per fabric kind in
# formulation/data/fabrics.json (public nccl-tests figures, docs/collectives.md); NVLink 0.8, InfiniBand 0.94.


def term(name: str) -> bool:
    return PHYSICS_TERMS[name]


@dataclass(frozen=True)
class GroupLinks:
    """What a collective group's time depends on (see `Cluster.group_links`)."""

    size: int
    intra_gb_per_s: float
    inter_gb_per_s: float
    nodes: int
    per_node: int  # fewest members on one spanned node: the NICs that carry the inter-node phase in parallel


def group_links(cluster, gpus) -> GroupLinks:
    intra, inter, nodes, per_node = cluster.group_links(np.asarray(gpus))
    return GroupLinks(len(gpus), intra, inter, nodes, per_node)


def collective_time(kind: str, message_bytes: float, links: GroupLinks, cluster, least: bool = False) -> float:
    """(C5) A collective over a group of n GPUs on N nodes with at least k members per node. With
    `nccl_algorithms` (docs/collectives.md (C5a)-(C5d)) NCCL's choice among ring and tree and its protocols, each
    costed by NCCL's tuning model over the rail ring's level parts below (`least`: the least option at `links`, a
    lower envelope for the bounds). Otherwise: ring collective over a group of n GPUs on N nodes with at least k members per node, each level at
    its slowest pair. Latency: ring steps x per-step alpha of each level (k - 1 intra-node, N - 1 inter-node
    steps for a gather; twice that for an all-reduce). One node: factor(n) S / B_intra.

    Across nodes (`rail_ring`): NCCL runs one ring through every member, the k members of a node crossing to
    the next node each on its own NIC (one channel per NIC), and both levels move data at once. Per GPU the ring
    carries factor(n) S, a share (k - 1) / k of it over NVLink and 1 / k over its NIC, so the slower level sets
    the time: factor(n) S max((k - 1) / (k B_intra), 1 / (k B_inter)). This is NCCL's own tuning model
    (src/graph/tuning.cc, ncclTopoTuneModel: a ring's bus bandwidth is its channel count times one level's
    per-channel bandwidth, not a sum over levels) and what nccl-tests measure across DGX H100 nodes (about 370
    GB/s of bus bandwidth = 8 NICs x about 46 GB/s, the figure formulation/inputs/ingest/network.py divides by
    k). Off: the earlier two phases one after the other, the intra-node collective over the k local members,
    then the inter-node one among N nodes on a 1/k shard (k NICs in parallel).
    """
    n = links.size
    if n <= 1 or message_bytes <= 0:
        return 0.0
    factor, steps = COLLECTIVE_FACTOR[kind], COLLECTIVE_STEPS[kind]
    if term("nccl_algorithms") and levels_concurrent():
        return collectives.nccl_time(kind, message_bytes, links, cluster, factor(n), collective_efficiency(cluster),
                                     least)
    intra_eff, inter_eff = collective_efficiency(cluster)
    k, N = links.per_node, links.nodes
    if N == 1:
        return factor(n) * message_bytes / (intra_eff * links.intra_gb_per_s * 1e9) + steps(n) * cluster.intra_latency_s
    latency = (steps(k) * cluster.intra_latency_s if k > 1 else 0.0) + steps(N) * cluster.inter_latency_s
    intra_bytes_per_s = intra_eff * links.intra_gb_per_s * 1e9
    inter_bytes_per_s = collectives.inter_nics(links, cluster) * inter_eff * links.inter_gb_per_s * 1e9
    if levels_concurrent():
        intra = factor(n) * (k - 1) / k * message_bytes / intra_bytes_per_s
        return latency + max(intra, factor(n) * message_bytes / inter_bytes_per_s)
    intra = factor(k) * message_bytes / intra_bytes_per_s if k > 1 else 0.0
    return latency + intra + factor(N) * message_bytes / inter_bytes_per_s


def levels_concurrent() -> bool:
    """Whether a collective's intra- and inter-node levels run at once (C5): its time is then latency + the
    larger level's part, and the exact programs encode one part variable >= each level's (P6, P9)."""
    return term("rail_ring")


def collective_efficiency(cluster) -> tuple[float, float]:
    """(intra, inter) fraction of the cluster's link figures a collective reaches: NCCL's measured share of line
    rate on the level's fabric (formulation/data/fabrics.json) where a level was given as a nominal speed, 1 where
    it was measured (nccl-tests logs)."""
    if not term("collective_efficiency"):
        return 1.0, 1.0
    nominal = getattr(cluster, "nominal_levels", (True, True))
    intra = collectives.line_rate_fraction("intra", getattr(cluster, "intra_fabric", "nvlink"))
    inter = collectives.line_rate_fraction("inter", getattr(cluster, "inter_fabric", "infiniband"))
    return intra if nominal[0] else 1.0, inter if nominal[1] else 1.0


def p2p_time(message_bytes: float, gb_per_s: float, same_node: bool, cluster) -> float:
    """(C7) Point-to-point send: alpha + bytes / bandwidth of the actual link."""
    latency = cluster.intra_latency_s if same_node else cluster.inter_latency_s
    return latency + message_bytes / (gb_per_s * 1e9)


@dataclass(frozen=True)
class LayerTimes:
    """Seconds per layer per micro-batch on one GPU type (compute only)."""

    matmul_fwd: float
    attention_fwd: float
    elementwise_fwd: float = 0.0

    @property
    def forward(self) -> float:
        return self.matmul_fwd + self.attention_fwd + self.elementwise_fwd


def fp8_gemms(job, gpu_type) -> bool:
    """The transformer layers' GEMMs run in FP8 (precision fp8 on a GPU with FP8 tensor cores)."""
    return job.precision == "fp8" and gpu_type.peak_fp8_tflops > 0 and term("fp8_gemm")


# A flash-attention kernel runs a non-causal call faster per FLOP than a causal one (no masked diagonal tiles, an
# even load across the grid): FlashAttention-3's paper (Shah et al. 2024, H100 SXM5, head dim 128) measures FA2's
# forward at 370 against 335 TFLOP/s and cuDNN's at 595 against 539 at 16k tokens, both 1.10 (1.15-1.18 at 4k).
# The attention efficiencies of gpu_types.json are causal figures; the ring's chunks are 8k-32k tokens long.
NONCAUSAL_SPEEDUP = 1.10


# A flash-attention kernel's throughput ramps up with the tokens of one call (per sequence and head): its grid has
# fewer query tiles to spread over the SMs and each tile a shorter loop over keys. FlashAttention-3's paper (Shah et
# al. 2024, H100 SXM5, head dim 128, batch x tokens = 16k) measures FA2's causal forward at 191 / 260 / 298 TFLOP/s
# and its backward at 214 / 260 / 291 at 512 / 1k / 2k tokens: in our count (backward = 2 forwards) 177 / 223 / 251,
# 0.71 and 0.89 of the 2k figure. L / (L + SHORT_CALL_HALF_TOKENS) relative to its value at SHORT_CALL_FROM_TOKENS
# gives 0.71 and 0.88. The catalog's attention efficiencies are read at 2k-4k tokens, so longer calls keep them.
SHORT_CALL_HALF_TOKENS = 320
SHORT_CALL_FROM_TOKENS = 2048


def short_call_factor(tokens: float) -> float:
    """(C2) Share of the catalog attention efficiency a flash call of `tokens` tokens reaches (1 from 2k up)."""
    if tokens >= SHORT_CALL_FROM_TOKENS:
        return 1.0
    ramp = lambda n: n / (n + SHORT_CALL_HALF_TOKENS)  # noqa: E731
    return ramp(tokens) / ramp(SHORT_CALL_FROM_TOKENS)


def attention_time(attn_flops: float, job, p, gpu_type) -> float:
    """(C2) The attention core's forward at the GPU's (causal) attention efficiency. With flash attention and
    context parallelism, the load-balanced ring computes 1/cp of a rank's work in its local causal call and the
    rest in non-causal calls against the other ranks' chunks, NONCAUSAL_SPEEDUP times faster
    (`noncausal_ring_steps`). Flash calls of fewer than 2k tokens (seq / cp per call) run at
    `short_call_factor` of the efficiency (`short_attention_calls`)."""
    time = attn_flops / (gpu_type.peak_tflops * 1e12 * gpu_type.attention_efficiency)
    if job.flash_attention and p.cp > 1 and term("noncausal_ring_steps"):
        time *= 1 / p.cp + (1 - 1 / p.cp) / NONCAUSAL_SPEEDUP
    if job.flash_attention and term("short_attention_calls"):
        time /= short_call_factor(job.seq_length / p.cp)
    return time


def layer_compute(model, job, p, gpu_type) -> LayerTimes:
    """(C1)-(C2) Forward time of one layer for one micro-batch on one GPU of `gpu_type`.

    GEMMs: 2 x tokens x matmul params / tp FLOPs at the shape-dependent efficiency of (C1), against the FP8
    peak when the job trains in FP8 (attention core, norms and the output layer stay in bf16, as in
    Transformer Engine and torchao). Attention core: 4 x tokens x seq x heads x head_dim / tp at the GPU's
    attention efficiency, halved by the causal mask with flash attention; without it, plus the score matrix's
    memory traffic (heads x tokens x seq / tp elements, 2 bytes, 4 passes, 6 with dropout) at HBM bandwidth.
    tokens = micro_batch_size x seq / cp per GPU.
    """
    tokens = p.micro_batch_size * job.seq_length / p.cp
    mm_flops = model.layer_matmul_flops(tokens) / p.tp
    # Flash attention skips the masked half; the unfused path computes the whole s x s score matrix and
    # streams it through memory: written by QK^T, read and written by softmax (and dropout), read by AV.
    attn_flops = model.layer_attention_flops(tokens, job.seq_length, causal=job.flash_attention) / p.tp
    attention = attention_time(attn_flops, job, p, gpu_type)
    if not job.flash_attention:
        scores = model.num_attention_heads * tokens * job.seq_length / p.tp
        attention += scores * 2.0 * (4 + (2 if model.dropout else 0)) / (gpu_type.hbm_gb_per_s * 1e9)
    matmul = gpu_type.matmul_time(mm_flops, mm_flops / 1e9, fp8=fp8_gemms(job, gpu_type))
    return LayerTimes(matmul_fwd=matmul, attention_fwd=attention,
                      elementwise_fwd=elementwise_bytes(model, job, p, gpu_type) / (gpu_type.hbm_gb_per_s * 1e9))


def eager_stack(job) -> bool:
    """A PyTorch stack (torchtitan, llm-foundry) without torch.compile runs norms, rotary and the MLP activation
    as separate eager kernels."""
    return job.software_stack in PYTORCH_STACKS and not job.torch_compile and term("eager_elementwise")


# 16-bit passes per element of Q and K of an eager rotary embedding, by how the model code applies it
# (TrainingJob.rotary_impl). "complex" (torchtitan's apply_rotary_emb, Meta's Llama): upcast, complex multiply,
# downcast: about 10. "rotation_matrix" (IBM's fms RotaryEmbedding.adjusted_qk, the model of fms-fsdp): upcast to
# fp32 (read 1, write 2: 3), multiply each (x, y) pair by its 2x2 rotation matrix broadcast over the heads, which
# writes two fp32 products per element (read 2, write 4: 6), sum the products (read 4, write 2: 6), downcast
# (read 2, write 1: 3): 18. Compiled, either is one kernel that reads and writes each element once (2).
EAGER_ROTARY_UNITS = {"complex": 10.0, "rotation_matrix": 18.0}


def rotary_units(job) -> float:
    """16-bit passes per Q/K element of the eager rotary embedding of the job's model code."""
    return EAGER_ROTARY_UNITS[job.rotary_impl]


def activation_units(model, job) -> float:
    """(C3) 16-bit passes of the MLP activation per unit of its width: SwiGLU reads gate and up and writes their
    product (3; eager PyTorch runs silu and the product as two kernels: 5), GELU reads and writes (2)."""
    if model.mlp != "swiglu":
        return 2.0
    return 5.0 if eager_stack(job) else 3.0


def elementwise_bytes(model, job, p, gpu_type=None) -> float:
    """(C3) Memory-bound work of one layer's forward: passes over [tokens, h] 16-bit tensors (units of 2 bytes).

    Fused kernels (Megatron-LM / Transformer Engine, torch.compile): two norms (read + write: 4), two residual
    adds (read 2, write 1: 6), rotary embedding on Q and K (read + write: 2 (1 + kv/heads)), the MLP activation
    (SwiGLU reads 2f, writes f; GELU reads and writes f), dropout (read, write, mask: 3 per dropout, 2
    dropouts). Eager PyTorch (torchtitan without compile) runs each op as its own kernel: RMSNorm upcasts,
    squares, reduces, scales, downcasts and multiplies by the weight (about 20 units each; LayerNorm is one eager
    kernel, torch.nn.functional.layer_norm, so LayerNorm models such as MPT keep the fused 2), rotary goes through
    fp32 complex views (10 units per Q/K head width) or fp32 2x2 rotation matrices (fms: 18, `rotary_units`),
    SwiGLU's silu and product are two kernels (5 f / h).
    FP8 GEMMs first cast their four inputs (QKV, projection, fc1, fc2) to FP8: read 2 bytes, write 1 (1.5 units
    each). With sequence parallelism (or tp = 1) each GPU touches 1/tp of the norm/residual tensors; the MLP
    activation is always split by tp.
    """
    tokens = p.micro_batch_size * job.seq_length / p.cp
    sp = job.sequence_parallel_size(p.tp)
    h, f = model.hidden_size, model.ffn_hidden_size
    eager = eager_stack(job)
    qk = 1 + model.num_kv_heads / model.num_attention_heads
    rotary = 0.0 if model.learned_position_embeddings else (rotary_units(job) if eager else 2.0) * qk
    eager_norms = eager and model.norm == "rmsnorm"
    replicated = (40.0 if eager_norms else 4.0) + 6.0 + (6.0 if model.dropout else 0.0)
    split = rotary + activation_units(model, job) * f / h
    if gpu_type is not None and fp8_gemms(job, gpu_type):
        replicated += 1.5 * 2  # QKV and fc1 inputs (cast on the sequence-parallel shard)
        split += 1.5 * (1 + f / h)  # projection and fc2 inputs
    return 2.0 * tokens * h * (replicated / sp + split / p.tp)


def output_layer_forward(model, job, p, gpu_type) -> float:
    """Output layer (vocab-parallel GEMM) forward, at the efficiency of its own size (bf16 also in FP8 runs)."""
    tokens = p.micro_batch_size * job.seq_length / p.cp
    flops = model.output_layer_flops(tokens) / p.tp
    return gpu_type.matmul_time(flops, flops / 1e9)


def recompute_extra(lt: LayerTimes, recompute: str, software_stack: str,
                    sequence_parallel: bool = True) -> tuple[float, float, float]:
    """(C4) Extra backward compute of one layer for its recompute, and the passes of forward communication
    the recompute repeats: (compute, cp passes, tp passes).

    full: the whole forward again, communication included. selective: Megatron-LM re-runs the attention core
    only (Korthikanti et al. 2022); torchtitan's op-level selective checkpointing saves the outputs of every
    other matmul, of SDPA and of reduce-scatters and recomputes the rest (torchtitan `_save_list` policy: half
    the matmul forward and every elementwise op). Its recompute re-runs the block's forward, so the collectives
    outside the save list run again: with sequence parallelism the two all-gathers, half the forward's tp
    communication (an all-gather and a reduce-scatter of one tensor take the same time, C5); without it the
    two all-reduces, all of it. The ring attention of cp runs inside SDPA, which is saved. Pass counts are
    multiples of 1/2 (the exact program scales its rows to integer coefficients, formulation/programs/exact.py)."""
    if recompute == "full":
        return lt.forward, 1.0, 1.0
    if recompute == "selective":
        if software_stack == "torchtitan" and term("op_level_selective"):
            gathers = (0.5 if sequence_parallel else 1.0) if term("op_level_selective_gathers") else 0.0
            return 0.5 * lt.matmul_fwd + lt.elementwise_fwd, 0.0, gathers
        return lt.attention_fwd, 0.0, 0.0
    return 0.0, 0.0, 0.0


def activation_message_bytes(model, job, p) -> float:
    """Bytes of one layer's activation tensor [s/cp, b, h] in 16 bit (the whole tensor, before any split)."""
    return 2.0 * job.seq_length / p.cp * p.micro_batch_size * model.hidden_size


def tp_layer_comm(model, job, p, links: GroupLinks, cluster) -> float:
    """(C6) Tensor-parallel communication of one layer, forward, per micro-batch.

    Sequence parallel: 2 all-gathers + 2 reduce-scatters of the activation; without it 2 all-reduces
    (same bytes). Backward moves the same again (counted by the caller).
    """
    if p.tp == 1:
        return 0.0
    message = activation_message_bytes(model, job, p)
    if job.sequence_parallel:
        return 2 * (collective_time("all_gather", message, links, cluster)
                    + collective_time("reduce_scatter", message, links, cluster))
    return 2 * collective_time("all_reduce", message, links, cluster)


def cp_layer_comm(model, job, p, gb_per_s: float, same_node: bool, cluster) -> float:
    """(C8) Context-parallel ring attention, forward, one layer: cp - 1 steps each passing this rank's
    K and V block (2 x tokens x kv_heads x head_dim / tp x 2 bytes) to the next rank of the ring."""
    if p.cp == 1:
        return 0.0
    tokens = p.micro_batch_size * job.seq_length / p.cp
    block = 2 * tokens * model.num_kv_heads * model.head_dim / p.tp * 2.0
    return (p.cp - 1) * p2p_time(block, gb_per_s, same_node, cluster)


def pipeline_time(stage_times: list[float], num_micro_batches: int, vpp: int) -> tuple[float, int]:
    """(C9) 1F1B / interleaved schedule without communication: m x slowest + (sum of others) / vpp.

    With vpp = 1 this is sum_i t_i + (m - 1) max_i t_i; for equal stages the bubble is (p - 1) t / vpp as
    in Narayanan et al. 2021. Returns the time and the index of the slowest stage.
    """
    slowest = int(np.argmax(stage_times))
    total = num_micro_batches * stage_times[slowest] + (sum(stage_times) - stage_times[slowest]) / vpp
    return total, slowest


def p2p_chain(boundary_times: list[float], wrap_time: float, num_micro_batches: int, pp: int, vpp: int) -> float:
    """(C10) Pipeline send/receive on the critical path: 2 x (vpp x sum_j c_j + (vpp - 1) x c_wrap) per round,
    c_wrap the last-to-first stage link.

    1F1B keeps exactly pp - i micro-batches in flight, so the round trip of the send/receive chain is paid
    once per round of pp micro-batches (Pipette): ceil(m / pp) rounds. The interleaved schedule warms up
    2 (pp - i - 1) + (vpp - 1) pp chunks, more than the round trip needs; that slack hides the chain in the
    steady state, leaving one round (warm-up and cool-down)."""
    if pp == 1:
        return 0.0
    rounds = math.ceil(num_micro_batches / pp) if vpp == 1 else 1
    return rounds * 2 * (vpp * sum(boundary_times) + (vpp - 1) * wrap_time)


def optimizer_step_time(params_per_gpu: float, gpu_type) -> float:
    """(C13) Adam step, memory bound: read grad, master, m, v (16 B) and write master, m, v, bf16 weight
    (14 B) per local parameter at the GPU's memory bandwidth."""
    return params_per_gpu * 30.0 / (gpu_type.hbm_gb_per_s * 1e9)
