"""Ways to answer the planning problem. `solve(instance)` returns a `PlanResult`."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from formulation.evaluate import Estimate
from formulation.placement import Placement


@dataclass
class SolverReport:
    method: str
    status: str  # "optimal", "feasible", "infeasible", "timeout"
    objective_s: float | None
    bound_s: float | None
    gap: float | None
    wall_time_s: float
    seed: int
    note: str = ""

    def to_dict(self) -> dict:
        return {"method": self.method, "status": self.status, "objective_s": self.objective_s,
                "bound_s": self.bound_s, "gap": self.gap, "wall_time_s": self.wall_time_s, "seed": self.seed,
                "note": self.note}


@dataclass
class PlanResult:
    placement: Placement
    estimate: Estimate
    solver: SolverReport
    alternatives: list = field(default_factory=list)  # (placement, estimate) of the next-best configurations
    examined: int = 0
    fitting: int = 0

    def to_dict(self, cluster) -> dict:
        out = {"placement": self.placement.to_dict(cluster), "estimate": self.estimate.to_dict(),
               "solver": self.solver.to_dict()}
        if self.alternatives:
            out["alternatives"] = [{"placement": p.to_dict(cluster), "estimate": e.to_dict()}
                                   for p, e in self.alternatives]
        return out


def solve(instance, solver: str = "baseline", time_limit: float | None = None, threads: int = 1, seed: int = 0,
          top: int = 1, progress=None) -> PlanResult:
    """Plan `instance`. Today's method: the Megatron-style default placement over every configuration
    (status "feasible": it is optimal only among default placements, so no bound is claimed)."""
    import time

    from .baseline import best_default

    if solver not in ("baseline", "auto"):
        raise ValueError(f"solver {solver!r} is not available yet; use 'baseline' or 'auto'")
    start = time.perf_counter()
    result = best_default(instance, top=max(1, top), progress=progress)
    best = result.best[0]
    report = SolverReport(method="megatron-default-sweep", status="feasible",
                          objective_s=best.estimate.iteration_time_s, bound_s=None, gap=None,
                          wall_time_s=time.perf_counter() - start, seed=seed,
                          note="best default placement over all configurations; no optimality bound")
    return PlanResult(placement=best.placement, estimate=best.estimate, solver=report,
                      alternatives=[(r.placement, r.estimate) for r in result.best[1:]],
                      examined=result.examined, fitting=result.fitting)


def write_json_atomic(path: str | Path, data: dict) -> None:
    """Write JSON through a temporary file in the same directory and rename it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(data, handle, indent=2)
            handle.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
