"""Thin solver adapters with one contract: `solve(program, time_limit_s, threads, seed) -> BackendResult`."""

from __future__ import annotations

from dataclasses import dataclass

# the name of CP-SAT with CBC for the programs it does not close quickly (solvers/backends/portfolio.py)
PORTFOLIO = "cpsat+cbc"
# a solve still running this long after its time limit is given up (CP-SAT's watched thread, CBC's guard)
OVERRUN_GRACE_S = 0.5


def overrun_grace(time_limit_s: float) -> float:
    """How far past its limit a solve may go before it is given up: OVERRUN_GRACE_S, or a tenth of a long limit."""
    return max(OVERRUN_GRACE_S, 0.1 * time_limit_s)


def given_up(solver: str, time_limit_s: float, grace_s: float, wall_time_s: float) -> BackendResult:
    """A run still going `grace_s` after its limit, given up: a timeout without values, so no claim rests on it."""
    return BackendResult("timeout", None, None, None, wall_time_s, f"{solver} passed its {time_limit_s:.3g} s limit "
                         f"by more than {grace_s:.3g} s without stopping; given up")


@dataclass
class BackendResult:
    status: str  # "optimal", "feasible", "infeasible", "timeout" (no solution within the limit), "error"
    values: list[float] | None  # one value per program variable
    objective_s: float | None  # the program's objective in seconds
    bound_s: float | None  # best proven lower bound in seconds
    wall_time_s: float
    message: str = ""  # what went wrong: status "error" (solver missing, killed, model rejected), or a run given up


def available() -> dict[str, bool]:
    from solvers.backends import cbc, cpsat
    return {"cbc": cbc.available(), "cpsat": cpsat.available()}


def get(name: str):
    from solvers.backends import cbc, cpsat, portfolio
    return {"cbc": cbc, "cpsat": cpsat, PORTFOLIO: portfolio}[name]


def automatic() -> str:
    """The backend `auto` stands for: CP-SAT with CBC for the programs it does not close quickly
    (solvers/backends/portfolio.py) when both are installed, else whichever is."""
    have = available()
    if have["cpsat"] and have["cbc"]:
        return PORTFOLIO
    return "cpsat" if have["cpsat"] else "cbc"
