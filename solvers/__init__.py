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

    def to_dict(self, cluster) -> dict:
        out = {"placement": self.placement.to_dict(cluster), "estimate": self.estimate.to_dict(),
               "solver": self.solver.to_dict()}
        if self.alternatives:
            out["alternatives"] = [{"placement": p.to_dict(cluster), "estimate": e.to_dict()}
                                   for p, e in self.alternatives]
        return out


def is_mixed(instance) -> bool:
    """More than one GPU type: planned as islands composed into pipelines (solvers/compose.py)."""
    return len({n.gpu_type for n in instance.cluster.nodes}) > 1


def solve(instance, solver: str = "auto", time_limit: float | None = None, threads: int = 1, seed: int = 0,
          top: int = 1, progress=None, anneal_moves: int | None = -1, objective: str = "time",
          required_tokens_per_s: float | None = None) -> PlanResult:
    """Plan `instance`.

    solver: "anneal" (simulated annealing of the best default placements, with the global lower bound),
    "cbc" or "cpsat" (exact program per configuration inside the bound-and-prune search; status
    "optimal" with a proof over the whole configuration space when it finishes), "auto" (CP-SAT, or CBC when
    OR-Tools is missing, where the cluster is small enough for the exact program; else the best default
    placement with the search's proven lower bound), or "baseline" (Megatron-style defaults, no bound).
    anneal_moves: proposals per annealed configuration; None: the time left before `time_limit`, shared among
    them, with a clock-driven cooling schedule; -1 (default): None when a time limit is given (a budget is
    there to be used), else ANNEAL_MOVES (deterministic per seed).
    """
    import time

    from . import backends
    from .baseline import best_default
    from .search import (
        ANNEAL_MOVES,
        AUTO_PROGRAM_LIMIT_S,
        MAX_EXACT_SIZE,
        exact_is_tractable,
        search,
    )

    start = time.perf_counter()
    if solver in ("auto", "cbc", "cpsat") and (is_mixed(instance) or objective != "time"):
        from .islands_plan import solve_composed
        return solve_composed(instance, solver=solver, time_limit=time_limit, threads=threads, seed=seed, top=top,
                              progress=progress, objective=objective, required_tokens_per_s=required_tokens_per_s)
    if objective != "time":
        raise ValueError(f"objective {objective!r} needs the composition search (--solver auto, cbc or cpsat)")
    if solver == "baseline":
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
    annealing, automatic = solver == "anneal", solver == "auto"
    if solver in ("auto", "anneal"):
        # CP-SAT closes these programs several times faster than CBC (tests/test_exact.py instances:
        # 2.6 s vs 14 s on the slowest); CBC when OR-Tools is missing
        solver = "cpsat" if backends.available()["cpsat"] else "cbc"
    if solver not in ("cbc", "cpsat"):
        raise ValueError(f"unknown solver {solver!r}; expected auto, cbc, cpsat, anneal or baseline")
    # Beyond the exact program's reach the chosen backend solves the partition programs of the bound-only
    # search instead (solvers/partition.py), and annealing polishes the best placements: asking for a backend
    # never means waiting for a program that cannot finish. "anneal" anneals the default placements only.
    exact = exact_is_tractable(instance) and not annealing
    moves = anneal_moves if anneal_moves != -1 else None if time_limit else ANNEAL_MOVES
    found = search(instance, solver=solver, time_limit_s=time_limit, threads=threads, seed=seed, top=max(1, top),
                   progress=progress, exact=exact, refine=not annealing, anneal_moves=0 if exact else moves,
                   program_limit_s=AUTO_PROGRAM_LIMIT_S if automatic and time_limit is None else None)
    best = found.ranked[0]
    objective = best.estimate.iteration_time_s
    gap = (objective - found.bound_s) / objective
    moves_text = f"{moves} moves" if moves else "the time left"
    if exact:
        method = f"exact-{solver}"
        note = (f"{found.examined} configurations solved exactly or tried, {found.pruned} pruned by bound, "
                f"{found.infeasible} do not fit")
    elif annealing:
        method = "anneal"
        note = (f"simulated annealing of the default placements of the {found.annealed} best of {found.candidates} "
                f"configurations that fit ({moves_text} each, seed {seed}), and the global lower bound of "
                f"all of them")
    else:
        method = f"bound-only-{solver}"
        note = (f"{instance.cluster.num_gpus} GPUs x {len(instance.cluster.uniform_classes())} GPU classes exceeds "
                f"the exact program's reach ({MAX_EXACT_SIZE}): default GPU maps with exactly optimised layer "
                f"partitions for the {found.examined} most promising of {found.candidates} configurations that "
                f"fit, {found.annealed} annealed placements ({moves_text}; {found.gap_annealed} of them "
                f"of configurations whose bound beats the incumbent, in bound order), and the global "
                f"lower bound of all of them")
    if found.stopped == "interrupted":
        note += "; interrupted (Ctrl-C): the best plan so far, the bound proven so far"
    elif found.stopped == "time limit":
        note += f"; stopped by the time limit ({time_limit:g} s)"
    if found.errors:
        note += (f"; {len(found.errors)} configuration(s) left unproven (solver failure or auto's per-program "
                 f"limit), each keeping the bound it reached: "
                 f"{found.errors[0]}")
    report = SolverReport(method=method, status=found.status, objective_s=objective,
                          bound_s=found.bound_s, gap=max(0.0, gap), wall_time_s=time.perf_counter() - start,
                          seed=seed, note=note)
    default = found.best_default
    return PlanResult(placement=best.placement, estimate=best.estimate, solver=report,
                      alternatives=[(c.placement, c.estimate) for c in found.ranked[1:]],
                      examined=found.examined, fitting=len(found.ranked),
                      default=default.megatron if default else None, history=found.history)


def write_json_atomic(path: str | Path, data: dict) -> None:
    """Write JSON through a temporary file in the same directory and rename it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(data, handle, indent=2)
            handle.write("\n")
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; a plan is an ordinary file
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
