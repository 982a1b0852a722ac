"""The best layer partition for a fixed GPU map, solved exactly.

With the map fixed, every stage's time, exposed data-parallel sync, optimizer step and memory depend only on
its own layer count, and the pipeline send/receive chain not at all. So the evaluator, run once per layer
count q with every stage at q layers, tabulates t_i(q), E_i(q), opt_i(q) and whether q fits; a small
program over one-hot layer counts then minimises (C14) exactly:
    vpp m tau + sum_i t_i - tau + vpp (delta + opt) + const,  tau >= t_i, delta >= E_i, opt >= opt_i.
This is what makes an uneven split (Megatron's layout flag) pay: fewer layers where memory or links are
tight. Used for upper bounds in the search and for the plan of clusters beyond the exact program.
"""

from __future__ import annotations

import dataclasses

from formulation.evaluate import evaluate
from formulation.placement import Placement
from formulation.programs.mip import Program

from solvers import backends


def best_partition(instance, placement: Placement, solver: str = "cpsat", time_limit_s: float = 30.0
                   ) -> Placement | None:
    """`placement` with the partition that minimises the evaluator's time for its map (None if none fits,
    or if the backend finds no solution within the limit)."""
    L, pp, vpp = instance.model.num_layers, placement.pp, placement.vpp
    counts = [q for q in range(vpp, L - vpp * (pp - 1) + 1, vpp)]
    table = {}
    for q in counts:
        est = evaluate(instance, dataclasses.replace(placement, layers_per_stage=(q,) * pp), check=False)
        for s in est.stages:
            if s.memory.fits:
                table[(s.stage, q)] = (s.time_per_micro_batch_s, s.dp_exposed_s, s.optimizer_s)
        chain = est.breakdown["pp_comm_s"]
        overhead = est.breakdown["overhead_s"]
        m = est.num_micro_batches
    if any(not any((i, q) in table for q in counts) for i in range(pp)):
        return None
    prog = Program()
    unit = prog.time_unit_s
    lam = {}
    for i in range(pp):
        options = [q for q in counts if (i, q) in table]
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
    for i in range(pp):  # stage times as variables: CP-SAT scales time constants only inside time rows
        t_i = prog.var(f"t[{i}]")
        prog.add({t_i: 1, **{v: -table[(j, q)][0] / unit for (j, q), v in lam.items() if j == i}}, ">=", 0,
                 "stage time")
        prog.objective[t_i] = 1
    prog.objective_constant = vpp * (chain + overhead) / unit
    prog.objective_divisor = vpp
    prog.tighten_upper_bounds()
    out = backends.get(solver).solve(prog, time_limit_s=max(0.05, time_limit_s))
    if out.values is None:
        return None
    layers = tuple(next(q for (j, q), v in lam.items() if j == i and out.values[v] > 0.5) for i in range(pp))
    return dataclasses.replace(placement, layers_per_stage=layers)
