"""What a search returns: the plan (placement + estimate) and the solver's report (the public plan contract)."""

from __future__ import annotations

from dataclasses import dataclass, field

from formulation.evaluate import Estimate
from formulation.intervals import intervals_overlap
from formulation.mfu_ceiling import mfu_check
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
    objective: str = "time"  # what was minimised: time (s per iteration), cost (price per million tokens), gpus
    objective_value: float | None = None  # in the objective's unit (= objective_s for time)
    bound_value: float | None = None
    islands: list = field(default_factory=list)  # mixed clusters: per island what it is, what it hosts, why idle

    def to_dict(self) -> dict:
        out = {"method": self.method, "status": self.status, "objective_s": self.objective_s,
               "bound_s": self.bound_s, "gap": self.gap, "wall_time_s": self.wall_time_s, "seed": self.seed,
               "note": self.note, "objective": self.objective}
        if self.objective != "time":
            out["objective_value"], out["bound_value"] = self.objective_value, self.bound_value
        if self.islands:
            out["islands"] = self.islands
        return out


@dataclass
class PlanResult:
    placement: Placement
    estimate: Estimate
    solver: SolverReport
    alternatives: list = field(default_factory=list)  # (placement, estimate) of the next-best configurations
    examined: int = 0
    fitting: int = 0
    default: tuple | None = None  # (placement, estimate) of the fastest Megatron-style default placement
    history: list = field(default_factory=list)  # (seconds since the search began, best time) at each improvement
    # beyond the searched space, scored but not covered by the bound (solvers/local/block_recompute.py)
    hints: list = field(default_factory=list)
    # what the terminal and report.html warn of (solvers/outputs/plan_notes.py, report.py), and the user
    # calibration applied (UserCalibration.to_dict()), so that the plan file says them too
    warnings: list = field(default_factory=list)
    calibration: dict | None = None

    def to_dict(self, cluster) -> dict:
        out = {"placement": self.placement.to_dict(cluster), "estimate": self.estimate.to_dict(),
               "solver": self.solver.to_dict()}
        if self.alternatives:
            mine = self.estimate.iteration_time_interval_s
            out["alternatives"] = [{"placement": p.to_dict(cluster), "estimate": e.to_dict(),
                                    "tie_with_best": intervals_overlap(mine, e.iteration_time_interval_s)}
                                   for p, e in self.alternatives]
        if self.hints:
            out["hints"] = self.hints
        return with_caveats(with_plausibility(out, cluster, self.estimate), self.warnings, self.calibration)


def with_plausibility(plan: dict, cluster, estimate) -> dict:
    """A plan file's dict with the estimate's MFU against the highest published for its GPU type and precision."""
    check = mfu_check(cluster, estimate)
    if check is not None:
        plan["plausibility"] = check.to_dict()
    return plan


def with_caveats(plan: dict, warnings: list, calibration: dict | None) -> dict:
    """A plan file's dict with its `warnings` and the `calibration` applied, where there are any."""
    if warnings:
        plan["warnings"] = list(warnings)
    if calibration is not None:
        plan["calibration"] = calibration
    return plan
