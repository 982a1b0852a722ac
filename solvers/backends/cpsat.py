"""OR-Tools CP-SAT.

CP-SAT takes integers only. Time variables are in the program's unit (1 us); here they are scaled by the
largest integer (at most 10^6, i.e. picoseconds) that keeps the largest time constant of the program at most
1e9 integer units, and every time constant is rounded to the nearest unit. Larger
magnitudes overflow CP-SAT's presolve (it multiplies coefficients when it substitutes equalities and then
reports a feasible model infeasible: seen at 1e10). Rounding moves each constraint by half a unit, about
1e-9 of the largest constant (an equation's right-hand side goes to the nearest multiple of its coefficients'
common divisor, which it must be to have a solution); the objective therefore matches the exact program to about
1e-7 relative, and the plan's reported time is the evaluator's anyway. Count and capacity coefficients are
integers already.
"""

from __future__ import annotations

import math
import os
import threading
import time

from solvers.backends import BackendResult, given_up, overrun_grace

MAX_SCALED_CONSTANT = 1e9
INF = float("inf")
# Stop once the incumbent is proven within this fraction of the bound (the exact program itself is
# exact; this only ends the proof at a resolution far below any difference between plans).
RELATIVE_GAP = 1e-8


def memory_limit_mb() -> int:
    """CP-SAT's memory cap per solve: a quarter of the machine's memory, at most 4 GiB. Its default (10 GB) lets two
    solves of one process (one given up and still running, one new) take 20 GB and the machine's OOM killer ends the
    process: a solve that reaches the cap stops as one out of time does (a bound and the best plan found)."""
    try:
        total_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1 << 20)
    except (ValueError, OSError, AttributeError):
        return 4096
    return int(max(512, min(4096, total_mb // 4)))
# the caller wakes this often while CP-SAT runs: Python raises KeyboardInterrupt in the main thread when it next
# runs bytecode, and a Ctrl-C signal that the kernel hands to another thread does not wake a blocked join
WAKE_S = 0.05


def time_scale(program) -> int:
    """Integer units per program time unit: the largest scale (at most 10^6) that keeps every time constant
    <= MAX_SCALED_CONSTANT.

    Constants are the right-hand sides and the coefficients of binaries in rows with time variables: what
    presolve multiplies. The time variables' upper bounds are domains, not coefficients (unbounded ones get
    100 x MAX_SCALED_CONSTANT anyway); counting them made the slowest link of a cluster set the resolution
    (0.6 GB/s pairs: 10 ns, objective a few 1e-6 off the evaluator)."""
    cont = [k == "continuous" for k in program.kinds]
    largest = 1.0
    for terms, _, rhs, _ in program.rows:
        if any(cont[i] for i in terms):
            largest = max(largest, abs(rhs), *(abs(c) for i, c in terms.items() if not cont[i]))
    # any integer will do, not only a power of ten: the finest that keeps the constants in range
    return max(1, min(10**6, math.floor(MAX_SCALED_CONSTANT / largest)))


def available() -> bool:
    try:
        from ortools.sat.python import cp_model  # noqa: F401
        return True
    except Exception:  # pragma: no cover
        return False


def solve(program, time_limit_s: float | None = None, threads: int = 1, seed: int = 0) -> BackendResult:
    """The backend contract. CP-SAT runs in a thread (its solve releases the GIL) that the caller watches:
    - Ctrl-C raises KeyboardInterrupt in the caller at once and stops the solve (CP-SAT's own SIGINT catching,
      which ended only the solve and let the search go on, is off);
    - with a time limit the solve is given up at the limit plus `overrun_grace`: some programs stall in one long
      search step that checks neither the wall-clock nor the deterministic limit (a 4-GPU program of
      tests/test_exact.py's seed 6 took 20 s under a 2 s limit, the steps after its last bound logged in none),
      and a time limit is a promise to the user. A run given up so is a timeout without values (the search
      keeps that program's bound, so every claim stays honest); its thread is asked to stop and left to end on
      its own, a daemon that cannot keep the process alive."""
    start = time.perf_counter()
    watch: dict = {"solving": threading.Event()}  # the thread's solver, then its result or error

    def run() -> None:
        try:
            watch["result"] = _solve_here(program, time_limit_s, threads, seed, watch)
        except BaseException as exc:  # re-raised in the caller's thread
            watch["error"] = exc
        finally:
            watch["solving"].set()

    worker = threading.Thread(target=run, name="cp-sat", daemon=True)
    worker.start()
    try:  # CP-SAT's clock starts at its solve, after the model is built (seconds for the largest programs)
        while not watch["solving"].wait(WAKE_S):
            pass
        given_up_at = INF if time_limit_s is None else time.perf_counter() + time_limit_s + overrun_grace(time_limit_s)
        while worker.is_alive() and time.perf_counter() < given_up_at:
            worker.join(max(0.0, min(WAKE_S, given_up_at - time.perf_counter())))
    except KeyboardInterrupt:  # Ctrl-C reaches Python (CP-SAT does not catch it here): the search ends
        _stop(watch)
        raise
    if worker.is_alive():
        _stop(watch)
        return given_up("CP-SAT", time_limit_s, overrun_grace(time_limit_s), time.perf_counter() - start)
    if "error" in watch:
        raise watch["error"]
    return watch["result"]


def _stop(watch: dict) -> None:
    if "solver" in watch:
        watch["solver"].StopSearch()



def _set_parameters(parameters, time_limit_s: float | None, threads: int, seed: int) -> None:
    """CP-SAT's parameters for one solve of a program."""
    parameters.catch_sigint_signal = False  # Ctrl-C is the watching caller's to handle
    if time_limit_s is not None:
        parameters.max_time_in_seconds = float(time_limit_s)
    parameters.num_workers = max(1, threads)
    parameters.random_seed = seed
    parameters.relative_gap_limit = RELATIVE_GAP
    parameters.max_memory_in_mb = memory_limit_mb()
    parameters.linearization_level = 2  # the program is LP-shaped: full linearization closes it fast
    # probing at level 1 (CP-SAT's default: 2), the faster of the two on the test generators' 4-GPU programs. Before
    # (P7) lost its free direction (a ZeRO-3 exposure row with two rising time variables), CP-SAT's propagation walked
    # it a unit at a time on some ZeRO-3 programs under every setting tried (30 s to minutes, gigabytes, no limit
    # checked); without it each of them closes in well under a second at either level (docs/programs.md, Backends)
    parameters.cp_model_probing_level = 1


def _solve_here(program, time_limit_s: float | None, threads: int, seed: int, watch: dict) -> BackendResult:
    """One CP-SAT solve in the watched thread of `solve`: the solver goes in `watch` (to be stopped), and its
    "solving" event is set when the model is built."""
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
        coefficients = {i: coefficient(i, c, time_row) for i, c in terms.items()}
        expr = sum(c * xs[i] for i, c in coefficients.items())
        r = int(round(rhs * scale)) if time_row else int(round(rhs))
        if sense == "==" and time_row:  # coefficients with a common divisor g meet only a multiple of g: the nearest
            g = math.gcd(*coefficients.values()) or 1  # (2 u - 2 f - 2 b = an odd number of units has no
            # solution); rounding to the nearest multiple moves the row by at most g / 2 units, never cuts a solution
            r = g * round(rhs * scale / g)
        model.Add(expr >= r) if sense == ">=" else model.Add(expr <= r) if sense == "<=" else model.Add(expr == r)
    model.Minimize(sum(int(round(c)) * xs[i] for i, c in program.objective.items()))
    solver = cp_model.CpSolver()
    watch["solver"] = solver
    _set_parameters(solver.parameters, time_limit_s, threads, seed)
    watch["solving"].set()
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
