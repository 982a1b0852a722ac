"""OR-Tools CP-SAT.

CP-SAT takes integers only. Time variables are in the program's unit (1 us); here they are scaled by
10^e so that the largest time constant of the program becomes at most 1e9 integer units (e chosen per
program, at most 6, i.e. picoseconds), and every time constant is rounded to the nearest unit. Larger
magnitudes overflow CP-SAT's presolve (it multiplies coefficients when it substitutes equalities and then
reports a feasible model infeasible: seen at 1e10). Rounding moves each constraint by half a unit, about
1e-9 of the largest constant; the objective therefore matches the exact program to about 1e-7 relative,
and the plan's reported time is the evaluator's anyway. Count and capacity coefficients are integers
already.
"""

from __future__ import annotations

import math
import time

from solvers.backends import BackendResult

MAX_SCALED_CONSTANT = 1e9
# Stop once the incumbent is proven within this fraction of the bound (the exact program itself is
# exact; this only ends the proof at a resolution far below any difference between plans).
RELATIVE_GAP = 1e-8


def time_scale(program) -> int:
    """Integer units per program time unit: 10^e with the largest time constant <= MAX_SCALED_CONSTANT.

    Constants are the right-hand sides and the coefficients of binaries in rows with time variables: what
    presolve multiplies. The time variables' upper bounds are domains, not coefficients (unbounded ones get
    100 x MAX_SCALED_CONSTANT anyway); counting them made the slowest link of a cluster set the resolution
    (0.6 GB/s pairs: 10 ns, objective a few 1e-6 off the evaluator)."""
    cont = [k == "continuous" for k in program.kinds]
    largest = 1.0
    for terms, _, rhs, _ in program.rows:
        if any(cont[i] for i in terms):
            largest = max(largest, abs(rhs), *(abs(c) for i, c in terms.items() if not cont[i]))
    return int(10 ** max(0, min(6, math.floor(math.log10(MAX_SCALED_CONSTANT / largest)))))


def available() -> bool:
    try:
        from ortools.sat.python import cp_model  # noqa: F401
        return True
    except Exception:  # pragma: no cover
        return False


def solve(program, time_limit_s: float | None = None, threads: int = 1, seed: int = 0) -> BackendResult:
    from ortools.sat.python import cp_model

    start = time.perf_counter()
    model = cp_model.CpModel()
    scale = time_scale(program)
    big = int(MAX_SCALED_CONSTANT * 100)
    xs = []
    for i, (kind, lo, up) in enumerate(zip(program.kinds, program.lower, program.upper)):
        if kind == "continuous":  # times in ps
            xs.append(model.NewIntVar(math.floor(lo * scale), big if up == float("inf") else math.ceil(up * scale),
                                      f"v{i}"))
        else:
            xs.append(model.NewIntVar(int(lo), int(up), f"v{i}"))
    cont = [k == "continuous" for k in program.kinds]

    def coefficient(i: int, c: float, time_row: bool) -> int:
        # a time variable keeps its (integer) coefficient; a binary/integer multiplies a time constant
        if cont[i]:
            return int(round(c))
        return int(round(c * scale)) if time_row else int(round(c))

    for terms, sense, rhs, _ in program.rows:
        time_row = any(cont[i] for i in terms)
        expr = sum(coefficient(i, c, time_row) * xs[i] for i, c in terms.items())
        r = int(round(rhs * scale)) if time_row else int(round(rhs))
        model.Add(expr >= r) if sense == ">=" else model.Add(expr <= r) if sense == "<=" else model.Add(expr == r)
    model.Minimize(sum(int(round(c)) * xs[i] for i, c in program.objective.items()))
    solver = cp_model.CpSolver()
    if time_limit_s is not None:
        solver.parameters.max_time_in_seconds = float(time_limit_s)
    solver.parameters.num_workers = max(1, threads)
    solver.parameters.random_seed = seed
    solver.parameters.relative_gap_limit = RELATIVE_GAP
    solver.parameters.linearization_level = 2  # the program is LP-shaped: full linearization closes it fast
    code = solver.Solve(model)
    unit = program.time_unit_s / scale / program.objective_divisor
    constant = program.objective_constant * program.time_unit_s / program.objective_divisor
    if code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        values = [solver.Value(x) / scale if cont[i] else solver.Value(x) for i, x in enumerate(xs)]
        objective = solver.ObjectiveValue() * unit + constant
        bound = solver.BestObjectiveBound() * unit + constant
        status = "optimal" if code == cp_model.OPTIMAL else "feasible"
        return BackendResult(status, values, objective, bound, time.perf_counter() - start)
    if code == cp_model.MODEL_INVALID:
        return BackendResult("error", None, None, None, time.perf_counter() - start,
                             f"CP-SAT rejected the model: {model.Validate() or 'MODEL_INVALID'}")
    # UNKNOWN: no solution and no proof within the limit
    status = "infeasible" if code == cp_model.INFEASIBLE else "timeout"
    return BackendResult(status, None, None, None, time.perf_counter() - start)
