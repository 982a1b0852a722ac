"""The single evaluator: iteration time, throughput and memory of any complete placement.

Every placement, from any method, is scored here; the exact program is an encoding of the same model.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import numpy as np

from formulation.physics import cost, layer_kinds, moe_cost, schedules, v_schedules
from formulation.physics.memory import StageMemory, memory_coefficients, stage_memory
from formulation.intervals import (POOLED, evidence, interval_basis, interval_note, prediction_interval,
                                   slow_tail_share, stack_kind)
from formulation.placement import Placement, check_placement
from formulation.placement_file import placement_from_document
from formulation.stage_links import StageLinks, pipeline_message, replica_time, stage_links
from formulation.physics.stage import dp_sync as stage_dp_sync
from formulation.physics.stage import BlockConstants, iteration_time, mixed_passes, stage_passes


@dataclass(frozen=True)
class StageEstimate:
    stage: int
    layers: int
    gpu_type: str
    forward_s: float  # one micro-batch, incl. exposed tp/cp/ZeRO-3 communication
    backward_s: float
    compute_s: float  # per micro-batch, compute only (forward + backward + recompute)
    tp_comm_s: float
    cp_comm_s: float
    zero3_comm_s: float
    dp_sync_s: float  # gradient synchronisation of this stage after its last backward
    dp_exposed_s: float
    optimizer_s: float  # (C13) this stage's optimizer step
    memory: StageMemory
    ep_comm_s: float = 0.0  # expert dispatch and combine per micro-batch (mixture-of-experts, docs/moe.md (E7))
    weight_grad_s: float = 0.0  # (C15) the weight-gradient GEMMs W inside backward_s (zero-bubble schedules)
    # the forward's compute alone (layers and output layer, no communication): the V schedules' F (S3)
    forward_compute_s: float = 0.0

    @property
    def time_per_micro_batch_s(self) -> float:
        return self.forward_s + self.backward_s

    @property
    def input_grad_s(self) -> float:
        """(C15) The input-gradient part B of the backward: backward_s - weight_grad_s."""
        return self.backward_s - self.weight_grad_s


@dataclass(frozen=True)
class Estimate:
    iteration_time_s: float
    tokens_per_s: float
    model_tflops_per_gpu: float
    mfu: float
    breakdown: dict  # critical path: compute_s, bubble_s, tp_comm_s, cp_comm_s, pp_comm_s, dp_comm_s, ...
    stages: tuple[StageEstimate, ...]
    peak_memory_gib: float
    fits: bool
    num_micro_batches: int
    critical_stage: int
    p2p_boundary_s: tuple[float, ...] = ()  # one send between stage j and j + 1 (slowest pair), j = 0..pp-2
    interval_group: str = POOLED  # whose cross-source residuals give the interval (formulation/intervals.py)
    stack_kind: str = "megatron"  # whose share of runs beyond the interval's slow end applies (the same module)
    interval_gaps: tuple[str, ...] = ()  # what the visible reference has no measured runs of (the same module)

    @property
    def memory_shortfall_gib(self) -> float:
        """Largest excess of a stage over its limit (<= 0 when the plan fits)."""
        return max(s.memory.total_gib - s.memory.limit_gib for s in self.stages)

    def to_dict(self) -> dict:
        stages = []
        for s in self.stages:
            d = asdict(s)
            mem = d.pop("memory")
            mem.pop("stage")
            mem["total_gib"] = s.memory.total_gib
            # what each counter would read (docs/model.md (M8)): nvidia-smi is total_gib
            mem["allocated_peak_gib"] = s.memory.allocated_gib
            mem["reserved_peak_gib"] = s.memory.reserved_gib
            mem["fits"] = s.memory.fits
            d["time_per_micro_batch_s"] = s.time_per_micro_batch_s
            d["memory"] = mem
            stages.append(d)
        return {"iteration_time_s": self.iteration_time_s, "tokens_per_s": self.tokens_per_s,
                "model_tflops_per_gpu": self.model_tflops_per_gpu, "mfu": self.mfu, "breakdown": dict(self.breakdown),
                "num_micro_batches": self.num_micro_batches, "critical_stage": self.critical_stage,
                "p2p_boundary_s": list(self.p2p_boundary_s),
                "peak_memory_gib": self.peak_memory_gib, "fits": self.fits, "stages": stages,
                "iteration_time_interval_s": self.iteration_time_interval_s,
                "iteration_time_interval_basis": interval_basis(self.interval_group),
                # what the interval rests on and what would narrow it (formulation/intervals.py, evidence)
                "iteration_time_interval_evidence": {"missing": list(self.interval_gaps),
                                                     "note": interval_note(self.interval_group, self.interval_gaps)},
                # held out by source, the share of published runs of this kind of stack measured slower than the
                # interval's slow end (10% nominal; about a third on the PyTorch stacks, docs/validation.md)
                "iteration_time_slow_tail_share": slow_tail_share(self.stack_kind)}

    @property
    def iteration_time_interval_s(self) -> list[float] | None:
        """p10-p90 of what such a run measures, from the cross-source residuals (formulation/intervals.py)."""
        interval = prediction_interval(self.iteration_time_s, self.interval_group)
        return list(interval) if interval else None


def _stage_memory(instance, p, stage, layers, gpus, dense_layers: int = 0, plain=None,
                  plain_layers: int = 0) -> StageMemory:
    cluster = instance.cluster
    types = sorted({cluster.nodes[n].gpu_type for n in np.unique(cluster.gpu_node[gpus])})
    options = [stage_memory(instance, p, stage, layers, cluster.gpu_types[t], dense_layers=dense_layers,
                            plain=plain, plain_layers=plain_layers) for t in types]
    return max(options, key=lambda m: m.total_gib - m.limit_gib)


def stage_estimate(instance, p: Placement, i: int, layers: int, links: StageLinks | None = None,
                   mix: layer_kinds.LayerMix | None = None) -> StageEstimate:
    """Stage i of `p` with `layers` layers: times per micro-batch, dp sync (C11), optimizer (C13), memory.
    A model with dense and MoE layers: `mix` says how many of each (default: stage i's under `p`'s partition;
    `layers` may be the LayerMix itself)."""
    sl = links or stage_links(instance, p, i)
    if isinstance(layers, layer_kinds.LayerMix):
        layers, mix = layers.total, layers
    if layer_kinds.is_mixed(instance.model):
        if mix is None:
            if layers != p.layers_per_stage[i]:
                raise ValueError("a stage of a model with both layer kinds needs its LayerMix")
            mix = layer_kinds.stage_mixes(instance.model, p.layers_per_stage, p.vpp)[i]
        return _mixed_stage_estimate(instance, p, i, mix, sl)
    if 0 < p.recomputed_layers(layers) < layers:
        return _block_stage_estimate(instance, p, i, layers, sl)
    job, cluster = instance.training, instance.cluster
    k, lt, gpu_type = sl.constants, sl.layer, sl.gpu_type
    # output layer and loss on the last stage: forward + 2x backward, never recomputed
    fwd, bwd = stage_passes(k, lt, layers)
    compute = layers * (k.f_compute + k.b_compute) + 3 * k.output_fwd
    # (C11) data-parallel synchronisation after the stage's last backward
    dp_links, edp_links = set(sl.dp_links), set(sl.edp_links)  # each distinct links costed once
    dp_sync, dp_exposed = stage_dp_sync(instance, p, k, layers, lambda kind, message: max(
        cost.collective_time(kind, message, lk, cluster) for lk in dp_links), (lambda kind, message: max(
            cost.collective_time(kind, message, lk, cluster) for lk in edp_links)) if edp_links else None,
        replica_time(cluster, sl.rep_links))
    opt_fixed, opt_per_layer = memory_coefficients(instance, p, i).optimizer
    return StageEstimate(
        stage=i, layers=layers, gpu_type=gpu_type.name, forward_s=fwd, backward_s=bwd, compute_s=compute,
        tp_comm_s=layers * lt.tp, cp_comm_s=layers * lt.cp, zero3_comm_s=layers * lt.zero3,
        dp_sync_s=dp_sync + layers * lt.step, dp_exposed_s=dp_exposed + layers * lt.step,  # (C12) once per step
        optimizer_s=cost.optimizer_step_time((opt_fixed + opt_per_layer * layers) / job.bytes_per_param_state[2],
                                             gpu_type),
        memory=_stage_memory(instance, p, i, layers, sl.gpus), ep_comm_s=layers * lt.ep,
        weight_grad_s=k.weight_grad(layers), forward_compute_s=k.window_f(layers))


def _block_stage_estimate(instance, p: Placement, i: int, layers: int, sf: StageLinks) -> StageEstimate:
    """`stage_estimate` under Megatron-LM's block recompute ((C4b), (M4b)): the stage's recomputed layers at full
    recompute's per-layer terms, the others at recompute "none"'s, each times its count. `sf`: the stage's links
    under `p` itself, which are full recompute's (the layer count r does not enter them)."""
    job, cluster = instance.training, instance.cluster
    full, plain = replace(p, recompute_num_layers=0), replace(p, recompute="none", recompute_num_layers=0)
    n_r = p.recomputed_layers(layers)
    n_p = layers - n_r
    sn = stage_links(instance, plain, i)
    kf, kn, lf, ln = sf.constants, sn.constants, sf.layer, sn.layer
    k = BlockConstants(kf, kn, n_r)
    fwd = n_r * lf.forward + n_p * ln.forward + k.output_fwd
    bwd = n_r * lf.backward + n_p * ln.backward + 2 * k.output_fwd
    compute = n_r * (kf.f_compute + kf.b_compute) + n_p * (kn.f_compute + kn.b_compute) + 3 * k.output_fwd
    dp_sync, dp_exposed = stage_dp_sync(instance, p, k, layers, lambda kind, message: max(
        cost.collective_time(kind, message, lk, cluster) for lk in sf.dp_links),
        replica_slowest=replica_time(cluster, sf.rep_links))
    opt_fixed, opt_per_layer = memory_coefficients(instance, full, i).optimizer

    def per_kind(field: str) -> float:
        return n_r * getattr(lf, field) + n_p * getattr(ln, field)

    return StageEstimate(
        stage=i, layers=layers, gpu_type=sf.gpu_type.name, forward_s=fwd, backward_s=bwd, compute_s=compute,
        tp_comm_s=per_kind("tp"), cp_comm_s=per_kind("cp"), zero3_comm_s=per_kind("zero3"),
        dp_sync_s=dp_sync + per_kind("step"), dp_exposed_s=dp_exposed + per_kind("step"),
        optimizer_s=cost.optimizer_step_time(
            (opt_fixed + opt_per_layer * layers) / job.bytes_per_param_state[2], sf.gpu_type),
        memory=_stage_memory(instance, full, i, layers, sf.gpus, plain=memory_coefficients(instance, plain, i),
                             plain_layers=n_p), weight_grad_s=k.weight_grad(layers),
        forward_compute_s=k.window_f(layers))


def _mixed_stage_estimate(instance, p: Placement, i: int, mix, sl: StageLinks) -> StageEstimate:
    """`stage_estimate` of a stage holding `mix.dense` dense and `mix.moe` MoE layers (docs/moe.md (E1)): every
    per-layer term is each kind's own, times its count."""
    job, cluster = instance.training, instance.cluster
    k, lm, ld, gpu_type = sl.constants, sl.layer, sl.dense_layer, sl.gpu_type
    fwd, bwd = mixed_passes(k, ld, lm, mix)
    compute = (mix.dense * (k.dense.f_compute + k.dense.b_compute) + mix.moe * (k.moe.f_compute + k.moe.b_compute)
               + 3 * k.output_fwd)
    dp_sync, dp_exposed = stage_dp_sync(instance, p, k, mix, lambda kind, message: max(
        cost.collective_time(kind, message, lk, cluster) for lk in sl.dp_links), (lambda kind, message: max(
            cost.collective_time(kind, message, lk, cluster) for lk in sl.edp_links)) if sl.edp_links else None)
    opt_fixed, opt_moe = memory_coefficients(instance, p, i, "moe").optimizer
    opt_dense = memory_coefficients(instance, p, i, "dense").optimizer[1]
    state = opt_fixed + opt_dense * mix.dense + opt_moe * mix.moe

    def per_kind(field: str) -> float:
        return mix.dense * getattr(ld, field) + mix.moe * getattr(lm, field)

    return StageEstimate(
        stage=i, layers=mix.total, gpu_type=gpu_type.name, forward_s=fwd, backward_s=bwd, compute_s=compute,
        tp_comm_s=per_kind("tp"), cp_comm_s=per_kind("cp"), zero3_comm_s=per_kind("zero3"),
        dp_sync_s=dp_sync, dp_exposed_s=dp_exposed,
        optimizer_s=cost.optimizer_step_time(state / job.bytes_per_param_state[2], gpu_type),
        memory=_stage_memory(instance, p, i, mix.total, sl.gpus, mix.dense), ep_comm_s=per_kind("ep"),
        weight_grad_s=k.weight_grad(mix), forward_compute_s=k.window_f(mix))


def compose_iteration(instance, p: Placement, stages, boundaries, wrap: float) -> tuple[float, float, int, float]:
    """(C9), (C10), (C14): the iteration from its stages (StageEstimate) and the slowest send across each
    pipeline boundary (`wrap`: last stage to first, interleaved schedules only). Returns the iteration time,
    the schedule's time, its critical stage and the send/receive chain."""
    m = p.num_micro_batches(instance.training.global_batch_size)
    v_shaped = p.schedule in v_schedules.V_FAMILIES  # (S3): F is the forward's compute, the rest of t is B + W
    pipe, k = schedules.pipeline_time(p.schedule, [s.time_per_micro_batch_s for s in stages],
                                      [s.forward_compute_s if v_shaped else s.forward_s for s in stages],
                                      [s.input_grad_s for s in stages],
                                      [s.weight_grad_s for s in stages], m, p.vpp)  # (S1), (C9), (S3)
    chain = cost.p2p_chain(boundaries, wrap if p.vpp > 1 and not v_shaped else 0.0, m, p.pp, p.vpp)
    overhead = max(instance.cluster.gpu_types[s.gpu_type].iteration_overhead_s for s in stages)
    total = iteration_time(pipe, chain, max(s.dp_exposed_s for s in stages), max(s.optimizer_s for s in stages),
                           overhead)  # (C14)
    return total, pipe, k, chain


def evaluate(instance, placement: Placement | dict, check: bool = True) -> Estimate:
    """Score a complete placement with the cost model (C1)-(C14) and memory model (M1)-(M7). A dict is read as a
    placement file is (`formulation.placement_file.placement_from_document`: omitted fields take their defaults, a bad
    field is an `InputError` naming it)."""
    if not isinstance(placement, Placement):
        placement = placement_from_document(placement, instance, "<placement>")
    elif check:
        check_placement(instance, placement, "<placement>")
    model, job, cluster, p = instance.model, instance.training, instance.cluster, placement
    m = p.num_micro_batches(job.global_batch_size)
    stages = [stage_estimate(instance, p, i, layers) for i, layers in enumerate(p.layers_per_stage)]
    # (C9) schedule, (C10) p2p chain
    times = [s.time_per_micro_batch_s for s in stages]
    message = pipeline_message(instance, p)

    def boundary(a: int, b: int) -> float:  # (C10) the slowest pair's send, each distinct pair's links once
        return max(cost.p2p_time(message, bw, same, cluster)
                   for bw, same in cluster.distinct_send_links(p.stage_gpus(a), p.stage_gpus(b)))

    boundaries = [boundary(j, j + 1) for j in range(p.pp - 1)]
    wraps = p.vpp > 1 and p.schedule not in v_schedules.V_FAMILIES  # a V sends no wrap (S3)
    total, pipe, k, chain = compose_iteration(instance, p, stages, boundaries,
                                              boundary(p.pp - 1, 0) if wraps else 0.0)
    dp_exposed = max(s.dp_exposed_s for s in stages)
    optimizer = max(s.optimizer_s for s in stages)
    overhead = max(cluster.gpu_types[s.gpu_type].iteration_overhead_s for s in stages)
    crit = stages[k]
    breakdown = {
        "compute_s": m * crit.compute_s,
        "bubble_s": pipe - m * times[k],
        "tp_comm_s": m * crit.tp_comm_s,
        "cp_comm_s": m * crit.cp_comm_s,
        "pp_comm_s": chain,
        "dp_comm_s": dp_exposed + m * crit.zero3_comm_s,
        "optimizer_s": optimizer,
        "overhead_s": overhead,
    }
    if moe_cost.is_moe(model):  # expert dispatch and combine on the critical stage
        breakdown["ep_comm_s"] = m * crit.ep_comm_s
    used = np.asarray(p.gpus)
    peaks = np.array([cluster.gpu_types[cluster.nodes[n].gpu_type].peak_tflops for n in cluster.gpu_node[used]])
    model_flops = moe_cost.model_flops(model, job.global_batch_size, job.seq_length)
    tflops_per_gpu = model_flops / total / p.world_size / 1e12
    group, gaps = evidence(job, model, cluster, cluster.gpu_types[crit.gpu_type], p)
    return Estimate(
        iteration_time_s=total, tokens_per_s=job.global_batch_size * job.seq_length / total,
        model_tflops_per_gpu=tflops_per_gpu, mfu=tflops_per_gpu / float(peaks.mean()), breakdown=breakdown,
        stages=tuple(stages), peak_memory_gib=max(s.memory.total_gib for s in stages),
        fits=all(s.memory.fits for s in stages), num_micro_batches=m, critical_stage=k,
        p2p_boundary_s=tuple(boundaries),
        interval_group=group, interval_gaps=gaps, stack_kind=stack_kind(job))
