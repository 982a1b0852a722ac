"""The exact program's expert groups (docs/programs.md (P14)-(P16), docs/moe.md (E7), (E9)): the expert-parallel
dispatch and combine and the expert-tp gather and scatter of a stage's slowest such groups, entering the per-layer
time as `formulation/physics/stage.py::layer_time(..., ep=...)` adds them, and the expert-data-parallel gradient
sync that `stage.dp_sync` adds to the dense collective of the same kind. `b` is the program builder of
`formulation/programs/exact.py`. Expert groups re-split each stage's tp x cp x dp ranks in the order etp-ep-edp
(`Placement.expert_grid`), so their ranks come from the template placement like every other group's. The
symmetry breaking (P13) lives here too, since interchangeable units are whole expert blocks (`symmetric_unit`)."""

from __future__ import annotations

import math

import numpy as np

from formulation.physics import moe_cost
from formulation.physics.cost import GroupLinks
from formulation.physics.stage import expert_dp_messages
from formulation.programs.exact_groups import group_time, group_variables, sync_time


def expert_layer_comm(b, i: int) -> int | None:
    """(P14) One MoE layer's forward expert communication of stage i (E1: only MoE layers have it):
    EP_i >= T_ep(g) for every expert-parallel group g (the all-to-all's two levels run at once: (P6) with
    X >= each level's part), ETP_i >= T_etp(g) for every expert-tp group ((P6) as tp). Returns the variable
    M_i = EP_i + ETP_i (None when the stage has no expert groups); an MoE layer's time adds ep_passes M_i (2 + rp, + 1 under the "moe" recompute module)."""
    prog, inst, tpl, cluster = b.prog, b.inst, b.template, b.cluster
    model, job = inst.model, inst.training
    phi = 1.0 if moe_cost.moe_fraction(model) > 0 else 0.0  # the MoE layer's, not the mean layer's
    if phi == 0 or (tpl.ep == 1 and tpl.etp == 1):
        return None
    total = prog.var(f"MOE[{i}]")
    terms = {total: 1}
    kinds = []
    if tpl.ep > 1:
        # all-to-alls run both levels at once (max + latency); the allgather dispatcher's collectives as (C5) says
        concurrent = True if job.moe_token_dispatcher in ("alltoall", "deepep") else None
        kinds.append(("ep", tpl.moe_ep_groups(i), concurrent,
                      lambda lk: phi * moe_cost.ep_layer_comm(model, job, tpl, lk, cluster)))
    if tpl.etp > 1:
        kinds.append(("etp", tpl.expert_tp_groups(i, tpl.ep, tpl.etp), None,
                      lambda lk: phi * moe_cost.etp_layer_comm(model, job, tpl, lk, cluster)))
    for name, groups, concurrent, fn in kinds:
        slowest = prog.var(f"{name.upper()}[{i}]")
        for ranks in groups:
            g = group_variables(b, ranks, f"{name}{i}.")
            t = group_time(b, g, fn, f"{name}{i}.", concurrent=concurrent)
            prog.add({slowest: 1, t: -1}, ">=", 0, f"P14 slowest {name} group")
        terms[slowest] = -1
    prog.add(terms, ">=", 0, "P14 expert communication")
    return total


def expert_layer_upper_bound(b) -> float:
    """(ep + etp) forward time of the worst shape at the slowest level: a valid upper bound of M_i."""
    inst, tpl, cluster = b.inst, b.template, b.cluster
    model, job = inst.model, inst.training
    slow = b.levels[0]

    def worst(fn, n):
        if n <= 1:
            return 0.0
        return max(fn(GroupLinks(n, slow, slow, N, kk), cluster) for N in range(1, n + 1)
                   for kk in range(1, n // N + 1))

    ep = worst(lambda lk, c: moe_cost.ep_layer_comm(model, job, tpl, lk, c), tpl.ep)
    etp = worst(lambda lk, c: moe_cost.etp_layer_comm(model, job, tpl, lk, c), tpl.etp)
    return (ep + etp) if moe_cost.moe_fraction(model) > 0 else 0.0


def expert_dp_groups(b, i: int) -> list:
    """The expert-data-parallel groups' variables of stage i ((P4), (P5)); [] without expert-data parallelism."""
    tpl = b.template
    if moe_cost.moe_fraction(b.inst.model) == 0 or tpl.expert_dp == 1:
        return []
    return [group_variables(b, ranks, f"edp{i}.") for ranks in tpl.moe_expert_dp_groups(i)]


def expert_sync_time(b, i: int, groups: list, kind: str, qs: list[int], name: str) -> int | None:
    """(P15) The slowest expert-data-parallel group's `kind` collective of the expert gradients (E9) of stage i:
    its message grows with the layer count, so as (P9) each group's parts are selected by (shape, level, layer
    count) together (exact_groups.sync_time). None if the stage syncs no experts."""
    k = b.stage_constants[i]
    messages = {q: expert_dp_messages(b.inst, b.template, k, q).get(kind, 0.0) for q in qs}
    return sync_time(b, i, groups, kind, messages, name, "edp", "P15")


def symmetric_unit(tpl) -> int:
    """(P13) Ranks per interchangeable unit of a stage: permuting whole units (in every stage at once) keeps the
    dp, cp, tp groups, the pipeline pairs and, with experts, the ep / etp groups (moved whole) and the edp
    groups (as sets), when a unit holds whole dp replicas (tp x cp ranks) and whole expert blocks (ep x etp ranks):
    the least common multiple of the two."""
    return math.lcm(tpl.tp * tpl.cp, tpl.ep * tpl.etp)


def symmetry_breaking(b) -> None:
    """(P13) Data-parallel replicas are interchangeable (permuting the dp coordinate everywhere keeps every
    group and every pipeline pair): order replicas by the class of their first rank in stage 0. Without
    data parallelism, order the tensor-parallel ranks of stage 0's first group the same way. Expert groups
    (mixture-of-experts) are kept only by permutations of whole units of replicas that hold whole expert blocks
    (`symmetric_unit`), so replicas are ordered unit by unit, and without such units not at all."""
    prog, c, tpl = b.prog, b.c, b.template
    grid = np.asarray(tpl.gpus).reshape(c.pp, c.dp, c.cp, c.tp)
    unit = symmetric_unit(tpl)
    # with replicas (dp_replicate > 1) only the replicas of one shard group are interchangeable (a permutation of
    # the dp coordinate must keep the shard groups and the replicate groups): those of the first
    units = c.tp * c.cp * c.dp // unit if c.dp_replicate == 1 else c.dp_shard
    leaders = [int(tpl.gpus[j * unit]) for j in range(units)] if units > 1 else \
        [int(grid[0, 0, 0, x]) for x in range(c.tp)] if c.tp > 1 and c.ep * c.etp == 1 else []
    for r, r2 in zip(leaders, leaders[1:]):
        terms = {}
        for u in range(len(prog.classes)):
            terms[prog.assign[(r, u)]] = terms.get(prog.assign[(r, u)], 0) + u
            terms[prog.assign[(r2, u)]] = terms.get(prog.assign[(r2, u)], 0) - u
        prog.add(terms, "<=", 0, "P13 symmetry")
