"""The exact program's objective under a zero-bubble schedule (docs/programs.md (P12'), docs/schedules.md (S1)):
vpp T = max_i [(vpp m - 1) t_i + 2 W_i] + sum_j (t_j - 2 W_j), W_i the stage's weight-gradient time (C15), linear
in its one-hot layer count and independent of the GPU map."""

from __future__ import annotations

from formulation.physics import v_schedules


def zero_bubble_objective(b, stage_time: list[int], tau: int, weight: int) -> None:
    """Replace (P12)'s (vpp m - 1) tau by tau_Z >= (vpp m - 1) t_i + 2 W_i for every stage i, and count
    -2 sum_j W_j, which is the same for every partition (each layer's W wherever it sits, the output layer's on the
    last stage), as a constant: CP-SAT takes time constants on binaries only inside rows. `b` is the exact
    program's builder (formulation/programs/exact.py), `weight` = vpp m - 1."""
    prog = b.prog
    prog.objective.pop(tau)
    tau_z = prog.var("tauZ")
    for i, t_i in enumerate(stage_time):
        terms = {tau_z: 1, t_i: -weight}
        k = b.stage_constants[i]
        for (stage, q), lam in prog.layers.items():
            if stage == i:
                terms[lam] = terms.get(lam, 0) - 2 * b.t(k.weight_grad(q))
        prog.add(terms, ">=", 0, "P12' zero-bubble critical stage")
    prog.objective[tau_z] = 1
    prog.objective_constant -= 2 * b.t(total_weight_grad(b))


def total_weight_grad(b) -> float:
    """(C15) sum_j W_j in seconds: every layer's weight-gradient GEMMs plus the output layer's."""
    model = b.inst.model
    out = sum(b.stage_constants[i].output_fwd for i in range(b.c.pp))
    k = b.stage_constants[0]
    if b.mixed:
        moe = model.moe.num_moe_layers
        return (model.num_layers - moe) * k.dense.matmul_fwd + moe * k.moe.matmul_fwd + out
    return model.num_layers * k.matmul_fwd + out


def v_objective(b, stage_time: list[int], tau: int, m: int) -> None:
    """(P12'') The V schedules (docs/schedules.md (S3)): a variable DP >= D m t_k + alpha . X_k +
    gamma . sum_{j != k} X_j for every stage k and row (formulation/physics/v_schedules.py), X = (F, B, W) with
    B = t - F - W, F the forward's compute and W the weight gradient (both linear in the one-hot layer count);
    DP / D replaces (P12)'s tau and stage sum (the objective is taken times D). The rows are the evaluator's
    (`v_schedules.model_rows`), none weighing a stage time negatively."""
    prog, pp = b.prog, b.c.pp
    D = v_schedules.scale(pp)
    pipe = prog.var("DP")  # D P: a unit coefficient in every row

    def add(terms: dict, var: int, coef: float) -> None:
        terms[var] = terms.get(var, 0) + coef

    for k in range(pp):
        for alpha, gamma in v_schedules.model_rows(b.c.schedule, pp):
            terms = {pipe: 1}
            for i, t_i in enumerate(stage_time):
                c = alpha if i == k else gamma
                add(terms, t_i, -(D * m if i == k else 0) - c[1])
                const = b.stage_constants[i]
                for (stage, q), lam in prog.layers.items():
                    if stage == i:
                        add(terms, lam, -(c[0] - c[1]) * b.t(const.window_f(q)) - (c[2] - c[1]) * b.t(const.weight_grad(q)))
            prog.add(terms, ">=", 0, "P12'' V schedule row")
    for t_i in stage_time:
        prog.objective.pop(t_i, None)
    prog.objective.pop(tau)
    prog.objective = {var: D * coef for var, coef in prog.objective.items()}  # the objective times D
    prog.objective[pipe] = b.c.vpp
    prog.objective_constant *= D
    prog.objective_divisor *= D
