"""The pipeline schedule of one iteration as an event simulation of Megatron-LM's order (warm-up forwards,
steady 1F1B, cool-down; interleaved chunks), from the estimate's per-stage forward/backward times and
per-boundary send times, with its critical path. `schedule.png` draws it."""

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
    """Event simulation of one iteration: each stage runs its ops in Megatron's order; an op starts when its
    stage is free and its input has arrived (the producing op's end plus the p2p send time of that link).
    A zero-bubble plan runs torch's order of its schedule (`simulate_zero_bubble`)."""
    if placement.schedule != "1f1b":
        return simulate_zero_bubble(instance, placement, estimate)
    p, m, vpp = placement, estimate.num_micro_batches, placement.vpp
    boundary = list(estimate.p2p_boundary_s)
    wrap = wrap_time(instance, p) if vpp > 1 else 0.0
    last_virtual = vpp * p.pp - 1
    ops = {}
    queues = []
    for i in range(p.pp):
        queue = []
        for kind, chunk, mb in stage_order(i, p.pp, m, vpp):
            op = Op(i, kind, chunk, mb)
            ops[(kind, chunk * p.pp + i, mb)] = op
            queue.append(op)
        queues.append(queue)

    def link(v: int) -> float:  # send time between virtual stages v and v + 1
        return boundary[v % p.pp] if v % p.pp < p.pp - 1 else wrap

    def dependency(op: Op) -> tuple[Op | None, float]:
        v = op.chunk * p.pp + op.stage
        if op.kind == "F":
            return (ops[("F", v - 1, op.micro_batch)], link(v - 1)) if v > 0 else (None, 0.0)
        if v == last_virtual:
            return ops[("F", v, op.micro_batch)], 0.0
        return ops[("B", v + 1, op.micro_batch)], link(v)

    durations = [(s.forward_s / vpp, s.backward_s / vpp) for s in estimate.stages]
    done: set[int] = set()
    nxt, free, last = [0] * p.pp, [0.0] * p.pp, [None] * p.pp
    remaining = sum(len(q) for q in queues)
    while remaining:
        progressed = False
        for i, queue in enumerate(queues):
            while nxt[i] < len(queue):
                op = queue[nxt[i]]
                dep, send = dependency(op)
                if dep is not None and id(dep) not in done:
                    break
                ready = dep.end + send if dep is not None else 0.0
                op.start = max(free[i], ready)
                op.cause = last[i] if free[i] >= ready and last[i] is not None else dep
                if dep is not None and send > 0:
                    op.comm = (dep.end, ready)
                op.end = op.start + durations[i][0 if op.kind == "F" else 1]
                free[i], last[i] = op.end, op
                done.add(id(op))
                nxt[i] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError("schedule simulation deadlocked (inconsistent op order)")
    everything = [op for q in queues for op in q]
    end = max(everything, key=lambda o: o.end)
    return Schedule(everything, end.end, _critical_path(end))


def simulate_zero_bubble(instance, placement, estimate) -> Schedule:
    """A zero-bubble plan's iteration (docs/schedules.md): torch's ZB-H1 / InterleavedZeroBubble order of each
    rank (formulation/physics/schedule_orders.py) through the event simulation of formulation/physics/pipeline_sim.py,
    each stage's backward split into its input gradient (drawn as B) and its weight gradient W."""
    p, m, vpp = placement, estimate.num_micro_batches, placement.vpp
    v_shaped = p.schedule in v_schedules.V_FAMILIES  # ZBVZeroBubble, DualPipeV: torch's order on a V (S3)
    orders = {r: v_schedules.order(p.schedule, r, p.pp, m) if v_shaped else
              schedule_orders.looped(r, p.pp, m, vpp, zero_bubble=True) for r in range(p.pp)}
    stages = estimate.stages
    makespan, sim_ops = pipeline_sim.simulate(
        orders, p.pp, vpp, "v" if v_shaped else "loop", [s.forward_s for s in stages],
        [s.input_grad_s for s in stages], [s.weight_grad_s for s in stages], list(estimate.p2p_boundary_s),
        wrap_time(instance, p) if vpp > 1 and not v_shaped else 0.0)
    path = {id(o) for o in pipeline_sim.critical_path(sim_ops)}
    ops = {id(o): Op(o.rank, "B" if o.kind == "I" else o.kind, o.stage // p.pp, o.micro_batch, o.start, o.end, o.comm,
                     critical=id(o) in path) for o in sim_ops}
    for o in sim_ops:
        ops[id(o)].cause = ops[id(o.cause)] if o.cause is not None else None
    critical = sorted((op for op in ops.values() if op.critical), key=lambda op: op.start)
    return Schedule(list(ops.values()), makespan, critical)


def _critical_path(end: Op) -> list[Op]:
    """Back from the last op to finish along what held each op up (its stage or its input), marked critical."""
    path, op = [], end
    while op is not None:
        op.critical = True
        path.append(op)
        op = op.cause
    return path[::-1]
