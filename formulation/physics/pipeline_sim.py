"""A discrete-event simulation of one pipeline schedule's op order (formulation/physics/schedule_orders.py): each
rank runs its ops in order; an op starts when its rank is free and its input has arrived (the producing op's end
plus the send between the two ranks). The reference the closed forms of formulation/physics/schedules.py are
tested against (docs/schedules.md), and what the plan's schedule picture draws.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SimOp:
    rank: int
    kind: str  # F, B (whole backward), I (input gradient), W (weight gradient)
    stage: int  # virtual stage
    micro_batch: int
    start: float = 0.0
    end: float = 0.0
    comm: tuple[float, float] | None = None  # the incoming send this op waited for (start, end)
    cause: "SimOp | None" = None  # the op whose end (plus send) or whose rank slot fixed this start
    critical: bool = False


def stage_rank(stage: int, pp: int, style: str) -> int:
    """The rank that runs virtual stage `stage`: looped (v mod pp) or V-shaped (v, then 2 pp - 1 - v)."""
    if style == "v":
        return stage if stage < pp else 2 * pp - 1 - stage
    return stage % pp


def boundary_of(stage: int, pp: int, style: str) -> int | None:
    """Index j of the rank boundary (j, j + 1) a send from virtual stage `stage` to `stage` + 1 crosses; pp - 1
    for the looped schedules' wrap from the last rank to the first; None when both run on one rank."""
    a, b = stage_rank(stage, pp, style), stage_rank(stage + 1, pp, style)
    if a == b:
        return None
    if style == "v":
        return min(a, b)
    return a if b == a + 1 else pp - 1


def simulate(orders: dict[int, list[tuple[str, int, int]]], pp: int, chunks: int, style: str,
             forward, backward, weight, sends, wrap: float = 0.0) -> tuple[float, list[SimOp]]:
    """Makespan and ops of one iteration. `forward[i]`, `backward[i]` (input gradient), `weight[i]` are rank i's
    times for one micro-batch over all its layers; each of its `chunks` model chunks takes 1 / chunks of them.
    `sends[j]` is one send across boundary (j, j + 1) (either direction), `wrap` the last rank to the first."""
    last = pp * chunks - 1
    dur = {"F": forward, "I": backward, "W": weight,
           "B": [b + w for b, w in zip(backward, weight)]}
    ops: dict[tuple[str, int, int], SimOp] = {}
    queues = []
    for r in range(pp):
        queue = [SimOp(r, kind, stage, mb) for kind, stage, mb in orders[r]]
        for op in queue:
            ops[(op.kind, op.stage, op.micro_batch)] = op
        queues.append(queue)

    def send(stage: int) -> float:
        j = boundary_of(stage, pp, style)
        return 0.0 if j is None else (wrap if j == pp - 1 else sends[j])

    def dependency(op: SimOp) -> tuple[SimOp | None, float]:
        if op.kind == "F":
            return (ops[("F", op.stage - 1, op.micro_batch)], send(op.stage - 1)) if op.stage > 0 else (None, 0.0)
        if op.kind == "W":
            return ops[("I", op.stage, op.micro_batch)], 0.0
        if op.stage == last:
            return ops[("F", op.stage, op.micro_batch)], 0.0
        upstream = ops.get(("B", op.stage + 1, op.micro_batch)) or ops[("I", op.stage + 1, op.micro_batch)]
        return upstream, send(op.stage)

    done: set[int] = set()
    nxt, free, prev = [0] * pp, [0.0] * pp, [None] * pp
    remaining = sum(len(q) for q in queues)
    while remaining:
        progressed = False
        for r, queue in enumerate(queues):
            while nxt[r] < len(queue):
                op = queue[nxt[r]]
                dep, wait = dependency(op)
                if dep is not None and id(dep) not in done:
                    break
                ready = dep.end + wait if dep is not None else 0.0
                op.start = max(free[r], ready)
                op.cause = prev[r] if free[r] >= ready and prev[r] is not None else dep
                if dep is not None and wait > 0:
                    op.comm = (dep.end, ready)
                op.end = op.start + dur[op.kind][r] / chunks
                free[r], prev[r] = op.end, op
                done.add(id(op))
                nxt[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError("schedule simulation deadlocked (inconsistent op order)")
    everything = [op for q in queues for op in q]
    return max(op.end for op in everything), everything


def critical_path(everything: list[SimOp]) -> list[SimOp]:
    """Back from the last op to finish along what held each op up (its rank or its input), marked critical."""
    op = max(everything, key=lambda o: o.end)
    path = []
    while op is not None:
        op.critical = True
        path.append(op)
        op = op.cause
    return path[::-1]
