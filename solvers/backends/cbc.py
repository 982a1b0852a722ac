"""CBC through PuLP."""

from __future__ import annotations

import time

from solvers.backends import BackendResult


def available() -> bool:
    try:
        import pulp
        return pulp.PULP_CBC_CMD(msg=False).available()
    except Exception:  # pragma: no cover - a broken install is "unavailable"
        return False


def solve(program, time_limit_s: float | None = None, threads: int = 1, seed: int = 0) -> BackendResult:
    import pulp

    start = time.perf_counter()
    lp = pulp.LpProblem("plan", pulp.LpMinimize)
    cat = {"binary": pulp.LpBinary, "integer": pulp.LpInteger, "continuous": pulp.LpContinuous}
    xs = [pulp.LpVariable(f"v{i}", lowBound=lo, upBound=None if up == float("inf") else up, cat=cat[kind])
          for i, (kind, lo, up) in enumerate(zip(program.kinds, program.lower, program.upper))]
    lp += pulp.lpSum(c * xs[i] for i, c in program.objective.items()) + program.objective_constant
    for k, (terms, sense, rhs, _) in enumerate(program.rows):
        expr = pulp.lpSum(c * xs[i] for i, c in terms.items())
        lp += (expr >= rhs) if sense == ">=" else (expr <= rhs) if sense == "<=" else (expr == rhs), f"c{k}"
    options = [f"randomSeed {seed % (2 ** 31 - 1) + 1}", "randomCbcSeed 1"]
    solver = pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit_s, threads=threads, options=options,
                               gapRel=1e-9, gapAbs=0)
    try:
        lp.solve(solver)
    except (pulp.PulpSolverError, OSError) as exc:  # binary missing, not executable, killed without output
        return BackendResult("error", None, None, None, time.perf_counter() - start,
                             f"CBC failed: {str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}")
    scale = program.time_unit_s / program.objective_divisor
    status = pulp.LpStatus[lp.status]
    have = lp.sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible)
    values = [x.value() or 0.0 for x in xs] if have else None
    objective = pulp.value(lp.objective) * scale if have else None
    bound = None
    if status == "Optimal" and lp.sol_status == pulp.LpSolutionOptimal:
        result_status, bound = "optimal", objective
    elif have:
        result_status = "feasible"
        best_bound = getattr(lp, "bestBound", None)  # not exposed by every PuLP version
        bound = best_bound * scale if best_bound is not None else None
    elif status == "Infeasible":
        result_status = "infeasible"
    else:
        result_status = "timeout"
    return BackendResult(result_status, values, objective, bound, time.perf_counter() - start)
