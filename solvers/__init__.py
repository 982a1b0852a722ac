"""Ways to answer the planning problem. `solve(instance)` returns a `PlanResult`."""

from solvers.result import PlanResult, SolverReport
from solvers.solve import solve

__all__ = ["PlanResult", "SolverReport", "solve"]
