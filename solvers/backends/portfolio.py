"""CP-SAT first, then CBC for a program CP-SAT has not closed within FIRST_TRY_S: the backend `auto` picks when both
are installed.

CP-SAT closes most programs several times faster than CBC (median 0.2-0.5 s against 1.5-3 s per search on the
brute-force families of tests/test_exact.py and tests/test_oneway_uneven.py), but it has a heavy tail that CBC
does not: of 167 searches of seeds the tests do not use (1000-1126 and one-way 100-139), four were not closed by
CP-SAT within their 60 s (one-way 120 s), where CBC proved each in 17-37 s; on one-way seed 111 `solve` ended
after 138 s at a gap of 8.4 %, two programs unclosed, where CBC alone proves the optimum in 27 s. A program CP-SAT
has not closed in FIRST_TRY_S (the tail, not the median) goes to CBC for the rest of its time limit: the 167
searches then all close, the slowest in 22 s instead of 132 s (docs/programs.md).

One contract with the other backends (solvers/backends/__init__.py). A proof comes only from a backend that
proves (its own status), infeasibility likewise; without one, the better of the two solutions and the larger of
the two bounds (each a valid lower bound of the same program) are returned. Which backend answered is in the
message. The switch is by the clock: on a loaded machine a program may go to CBC that CP-SAT would have closed,
and where a configuration has tied optima the plan may differ; its time does not. CP-SAT's deterministic time
would not make it load-independent at no cost: over test_exact's seeds 0-11 (531 programs) it runs at 0.03-0.15
deterministic seconds per wall second (10th-90th percentile), and its known stall (seed 6) heeds neither limit,
so a deterministic first try still needs a wall cap, a generous one, which would delay CBC on exactly the
programs it is there for; one program in 531 takes the 1-5 s that a loaded machine can push past FIRST_TRY_S.
"""

from __future__ import annotations

import time

from solvers.backends import PORTFOLIO, BackendResult, cbc, cpsat

NAME = PORTFOLIO
# CP-SAT's share of a program before CBC takes it: most programs close in well under a second (a whole search of
# a brute-force instance is 0.2-0.5 s at the median, 1.5-15 s at the 90th percentile, over its 5-20 programs)
FIRST_TRY_S = 5.0
# CBC is not started with less time than this left (its start alone writes and reads the model's files)
MIN_SECOND_TRY_S = 0.5
DECISIVE = ("optimal", "infeasible")


def available() -> bool:
    return cpsat.available() and cbc.available()


def solve(program, time_limit_s: float | None = None, threads: int = 1, seed: int = 0) -> BackendResult:
    """The backend contract (module docstring)."""
    start = time.perf_counter()
    first_limit = FIRST_TRY_S if time_limit_s is None else min(FIRST_TRY_S, time_limit_s)
    first = cpsat.solve(program, time_limit_s=first_limit, threads=threads, seed=seed)
    if first.status in DECISIVE:
        return first
    left = None if time_limit_s is None else time_limit_s - (time.perf_counter() - start)
    if left is not None and left < MIN_SECOND_TRY_S:
        return _combined(first, None, start)
    second = cbc.solve(program, time_limit_s=left, threads=threads, seed=seed)
    if second.status in DECISIVE:
        return BackendResult(second.status, second.values, second.objective_s, second.bound_s,
                             time.perf_counter() - start, _said(first, second))
    return _combined(first, second, start)


def _combined(first: BackendResult, second: BackendResult | None, start: float) -> BackendResult:
    """Neither proved: the better solution of the two and the larger bound."""
    runs = [r for r in (first, second) if r is not None]
    solved = [r for r in runs if r.values is not None]
    bounds = [r.bound_s for r in runs if r.bound_s is not None]
    message = _said(first, second)
    if not solved:
        errors = [r for r in runs if r.status == "error"]
        status = "error" if len(errors) == len(runs) else "timeout"
        return BackendResult(status, None, None, max(bounds) if bounds else None, time.perf_counter() - start,
                             message)
    best = min(solved, key=lambda r: r.objective_s)
    bound = max(bounds) if bounds else None
    return BackendResult("feasible", best.values, best.objective_s,
                         None if bound is None else min(bound, best.objective_s), time.perf_counter() - start,
                         message)


def _said(first: BackendResult, second: BackendResult | None) -> str:
    parts = [f"CP-SAT {first.status} after {first.wall_time_s:.3g} s" + (f" ({first.message})" if first.message
                                                                       else "")]
    if second is not None:
        parts.append(f"then CBC {second.status} after {second.wall_time_s:.3g} s"
                     + (f" ({second.message})" if second.message else ""))
    return "; ".join(parts)
