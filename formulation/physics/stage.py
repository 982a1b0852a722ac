"""How one pipeline stage's time is composed from map-independent constants and its groups' communication
times. Shared by the evaluator (with numbers) and by the exact program and bounds (which encode the same
composition as constraints), so the composition is written down once here and checked by tests.
"""

from __future__ import annotations

from dataclasses import dataclass

from formulation.physics import cost, moe_cost, recompute_modules, sharding
from formulation.physics.memory import memory_coefficients
from formulation.physics.v_schedules import output_stage


@dataclass(frozen=True)
class StageConstants:
    """Per-layer and per-stage quantities that do not depend on which GPUs run the stage (one GPU type)."""

    f_compute: float  # forward compute of one layer, one micro-batch
    b_compute: float  # backward compute incl. recompute
    matmul_fwd: float  # GEMM part of the forward (what tp comm overlap can hide behind)
    attention_fwd: float  # attention core forward (what the cp ring hides behind)
    recompute_passes: float  # forward passes the recompute repeats of the cp (and expert) communication
    output_fwd: float  # output layer forward on the last stage, else 0
    params_fixed: float  # stage parameters per GPU = params_fixed + params_per_layer x layers (unsharded)
    params_per_layer: float
    layer_params: float  # one layer's parameters per GPU (ZeRO-3 gathers)
    # mixture-of-experts models: routed experts' parameters per GPU of the layer (docs/moe.md (E1)),
    # synchronised over the expert-data-parallel group; params_per_layer is then the rest of the layer
    expert_params_per_layer: float = 0.0
    ep_recompute_passes: int = 0  # extra forward passes of the expert communication (the "moe" recompute module)
    tp_recompute_passes: float = 0.0  # ... of the tp communication (C4: half under torchtitan's op-level policy)
    backward_gathers_exposed: bool = False  # (C12) FSDP1's "post" backward prefetch: nothing hides them
    ep_overlap: bool = False  # (E10) Megatron-Core's MoE all-to-all overlap: expert communication beside compute
    backward_gathers: bool = True  # (C12) the backward gathers the layer's parameters again (not without reshard)
    # (C12) torchtitan's pipeline stages (pp > 1, FSDP): parameters gathered in the step's first forward and the
    # gradients reduced after the stage's last backward, once per step (sharding.grad_sync_once_per_step)
    sync_once_per_step: bool = False

    @property
    def ep_passes(self) -> float:
        """Passes of one MoE layer's forward expert communication per micro-batch: forward, backward, and again
        for every recompute of it (full recompute, Megatron-Core's "moe" module)."""
        return 2 + self.recompute_passes + self.ep_recompute_passes

    def ep_exposed(self, ep: float) -> float:
        """(E7), (E10) What one MoE layer's expert communication (`ep` forward, ep_passes x ep in all) leaves on the
        critical path per micro-batch: all of it; with the all-to-all overlap, what the layer's forward and
        backward compute (the other micro-batch's, in Megatron-Core's combined 1F1B) cannot hide, and at least
        the contention share of overlapped collectives (`dp_part_exposed`). Non-decreasing in `ep`."""
        total = ep * self.ep_passes
        return dp_part_exposed(total, self.f_compute + self.b_compute, True) if self.ep_overlap else total

    def expert_params(self, layers: int) -> float:
        return self.expert_params_per_layer * layers

    def window_b(self, layers: int) -> float:
        """Compute-only backward of the last micro-batch: hides the gradient reduce-scatter (C11)."""
        return layers * self.b_compute + 2 * self.output_fwd

    def window_f(self, layers: int) -> float:
        """Compute-only forward of the first micro-batch: hides the parameter all-gather (C11)."""
        return layers * self.f_compute + self.output_fwd

    def stage_params(self, layers: int) -> float:
        return self.params_fixed + self.params_per_layer * layers

    def weight_grad(self, layers: int) -> float:
        """(C15) The weight-gradient part W of a micro-batch's backward: one GEMM per forward GEMM (the layers'
        and the output layer's); the attention core, the elementwise work, the recompute and the communication
        are the input-gradient part B (docs/schedules.md)."""
        return layers * self.matmul_fwd + self.output_fwd


def stage_constants(instance, p, stage: int, gpu_type, kind: str | None = None) -> StageConstants:
    """Stage `stage`'s constants with per-layer terms of a layer of `kind` ("dense" / "moe", docs/moe.md (E1)),
    or (None) the model's mean layer: for a model of one kind, its layer."""
    model, job = instance.model, instance.training
    lt = moe_cost.layer_compute(model, job, p, gpu_type, kind)
    extra, rp, tp_rp = cost.recompute_extra(lt, p.recompute, job.software_stack, job.sequence_parallel)
    if recompute_modules.active(job, p):  # (C4') Megatron-Core's selective recompute by module
        extra = recompute_modules.extra_backward_time(model, job, p, gpu_type, lt.attention_fwd, kind)
    b_compute = 2 * lt.forward + extra
    w_bytes = job.bytes_per_param_state[0]
    c = memory_coefficients(instance, p, stage)
    unshard = sharding.state_divisors(p)[0]
    per_layer, experts = c.weights[1] / w_bytes * unshard, 0.0
    if moe_cost.is_moe(model):  # (E1) the layer's parameters, experts apart
        per_layer, experts = moe_cost.layer_params_per_gpu(model, p, kind)
    return StageConstants(
        f_compute=lt.forward, b_compute=b_compute, matmul_fwd=lt.matmul_fwd, attention_fwd=lt.attention_fwd,
        recompute_passes=rp, ep_recompute_passes=recompute_modules.ep_passes(job, p), tp_recompute_passes=tp_rp,
        output_fwd=cost.output_layer_forward(model, job, p, gpu_type) if stage == output_stage(getattr(p, "schedule", "1f1b"), p.pp) else 0.0,
        params_fixed=c.weights[0] / w_bytes * unshard, params_per_layer=per_layer,
        layer_params=model.layer_matmul_params / p.tp + model.layer_norm_params, expert_params_per_layer=experts,
        backward_gathers_exposed=(p.zero_stage >= 3 and job.fsdp_backward_prefetch == "post"
                                  and cost.term("fsdp_post_prefetch")),
        ep_overlap=getattr(p, "moe_a2a_overlap", False) and kind != "dense",
        backward_gathers=p.zero_stage < 3 or p.reshard_after_forward,
        sync_once_per_step=sharding.grad_sync_once_per_step(job, p))


@dataclass(frozen=True)
class MixedConstants:
    """A stage of a model with dense and MoE layers (docs/moe.md (E1)): each kind's constants. Its methods take
    the stage's `LayerMix` where StageConstants' take a layer count, so the (C11) and (E9) functions below serve
    both: window = n_d b_d + n_m b_m + 2 out, parameters = fixed + n_d p_d + n_m p_m, experts = n_m e_m."""

    dense: StageConstants
    moe: StageConstants

    @property
    def output_fwd(self) -> float:
        return self.moe.output_fwd

    @property
    def expert_params_per_layer(self) -> float:
        return self.moe.expert_params_per_layer

    def window_b(self, mix) -> float:
        return mix.dense * self.dense.b_compute + mix.moe * self.moe.b_compute + 2 * self.output_fwd

    def window_f(self, mix) -> float:
        return mix.dense * self.dense.f_compute + mix.moe * self.moe.f_compute + self.output_fwd

    def stage_params(self, mix) -> float:
        return self.moe.params_fixed + self.dense.params_per_layer * mix.dense + self.moe.params_per_layer * mix.moe

    def weight_grad(self, mix) -> float:
        return mix.dense * self.dense.matmul_fwd + mix.moe * self.moe.matmul_fwd + self.output_fwd

    def expert_params(self, mix) -> float:
        return self.moe.expert_params(mix.moe)


@dataclass(frozen=True)
class BlockConstants:
    """A stage under Megatron-LM's block recompute ((C4b), docs/model.md): `recomputed` of its layers recompute
    their forward (`full`'s constants), the others keep their activations (`plain`'s). Its methods take the
    stage's layer count as StageConstants' do, so the (C11) functions below serve it unchanged: window =
    n_r b_full + (n - n_r) b_plain + 2 out; the parameters are the same whatever a layer recomputes."""

    full: StageConstants
    plain: StageConstants
    recomputed: int
    expert_params_per_layer: float = 0.0  # dense models only (placement.check_block_recompute)

    @property
    def output_fwd(self) -> float:
        return self.full.output_fwd

    def window_b(self, layers: int) -> float:
        return (self.recomputed * self.full.b_compute + (layers - self.recomputed) * self.plain.b_compute
                + 2 * self.output_fwd)

    def window_f(self, layers: int) -> float:
        return (self.recomputed * self.full.f_compute + (layers - self.recomputed) * self.plain.f_compute
                + self.output_fwd)

    def stage_params(self, layers: int) -> float:
        return self.full.stage_params(layers)

    def weight_grad(self, layers: int) -> float:
        return self.full.weight_grad(layers)  # recompute changes no GEMM of the backward

    def expert_params(self, layers: int) -> float:
        return 0.0


def mixed_constants(instance, p, stage: int, gpu_type) -> MixedConstants:
    return MixedConstants(stage_constants(instance, p, stage, gpu_type, "dense"),
                          stage_constants(instance, p, stage, gpu_type, "moe"))


@dataclass(frozen=True)
class LayerTime:
    """One layer, one micro-batch, on the critical path of its stage."""

    forward: float
    backward: float
    tp: float  # exposed tensor-parallel communication (forward + backward)
    cp: float
    zero3: float
    ep: float = 0.0  # expert-parallel dispatch and combine (mixture-of-experts layers, docs/moe.md (E7))
    step: float = 0.0  # exposed once per step, not per micro-batch: (C12) torchtitan's pipelined FSDP sync


def layer_time(k: StageConstants, tp_overlap: bool, tp: float, cp: float, ag: float, rs: float,
               ep: float = 0.0) -> LayerTime:
    """(C6), (C8), (C12), (E7): exposed communication of one layer given its stage's slowest groups.

    tp, cp: forward communication of the slowest tp / cp group; ag, rs: ZeRO-3 per-layer all-gather and
    reduce-scatter of the slowest shard group (0 without ZeRO-3; zero 2: rs alone); ep: forward token dispatch and
    combine of the mean layer over its slowest expert groups (backward the same again, full recompute once more;
    with the all-to-all overlap (E10) what compute leaves exposed, `StageConstants.ep_exposed`, shared between
    forward and backward as the passes are). Non-decreasing in every argument.
    With `k.sync_once_per_step` (torchtitan's pipeline stages) the forward gather and the reduce-scatter leave
    the micro-batch: `step` is what they expose once per step, the first forward's gather beyond the layer's
    forward compute and the whole reduce after the stage's last backward (nothing left to hide it); a backward
    gather (resharded after the forward) stays in every micro-batch.
    """
    if tp_overlap:  # what the GEMMs cannot hide, and at least the share contention leaves exposed
        num, den = cost.tp_overlap_exposed()
        floor = num * tp / den
        tp_f, tp_b = max(floor, tp - k.matmul_fwd), max(floor, tp - 2 * k.matmul_fwd)
    else:
        tp_f, tp_b = tp, tp
    tp_b += k.tp_recompute_passes * tp_f
    cp_f = max(0.0, cp - k.attention_fwd)
    cp_b = 2 * cp_f * (1 + k.recompute_passes / 2)
    # Backward gathers once for the recompute forward and the backward (FSDP's pre-backward hook), unless the
    # forward's gathered parameters were kept (reshard_after_forward False).
    z3_f = max(0.0, ag - (k.f_compute + tp_f + cp_f))
    step = 0.0
    if k.sync_once_per_step:  # the first forward's gather beyond its compute (alone, as (C11)'s windows), the reduce
        step, z3_f, rs = max(0.0, ag - k.f_compute) + rs, 0.0, 0.0
    ag_b = ag if k.backward_gathers else 0.0
    z3_b = ag_b + rs if k.backward_gathers_exposed else max(0.0, ag_b + rs - (k.b_compute + tp_b + cp_b))
    if k.ep_overlap:
        exposed = k.ep_exposed(ep)
        ep_f = exposed / k.ep_passes
        ep_b = exposed - ep_f
    else:
        ep_f, ep_b = ep, ep * (k.ep_passes - 1)
    return LayerTime(forward=k.f_compute + tp_f + cp_f + z3_f + ep_f,
                     backward=k.b_compute + tp_b + cp_b + z3_b + ep_b,
                     tp=tp_f + tp_b, cp=cp_f + cp_b, zero3=z3_f + z3_b, ep=ep_f + ep_b, step=step)


def dp_sync_parts(instance, p, k: StageConstants, layers: int) -> list[tuple[str, float, bool, float]]:
    """(C11) The stage's data-parallel synchronisation as (collective, message bytes, overlapped, window).

    zero 0: all-reduce of the gradients; zero 1: reduce-scatter of gradients + all-gather of parameters, both in
    the shard groups; with replicas (dp_replicate > 1) the reduce-scatter part also carries the all-reduce of the
    gradient shard across them (`sharding.replica_messages`, added by `dp_sync`). zero 2 reduce-scatters (and
    all-reduces across replicas) per layer instead (C12) and all-gathers here; zero 3 synchronises per layer.
    Megatron-FSDP (zero 2 and 3 on the megatron stack) with replicas: the replicas' all-reduce of the stage's
    gradient shard here, once, behind the last backward (an "all_reduce" part whose shard-group message is 0).
    """
    job = instance.training
    # Megatron-FSDP's replicas all-reduce once per step (sharding.replica_messages): a part with no shard message
    replicas = [("all_reduce", 0.0, job.overlap_grad_reduce, k.window_b(layers))] \
        if sharding.replica_reduce_once_per_step(job, p) else []
    if p.dp * p.cp == 1 or p.zero_stage >= 3:
        return replicas  # empty without replicas (and so with dp x cp = 1)
    w_bytes, g_bytes = job.bytes_per_param_state[0], job.grad_reduce_bytes
    params = k.stage_params(layers)
    if p.zero_stage == 0:
        return [("all_reduce", params * g_bytes, job.overlap_grad_reduce, k.window_b(layers))]
    sharded = p.shard_size > 1  # a shard group of one rank (dp_replicate = dp, cp = 1) exchanges nothing
    parts = replicas if p.zero_stage == 2 else [("reduce_scatter", params * g_bytes if sharded else 0.0,
                                                job.overlap_grad_reduce, k.window_b(layers))]
    return parts + [("all_gather", params * w_bytes if sharded else 0.0, job.overlap_param_gather, k.window_f(layers))]


def dp_part_exposed(time: float, window: float, overlapped: bool) -> float:
    """(C11) What one dp collective of `time` leaves on the critical path: all of it if not overlapped, else what
    its compute window cannot hide, and at least the contention share of it (cost.dp_overlap_exposed).
    Non-decreasing in `time`, non-increasing in `window`."""
    if not overlapped:
        return time
    num, den = cost.dp_overlap_exposed()
    return max(num * time / den, time - window, 0.0)


def stage_passes(k: StageConstants, lt: LayerTime, layers: int) -> tuple[float, float]:
    """A stage's forward and backward for one micro-batch: its layers, plus on the last stage the output
    layer and loss (forward, then 2x for backward, never recomputed)."""
    return layers * lt.forward + k.output_fwd, layers * lt.backward + 2 * k.output_fwd


def mixed_passes(k: MixedConstants, dense: LayerTime, moe: LayerTime, mix) -> tuple[float, float]:
    """`stage_passes` of a stage holding `mix` (docs/moe.md (E1)): n_d dense and n_m MoE layers."""
    return (mix.dense * dense.forward + mix.moe * moe.forward + k.output_fwd,
            mix.dense * dense.backward + mix.moe * moe.backward + 2 * k.output_fwd)


def expert_dp_messages(instance, p, k: StageConstants, layers: int) -> dict:
    """(E9) The experts' gradient synchronisation over the expert-data-parallel group, collective -> bytes, in
    the collectives of (C11) (zero 0 all-reduce, zero 1 reduce-scatter + all-gather)."""
    if k.expert_params_per_layer == 0 or p.expert_dp == 1:
        return {}
    w_bytes, g_bytes = instance.training.bytes_per_param_state[0], instance.training.grad_reduce_bytes
    params = k.expert_params(layers)
    if params == 0:  # a stage of dense layers only (E1) has no experts to sync
        return {}
    if p.zero_stage == 0:
        return {"all_reduce": params * g_bytes}
    return {"reduce_scatter": params * g_bytes, "all_gather": params * w_bytes}


def expert_only_parts(instance, k: StageConstants, layers: int, experts) -> list[tuple[str, float, bool, float]]:
    """(E9) The sync's parts as `dp_sync_parts` gives them when only the experts need one (no dense data
    parallelism): each of the experts' collectives with a dense message of 0 and its (C11) window."""
    job = instance.training
    windows = {"all_reduce": k.window_b(layers), "reduce_scatter": k.window_b(layers), "all_gather": k.window_f(layers)}
    overlap = {"all_reduce": job.overlap_grad_reduce, "reduce_scatter": job.overlap_grad_reduce,
               "all_gather": job.overlap_param_gather}
    return [(kind, 0.0, overlap[kind], windows[kind]) for kind in experts]


def dp_sync(instance, p, k: StageConstants, layers: int, slowest, expert_slowest=None, replica_slowest=None
            ) -> tuple[float, float]:
    """(C11) The stage's data-parallel sync and its exposed part: `slowest(kind, message)` is the time of the
    stage's slowest shard group (the dp x cp group without replicas) for that collective; `expert_slowest(kind,
    message)` the same over the expert-data-parallel groups (E9), `replica_slowest(message)` the all-reduce of the
    slowest replicate group (dp_replicate > 1); each shares the window of the collective it follows."""
    parts = dp_sync_parts(instance, p, k, layers)
    experts = expert_dp_messages(instance, p, k, layers) if expert_slowest else {}
    replicas = sharding.replica_messages(instance, p, k.stage_params(layers)) if replica_slowest else {}
    if experts and not parts:  # the dense parameters need no sync, the experts do
        parts = expert_only_parts(instance, k, layers, experts)
    total = exposed = 0.0
    for kind, message, overlapped, window in parts:
        time = (slowest(kind, message) if message > 0 else 0.0) + (
            expert_slowest(kind, experts[kind]) if kind in experts else 0.0) + (
            replica_slowest(replicas[kind]) if kind in replicas else 0.0)
        total += time
        exposed += dp_part_exposed(time, window, overlapped)
    return total, exposed


def iteration_time(pipe: float, chain: float, dp_exposed: float, optimizer: float, overhead: float) -> float:
    """(C14) The iteration: schedule, send/receive chain, then the slowest exposed dp sync, optimizer step and
    per-iteration overhead (in this order of addition everywhere, so every scorer agrees to the bit)."""
    return pipe + chain + dp_exposed + optimizer + overhead
