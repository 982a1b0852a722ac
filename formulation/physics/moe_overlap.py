"""Megatron-Core's MoE all-to-all overlap (`--overlap-moe-expert-parallel-comm` with `--delay-wgrad-compute`,
docs/moe.md (E10), (EM5)): when Megatron-Core runs it, and what it costs in memory. Its time is composed in
formulation/physics/stage.py (`layer_time`): each MoE layer's dispatch and combine, forward and backward, run on a
communication stream beside the other micro-batch's compute of the same layer (Megatron-Core's combined 1F1B:
comm stream combine_bwd | dispatch_fwd, dispatch_bwd | combine_fwd against compute attn_fwd | mlp_bwd, mlp_bwd_dw,
mlp_fwd | attn_bwd), the exposed part what the compute cannot hide, and at least the contention share the model
gives every overlapped collective.
"""

from __future__ import annotations

from formulation.physics import moe_cost
from formulation.physics.moe_memory import dispatch_buffer_bytes

# Megatron-Core 0.16 TransformerConfig.__post_init__ (transformer_config.py) accepts the overlap with these
# token dispatchers ("flex" is the planner's "deepep")
OVERLAP_DISPATCHERS = ("alltoall", "deepep")


def problem(model, job, c) -> str | None:
    """Why Megatron-Core 0.16 refuses `--overlap-moe-expert-parallel-comm` for configuration `c` (None: it runs
    it). Its TransformerConfig asserts: expert parallelism (ep > 1), the alltoall or flex dispatcher, no full
    recompute (nor a recompute method), interleaving (a virtual pipeline size) whenever pp > 1, bf16 or fp16
    weights (FP8 training keeps bf16 weights); the planner adds the stack: Megatron-Core only."""
    if model.moe is None:
        return "the model has no experts"
    if job.software_stack != "megatron":
        return f"Megatron-Core's option; software_stack is {job.software_stack}"
    if c.ep < 2:
        return "needs expert parallelism (ep > 1)"
    if job.moe_token_dispatcher not in OVERLAP_DISPATCHERS:
        return f"needs the alltoall or deepep (flex) dispatcher, not {job.moe_token_dispatcher}"
    if c.recompute == "full":
        return "Megatron-Core refuses it with full recompute"
    if c.pp > 1 and c.vpp < 2:
        return "with pp > 1 Megatron-Core needs interleaving (vpp >= 2)"
    return None


def extra_warmup(c) -> int:
    """Micro-batches (virtual ones with interleaving) warmed up beyond the schedule's own: Megatron-Core's combined
    1F1B runs one extra forward before the steady phase (schedules.py: num_warmup_microbatches + 1; without a
    pipeline, the forward of micro-batch i + 1 runs beside the backward of i), so one more is in flight (EM5)."""
    return 1 if getattr(c, "moe_a2a_overlap", False) else 0


def buffer_bytes(model, job, p) -> float:
    """(EM5) Buffers the overlap adds on the busiest GPU: a second set of dispatch buffers (the forward's and the
    backward's all-to-alls of two micro-batches are in flight at once) and, with `--delay-wgrad-compute`, the
    experts' output gradients held until their weight gradients run (fc1's (2 or 1) f_e / etp and fc2's h per
    token copy, 16-bit). 0 without the overlap."""
    if not getattr(p, "moe_a2a_overlap", False) or model.moe is None:
        return 0.0
    fc1 = (model.mlp_matrices - 1) * model.moe.expert_ffn_hidden_size / p.etp
    return dispatch_buffer_bytes(model, job, p) + 2.0 * moe_cost.expert_tokens(model, job, p) * (fc1 + model.hidden_size)
