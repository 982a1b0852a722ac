"""The best layer partition for a fixed GPU map, solved exactly.

With the map fixed, every stage's time, exposed data-parallel sync, optimizer step and memory depend only on
its own layer count, and the pipeline send/receive chain not at all. So the evaluator, run once per layer
count q with every stage at q layers, tabulates t_i(q), E_i(q), opt_i(q) and whether q fits; a small
program over one-hot layer counts then minimises (C14) exactly:
    vpp m tau + sum_i t_i - tau + vpp (delta + opt) + const,  tau >= t_i, delta >= E_i, opt >= opt_i.
This is what makes an uneven split (Megatron's layout flag) pay: fewer layers where memory or links are
tight. Used for upper bounds in the search and for the plan of clusters beyond the exact program.

A model with dense and MoE layers (docs/moe.md (E1)): a stage's figures depend on its layer mix (n_d, n_m), so
they are tabulated per mix stage i can hold (the evaluator's `stage_estimate` with the map's links), and the
one-hots are over mixes linked to the arcs of the stages' ranges (docs/programs.md (P2b),
formulation/programs/layer_mix.py): the same objective, exact for the kinds as well.
"""

from __future__ import annotations

import dataclasses

from formulation.evaluate import evaluate, stage_estimate
from formulation.stage_links import stage_links
from formulation.physics import layer_kinds, v_schedules
from formulation.placement import Placement
from formulation.programs.layer_mix import mix_partition
from formulation.programs.mip import Program

from solvers import backends


def best_partition(instance, placement: Placement, solver: str = "cpsat", time_limit_s: float = 30.0
                   ) -> Placement | None:
    """`placement` with the partition that minimises the evaluator's time for its map (None if none fits,
    or if the backend finds no solution within the limit)."""
    L, pp, vpp = instance.model.num_layers, placement.pp, placement.vpp
    mixed = layer_kinds.is_mixed(instance.model)
    table, (chain, overhead, m) = (_mix_table if mixed else _count_table)(instance, placement)
    if any(not any(j == i for j, _ in table) for i in range(pp)):
        return None
    prog = Program()
    unit = prog.time_unit_s
    if mixed:
        lam = mix_partition(prog, instance.model, pp, vpp, {i: sorted(mix for j, mix in table if j == i)
                                                            for i in range(pp)})
    else:
        lam = {}
        for i in range(pp):
            options = sorted(q for j, q in table if j == i)
            for q in options:
                lam[(i, q)] = prog.var(f"lambda[{i},{q}]", "binary")
            prog.add({lam[(i, q)]: 1 for q in options}, "==", 1, "one layer count per stage")
        prog.add({v: q for (i, q), v in lam.items()}, "==", L, "all layers placed")
    tau, delta, opt = prog.var("tau"), prog.var("delta"), prog.var("opt")
    for i in range(pp):
        for var, column in ((tau, 0), (delta, 1), (opt, 2)):
            prog.add({var: 1, **{v: -table[(j, q)][column] / unit for (j, q), v in lam.items() if j == i}}, ">=", 0,
                     "slowest stage")
    prog.objective = {tau: vpp * m - 1, delta: vpp, opt: vpp}
    if placement.schedule == "zero_bubble":  # (S1), docs/programs.md (P12'): tau_Z - 2 sum_i W_i for (vpp m - 1) tau
        _zero_bubble_objective(prog, table, lam, vpp * m - 1, pp, tau)
    for i in range(pp):  # stage times as variables: CP-SAT scales time constants only inside time rows
        t_i = prog.var(f"t[{i}]")
        prog.add({t_i: 1, **{v: -table[(j, q)][0] / unit for (j, q), v in lam.items() if j == i}}, ">=", 0,
                 "stage time")
        prog.objective[t_i] = 1
    if placement.schedule in v_schedules.V_FAMILIES:  # (S3), docs/programs.md (P12'')
        _v_objective(prog, table, lam, m, placement)
    prog.objective_constant = vpp * (chain + overhead) / unit
    prog.objective_divisor = vpp
    prog.tighten_upper_bounds()
    out = backends.get(solver).solve(prog, time_limit_s=max(0.05, time_limit_s))
    if out.values is None:
        return None
    layers = tuple(next(q for (j, q), v in lam.items() if j == i and out.values[v] > 0.5) for i in range(pp))
    return dataclasses.replace(placement, layers_per_stage=tuple(getattr(q, "total", q) for q in layers))


def _zero_bubble_objective(prog: Program, table: dict, lam: dict, weight: int, pp: int, tau: int) -> None:
    """vpp T = max_i [(vpp m - 1) t_i + 2 W_i] + sum_j (t_j - 2 W_j): tau_Z above every stage's bracket, each W_i
    a variable fixed by its row (the stages' types may differ, so sum W is no constant here)."""
    unit = prog.time_unit_s
    prog.objective.pop(tau)
    tau_z = prog.var("tauZ")
    prog.objective[tau_z] = 1
    for i in range(pp):
        rows = {v: table[(j, q)] for (j, q), v in lam.items() if j == i}
        prog.add({tau_z: 1, **{v: -(weight * row[0] + 2 * row[3]) / unit for v, row in rows.items()}}, ">=", 0,
                 "zero-bubble critical stage")
        w_i = prog.var(f"W[{i}]")
        prog.add({w_i: 1, **{v: -row[3] / unit for v, row in rows.items()}}, "==", 0, "weight gradient")
        prog.objective[w_i] = -2


def _v_objective(prog: Program, table: dict, lam: dict, m: int, placement: Placement) -> None:
    """(S3) D P >= every row (formulation/physics/v_schedules.py) over the stages' tabled (t, F, W), linear in the
    one-hot layer counts; P replaces tau and the stage sum in the objective."""
    pp, unit = placement.pp, prog.time_unit_s
    D, pipe = v_schedules.scale(pp), prog.var("P")
    for name in [v for v in list(prog.objective) if v != pipe]:
        if prog.names[name].startswith(("tau", "t[")):
            prog.objective.pop(name)
    for k in range(pp):
        for alpha, gamma in v_schedules.model_rows(placement.schedule, pp):
            terms = {pipe: D}
            for (i, q), v in lam.items():
                c, row = (alpha if i == k else gamma), table[(i, q)]
                t, f, w = row[0], row[4], row[3]
                value = (D * m * t if i == k else 0.0) + c[0] * f + c[1] * (t - f - w) + c[2] * w
                terms[v] = terms.get(v, 0.0) - value / unit
            prog.add(terms, ">=", 0, "V schedule row")
    prog.objective[pipe] = placement.vpp


def _count_table(instance, placement: Placement) -> tuple[dict, tuple]:
    """{(stage, q): (time, exposed dp sync, optimizer)} for every layer count q that fits, from the evaluator
    run with every stage at q layers; (chain, overhead, micro-batches), which the partition does not change."""
    L, pp, vpp = instance.model.num_layers, placement.pp, placement.vpp
    table = {}
    for q in range(vpp, L - vpp * (pp - 1) + 1, vpp):
        est = evaluate(instance, dataclasses.replace(placement, layers_per_stage=(q,) * pp), check=False)
        for s in est.stages:
            if s.memory.fits:
                table[(s.stage, q)] = (s.time_per_micro_batch_s, s.dp_exposed_s, s.optimizer_s, s.weight_grad_s,
                                           s.forward_compute_s)
    return table, (est.breakdown["pp_comm_s"], est.breakdown["overhead_s"], est.num_micro_batches)


def _mix_table(instance, placement: Placement) -> tuple[dict, tuple]:
    """`_count_table` per layer mix stage i can hold (docs/moe.md (E1)): the evaluator's stage functions on the
    map's links (which the partition does not change), one stage_estimate per (stage, mix)."""
    model, pp, vpp = instance.model, placement.pp, placement.vpp
    table = {}
    for i in range(pp):
        links = stage_links(instance, placement, i)
        for mix in layer_kinds.possible_mixes(model, pp, vpp, i):
            s = stage_estimate(instance, placement, i, mix.total, links, mix)
            if s.memory.fits:
                table[(i, mix)] = (s.time_per_micro_batch_s, s.dp_exposed_s, s.optimizer_s, s.weight_grad_s,
                                           s.forward_compute_s)
    est = evaluate(instance, placement, check=False)
    return table, (est.breakdown["pp_comm_s"], est.breakdown["overhead_s"], est.num_micro_batches)
