"""The strategy choice: which search answers an instance (exact program, bound-only search, annealing, the
Megatron-style defaults, or the composition search for mixed GPU types)."""

from __future__ import annotations

import time

from formulation.errors import InputError
from formulation.space import node_gpu_types
from solvers import backends
from solvers.result import PlanResult, SolverReport
from solvers.bounds.every_placement import every_placement_bound
from solvers.search.baseline import best_default
from solvers.search.driver import closing_status
from solvers.search.islands import solve_composed
from solvers.search.uniform import ANNEAL_MOVES, AUTO_PROGRAM_LIMIT_S, MAX_EXACT_SIZE, exact_is_tractable, search


METHODS = ("auto", "exact", "bound-only", "anneal", "baseline")
BACKENDS = ("auto", "cbc", "cpsat")
EVERY_PLACEMENT_SHARE = 0.2  # of a time limit: (B5) for the bound-only and anneal methods on several GPU types
# `--solver` of earlier releases mixed methods and backends; each value names one (method, backend) pair.
SOLVER_ALIASES = {"auto": ("auto", "auto"), "cbc": ("auto", "cbc"), "cpsat": ("auto", "cpsat"),
                  "anneal": ("anneal", "auto"), "baseline": ("baseline", "auto")}


def is_mixed(instance) -> bool:
    """More than one GPU type: planned as islands composed into pipelines (solvers/search/mixed.py)."""
    return len(node_gpu_types(instance.cluster)) > 1


def strategy(solver: str | None = None, method: str = "auto", backend: str = "auto") -> tuple[str, str]:
    """The (method, backend) pair asked for; `solver` is the older single-name spelling."""
    if solver is not None:
        if solver not in SOLVER_ALIASES:
            raise ValueError(f"unknown solver {solver!r}; expected one of {', '.join(SOLVER_ALIASES)}")
        method, backend = SOLVER_ALIASES[solver]
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; expected one of {', '.join(METHODS)}")
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; expected one of {', '.join(BACKENDS)}")
    return method, backend


def solve(instance, solver: str | None = None, time_limit: float | None = None, threads: int = 1, seed: int = 0,
          top: int = 1, progress=None, anneal_moves: int | None = -1, objective: str = "time",
          required_tokens_per_s: float | None = None, method: str = "auto", backend: str = "auto") -> PlanResult:
    """Plan `instance`.

    method: "auto" (the exact program where the cluster is small enough to prove, else the bound-only search),
    "exact" (the exact program per configuration inside the bound-and-prune search: status "optimal" with a
    proof over the whole configuration space when it finishes; refused beyond the exact program's reach),
    "bound-only" (default GPU maps with exactly solved layer partitions, annealed placements for the best
    configurations and the proven global lower bound), "anneal" (simulated annealing of the best default
    placements, with the global lower bound) or "baseline" (Megatron-style defaults, no bound).
    backend: "cbc", "cpsat", or "auto" (CP-SAT, and CBC for an exact program CP-SAT has not closed in 5 s; the one
    installed if the other is not; with method auto and no time limit, each program also gets a per-program
    limit). solver: the older name for a (method, backend) pair.
    anneal_moves: proposals per annealed configuration; None: the time left before `time_limit`, shared among
    them, with a clock-driven cooling schedule; -1 (default): None when a time limit is given (a budget is
    there to be used), else ANNEAL_MOVES (deterministic per seed).
    """
    start = time.perf_counter()
    method, backend = strategy(solver, method, backend)
    automatic = method == "auto" and backend == "auto"
    if method in ("auto", "exact") and (is_mixed(instance) or objective != "time"):
        return solve_composed(instance, solver=backend, time_limit=time_limit, threads=threads, seed=seed, top=top,
                              progress=progress, objective=objective, required_tokens_per_s=required_tokens_per_s)
    if objective != "time":
        raise ValueError(f"objective {objective!r} needs the composition search (method auto or exact)")
    if method == "baseline":
        return _baseline_plan(instance, top, progress, seed, start)
    annealing = method == "anneal"
    tractable = exact_is_tractable(instance)
    if method == "exact" and not tractable:
        raise InputError(instance.source, "--method", f"exact: {instance.cluster.num_gpus} GPUs x "
                         f"{len(instance.cluster.uniform_classes())} GPU classes exceeds the exact program's reach "
                         f"({MAX_EXACT_SIZE}); use method auto or bound-only")
    # Beyond the exact program's reach the chosen backend solves the partition programs of the bound-only
    # search instead (solvers/local/partition.py), and annealing polishes the best placements: asking for a backend
    # never means waiting for a program that cannot finish. "anneal" anneals the default placements only.
    exact = tractable and method in ("auto", "exact")
    backend = _program_backend(backend, exact)
    moves = anneal_moves if anneal_moves != -1 else None if time_limit else ANNEAL_MOVES
    every = _every_placement(instance, start, time_limit) if is_mixed(instance) else None  # first: see _claim
    left = None if time_limit is None else max(0.05, time_limit - (time.perf_counter() - start))  # after setup
    found = search(instance, solver=backend, time_limit_s=left, threads=threads, seed=seed, top=max(1, top),
                   progress=progress, exact=exact, refine=not annealing, anneal_moves=0 if exact else moves,
                   program_limit_s=AUTO_PROGRAM_LIMIT_S if automatic and time_limit is None else None)
    best = found.ranked[0]
    objective = best.estimate.iteration_time_s
    bound, status, claim = _claim(found, objective, every)
    method, note = _search_note(instance, found, method, backend, exact, tractable, moves, seed, time_limit)
    gap = (objective - bound) / objective
    report = SolverReport(method=method, status=status, objective_s=objective,
                          bound_s=bound, gap=max(0.0, gap), wall_time_s=time.perf_counter() - start,
                          seed=seed, note=note + claim)
    default = found.best_default
    return PlanResult(placement=best.placement, estimate=best.estimate, solver=report,
                      alternatives=[(c.placement, c.estimate) for c in found.ranked[1:]],
                      examined=found.examined, fitting=len(found.ranked),
                      default=default.megatron if default else None, history=found.history)


def _claim(found, objective: float, every: float | None) -> tuple[float, str, str]:
    """The bound, the status and what the note adds. On several GPU types the bound is (B5) over every placement
    (`every`): the search's own (B1, B2) prices each term at one type, and across types none is fastest at
    everything, so it may exceed a placement that mixes types. B5 is computed before the search, so that a time
    limit cannot leave it no time."""
    if every is None:
        return found.bound_s, found.status, ""
    closed = closing_status(objective, every, "")[1]
    status = closed if closed == "optimal" or found.status == "optimal" else found.status
    return every, status, (f"; on several GPU types the bound is (B5) over every placement (the search's own: "
                           f"{found.bound_s:.6g})")


def _every_placement(instance, start: float, time_limit: float | None) -> float:
    """(B5) in seconds, within a fifth of the time limit (a deadline leaves it valid, only weaker)."""
    deadline = start + EVERY_PLACEMENT_SHARE * time_limit if time_limit else float("inf")
    return every_placement_bound(instance, lambda config, time_s: time_s, float("inf"), deadline)


def _program_backend(backend: str, exact: bool) -> str:
    """The backend the search's programs get. `auto`: CP-SAT, which closes most exact programs several times faster
    than CBC (tests/test_exact.py instances: 2.6 s vs 14 s on the slowest), with CBC for those it has not closed
    quickly (its heavy tail, solvers/backends/portfolio.py), or the one installed; the bound-only search solves only
    partition programs (one map's layer split: small, closed by CP-SAT or ended by their time box) and keeps CP-SAT."""
    if backend != "auto":
        return backend
    chosen = backends.automatic()
    return "cpsat" if chosen == backends.PORTFOLIO and not exact else chosen


def _baseline_plan(instance, top: int, progress, seed: int, start: float) -> PlanResult:
    """The best Megatron-style default placement over all configurations: no bound is claimed."""
    result = best_default(instance, top=max(1, top), progress=progress)
    best = result.best[0]
    report = SolverReport(method="megatron-default-sweep", status="feasible",
                          objective_s=best.estimate.iteration_time_s, bound_s=None, gap=None,
                          wall_time_s=time.perf_counter() - start, seed=seed,
                          note=f"best default placement over all configurations, no optimality bound; "
                               f"{result.examined} configurations examined, {result.fitting} fit")
    return PlanResult(placement=best.placement, estimate=best.estimate, solver=report,
                      alternatives=[(r.placement, r.estimate) for r in result.best[1:]],
                      examined=result.examined, fitting=result.fitting, default=(best.placement, best.estimate))


def _search_note(instance, found, method: str, backend: str, exact: bool, tractable: bool, moves, seed: int,
                 time_limit: float | None) -> tuple[str, str]:
    """The report's method name and the sentence that says what the search did and how it stopped."""
    moves_text = f"{moves} moves" if moves else "the time left"
    if exact:
        method = f"exact-{backend}"
        note = (f"{found.examined} configurations solved exactly or tried, {found.pruned} pruned by bound, "
                f"{found.infeasible} do not fit")
        if found.examined == 0:
            note = (f"the best default placement already meets the proven lower bound of every configuration: no "
                    f"program needed; {found.pruned} pruned by bound, {found.infeasible} do not fit")
    elif method == "anneal":
        method = "anneal"
        note = (f"simulated annealing ({found.annealed} anneals) of the default placements of the best of "
                f"{found.candidates} configurations that fit, then of those whose bound beats the incumbent ({moves_text} each, seed {seed}), and the global lower bound of "
                f"all of them")
    else:
        method = f"bound-only-{backend}"
        reach = ("" if not tractable else "bound-only asked for: ") + (
            f"{instance.cluster.num_gpus} GPUs x {len(instance.cluster.uniform_classes())} GPU classes "
            + ("exceeds" if not tractable else "is within") + f" the exact program's reach ({MAX_EXACT_SIZE})")
        note = (f"{reach}: default GPU maps with exactly optimised layer "
                f"partitions for the {found.examined} most promising of {found.candidates} configurations that "
                f"fit, {found.annealed} annealed placements ({moves_text}; {found.gap_annealed} of them "
                f"of configurations whose bound beats the incumbent, in bound order), and the global "
                f"lower bound of all of them")
        if found.status == "optimal" and not found.stopped:  # close_gap.settled: no anneal once the bound meets it
            note += "; the bound meets the plan, so the search ended there"
    if found.stopped == "interrupted":
        note += "; interrupted (Ctrl-C): the best plan so far, the bound proven so far"
    elif found.stopped == "time limit":
        note += f"; stopped by the time limit ({time_limit:g} s)"
    if found.errors:
        note += (f"; {len(found.errors)} configuration(s) left unproven (solver failure or auto's per-program "
                 f"limit), each keeping the bound it reached: "
                 f"{found.errors[0]}")
    return method, note
