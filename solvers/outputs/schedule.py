"""The pipeline schedule of one iteration, each op with its start and end, from the estimate's per-stage
forward/backward times and per-boundary send times, with its critical path: the schedule's op order (Megatron-LM's
warm-up forwards, steady 1F1B, cool-down, interleaved chunks; torch's zero-bubble orders) run through the event
simulation of formulation/physics/pipeline_sim.py. `schedule.png` draws it."""

from __future__ import annotations

from dataclasses import dataclass, field

from formulation.physics import cost, pipeline_sim, schedule_orders, v_schedules


@dataclass
class Op:
    stage: int
    kind: str  # "F", "B" (the input-gradient backward under zero bubble) or "W" (its deferred weight gradient)
    chunk: int  # model chunk (virtual stage = chunk x pp + stage)
    micro_batch: int
    start: float = 0.0
    end: float = 0.0
    comm: tuple[float, float] | None = None  # incoming p2p transfer (start, end) this op waited for
    cause: "Op | None" = None  # the op whose end (plus transfer) or whose stage slot fixed this start
    critical: bool = False


@dataclass
class Schedule:
    ops: list[Op]
    makespan_s: float
    critical_path: list[Op] = field(default_factory=list)


def stage_order(stage: int, pp: int, m: int, vpp: int) -> list[tuple[str, int, int]]:
    """(kind, chunk, micro-batch) in Megatron-LM's order on one stage: warm-up forwards, steady 1F1B,
    cool-down backwards; interleaved (vpp > 1) walks chunks in groups of pp micro-batches."""
    total = m * vpp
    if vpp == 1:
        warmup = min(pp - stage - 1, m)
    else:
        warmup = total if m == pp else min(2 * (pp - stage - 1) + (vpp - 1) * pp, total)

    def virtual(k: int, forward: bool) -> tuple[int, int]:
        chunk = (k % (pp * vpp)) // pp
        return (chunk if forward else vpp - 1 - chunk), (k // (pp * vpp)) * pp + k % pp

    order = [("F", *virtual(k, True)) for k in range(warmup)]
    for k in range(total - warmup):
        order += [("F", *virtual(warmup + k, True)), ("B", *virtual(k, False))]
    order += [("B", *virtual(k, False)) for k in range(total - warmup, total)]
    return order


def wrap_time(instance, p) -> float:
    """Send time from the last stage back to the first (interleaving), as the evaluator prices p2p (C7)."""
    job, cluster = instance.training, instance.cluster
    sp = job.sequence_parallel_size(p.tp)
    message = cost.activation_message_bytes(instance.model, job, p) / sp
    return max(cost.p2p_time(message, cluster.bandwidth(int(a), int(b)), cluster.gpu_domain[a] == cluster.gpu_domain[b],
                             cluster) for a, b in zip(p.stage_gpus(p.pp - 1), p.stage_gpus(0)))


def simulate_schedule(instance, placement, estimate) -> Schedule:
    """One iteration through the event simulation of formulation/physics/pipeline_sim.py: each stage runs its ops
    in its schedule's order; an op starts when its stage is free and its input has arrived (the producing op's end
    plus the p2p send time of that link). 1F1B and interleaved 1F1B run Megatron's order (`stage_order`), each
    backward whole (B); a zero-bubble plan runs torch's order of its schedule (formulation/physics/
    schedule_orders.py, docs/schedules.md), each stage's backward split into its input gradient (drawn as B) and
    its weight gradient W."""
    p, m, vpp = placement, estimate.num_micro_batches, placement.vpp
    stages = estimate.stages
    v_shaped = p.schedule in v_schedules.V_FAMILIES  # ZBVZeroBubble, DualPipeV: torch's order on a V (S3)
    if p.schedule == "1f1b":
        orders = {r: [(kind, chunk * p.pp + r, mb) for kind, chunk, mb in stage_order(r, p.pp, m, vpp)]
                  for r in range(p.pp)}
        backward, weight = [s.backward_s for s in stages], [0.0] * p.pp  # B lasts backward + weight: backward_s
    else:
        orders = {r: v_schedules.order(p.schedule, r, p.pp, m) if v_shaped else
                  schedule_orders.looped(r, p.pp, m, vpp, zero_bubble=True) for r in range(p.pp)}
        backward, weight = [s.input_grad_s for s in stages], [s.weight_grad_s for s in stages]
    makespan, sim_ops = pipeline_sim.simulate(
        orders, p.pp, vpp, "v" if v_shaped else "loop", [s.forward_s for s in stages], backward, weight,
        list(estimate.p2p_boundary_s), wrap_time(instance, p) if vpp > 1 and not v_shaped else 0.0)
    path = pipeline_sim.critical_path(sim_ops)
    ops = {id(o): Op(o.rank, "B" if o.kind == "I" else o.kind, o.stage // p.pp, o.micro_batch, o.start, o.end, o.comm,
                     critical=o.critical) for o in sim_ops}
    for o in sim_ops:
        ops[id(o)].cause = ops[id(o.cause)] if o.cause is not None else None
    return Schedule(list(ops.values()), makespan, [ops[id(o)] for o in path])
