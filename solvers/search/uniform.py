"""The search driver: a proof over the whole configuration space.

Every configuration gets a cheap lower bound valid for all of its partitions and GPU maps (`lower_bound`)
and, when its Megatron-style default placement fits, an upper bound (the evaluator's score of that
placement). Configurations are then solved exactly in order of lower bound; the search stops as soon as
no remaining lower bound can beat the incumbent (or the K-th best, with --top K). The reported bound is the
smallest lower bound of anything not proven, so the gap is honest at any moment, including a time limit.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

from formulation.errors import InfeasibleError
from formulation.evaluate import Estimate, evaluate
from formulation.placement import default_split, even_split
from formulation.programs.exact import build_program
from formulation.space import (
    Config,
    configurations,
    memory_feasible,
    partition_fits,
    placement_for,
)

from solvers import backends
from solvers.bounds.configs import cut_bound, lower_bound
from solvers.bounds.work import WorkBound
from solvers.search.driver import closing_status, kth_best, prunes, record_improvement
from solvers.local.partition import best_partition
from solvers.search.close_gap import ANNEAL_MOVES, close_gap  # noqa: F401 (solve() reads ANNEAL_MOVES here)

INF = float("inf")


@dataclass
class Candidate:
    config: Config
    lower_bound_s: float
    default_s: float | None = None  # best time known without a proof: the default placement's, then improved
    megatron: tuple | None = None  # (placement, estimate) of the Megatron-style default placement, if it fits
    proven_s: float | None = None  # exact optimum of this configuration, once solved
    bound_s: float | None = None  # best bound of this configuration after solving (= proven_s if optimal)
    placement: object = None
    estimate: Estimate | None = None
    status: str = "unsolved"
    caps: list[int] | None = None  # the stages' layer capacities (for the bounds)


@dataclass
class SearchResult:
    ranked: list[Candidate]  # best first (solved or default), at most `top`
    bound_s: float
    status: str
    wall_time_s: float
    candidates: int = 0  # configurations with a partition that fits
    examined: int = 0
    solved: int = 0
    pruned: int = 0
    infeasible: int = 0
    method: str = ""
    best_default: Candidate | None = None  # the Megatron-style default placement that is fastest
    stopped: str = ""  # "time limit" or "interrupted" when the search ended early
    errors: list[str] = field(default_factory=list)  # backend failures (configuration: message)
    annealed: int = 0  # anneals run (a configuration may be annealed in several rounds)
    gap_annealed: int = 0  # of them, anneals of configurations taken in bound order (close_gap's phase 2)
    started: float = field(default_factory=time.perf_counter)
    history: list = field(default_factory=list)  # (seconds since start, best time) at every improvement
    unseen_bound_s: float = INF  # (B0) of the configurations a time limit kept from the first pass


def _fits_somehow(instance, config: Config) -> tuple[bool, list[int]]:
    """Whether some layer partition fits in memory on the GPU type with the most memory, and the stages'
    layer capacities there (which the lower bound needs too)."""
    gpu_type = max(instance.cluster.gpu_types.values(), key=lambda g: g.memory_gib)
    return partition_fits(instance, config, gpu_type)


# The exact program grows with (ranks x uniform GPU classes). The test instances (up to 16) close in seconds;
# measured_4 (32 ranks x 4 classes = 128) leaves one configuration at a 6 % gap after 60 s of CP-SAT, and
# h100_128 (2,048: 275k rows) finds no solution in 60 s. Beyond this the bound-only search runs: default
# maps with exactly optimised partitions, annealed placements, and the proven global lower bound.
MAX_EXACT_SIZE = 64
# `--solver auto` without --time-limit gives each exact program at most this long, so that a program that
# will not close cannot hang the run; that configuration then keeps the bound reached (status says so).
AUTO_PROGRAM_LIMIT_S = 60.0
# Without the exact program and without --time-limit, time spent (after the enumeration) re-partitioning default maps
# (solvers/local/partition.py), most promising configurations first.
BOUND_ONLY_BUDGET_S = 8.0
# Beyond the exact program, placements are annealed (solvers/search/close_gap.py: ANNEAL_MOVES proposals each without a
# time limit, deterministic per seed): the GPU map matters where links differ (slow NICs, measured pairs).


def exact_is_tractable(instance) -> bool:
    return instance.cluster.num_gpus * len(instance.cluster.uniform_classes()) <= MAX_EXACT_SIZE


class NoPlanInTime(Exception):
    """The time limit ended before any configuration had a plan that fits."""


def search(instance, solver: str = "cbc", time_limit_s: float | None = None, threads: int = 1, seed: int = 0,
           top: int = 1, progress=None, exact: bool = True, anneal_moves: int | None = 0,
           refine: bool = True, program_limit_s: float | None = None) -> SearchResult:
    """Bound and prune over every configuration. Stops early, with the best plan so far and an honest bound,
    at the time limit or on Ctrl-C (`stopped` says which); a backend failure leaves that configuration at its
    lower bound and is reported in `errors`."""
    start = time.perf_counter()
    deadline = start + time_limit_s if time_limit_s else INF
    result = SearchResult(ranked=[], bound_s=0.0, status="feasible", wall_time_s=0.0,
                          method=solver if exact else "bound-only")
    candidates: list[Candidate] = []
    complete = False
    try:
        complete = _enumerate(instance, candidates, result, deadline, top)
        if complete:
            _solve_candidates(instance, candidates, result, solver, deadline, start, time_limit_s, threads, seed,
                              top, progress, exact, anneal_moves, refine, program_limit_s)
    except KeyboardInterrupt:
        result.stopped = "interrupted"
    result.candidates = len(candidates)
    if result.stopped == "interrupted" and not any(c.estimate for c in candidates):
        raise KeyboardInterrupt
    if not any(c.estimate for c in candidates):
        raise NoPlanInTime(f"no plan within the time limit of {time_limit_s:g} s: {len(candidates)} configurations "
                           f"examined, none with a fitting default placement yet; allow more time")
    scored = sorted((c for c in candidates if c.estimate is not None),
                    key=lambda c: (c.estimate.iteration_time_s, c.config))
    result.ranked = scored[:top]
    defaults = [c for c in candidates if c.megatron is not None]
    result.best_default = min(defaults, key=lambda c: (c.megatron[1].iteration_time_s, c.config)) if defaults else None
    kth = _kth_best(candidates, top)
    result.pruned = sum(1 for c in candidates if c.status == "unsolved" and prunes(c.lower_bound_s, kth))
    best = result.ranked[0].estimate.iteration_time_s
    # configurations the first pass never reached are bounded by their work bound (B0) alone
    result.bound_s = min(_global_bound(candidates), result.unseen_bound_s, best)
    _, result.status = closing_status(best, result.bound_s, result.stopped)
    result.wall_time_s = time.perf_counter() - start
    return result


def _enumerate(instance, candidates: list[Candidate], result: SearchResult, deadline: float, top: int) -> bool:
    """Every configuration: memory pruning, the work bound (B0) and the default placement as an upper bound;
    then (B1) and (B2) where they matter, most promising first. Every candidate holds a valid lower bound at
    every moment, so a time limit anywhere leaves an honest global bound. False if the time limit ended the
    first pass (after a first plan exists); `result.unseen_bound_s` then bounds the configurations not reached."""
    work_bound = WorkBound(instance)
    configs = list(configurations(instance))
    shortfall = None
    for index, config in enumerate(configs):
        try:
            if time.perf_counter() >= deadline:
                result.stopped = "time limit"
                result.unseen_bound_s = min(work_bound(c) for c in configs[index:])
                return False
            shortfall = _first_pass(instance, config, candidates, result, work_bound, shortfall)
        except KeyboardInterrupt:  # Ctrl-C: what was not reached keeps its (B0), so the bound stays honest
            result.unseen_bound_s = min(work_bound(c) for c in configs[index:])
            raise
    result.candidates = len(candidates)
    if not candidates:
        if shortfall is None:
            raise InfeasibleError("no configuration matches the cluster and batch: global_batch_size must be "
                                  "divisible by some data-parallel size dp (and tp, pp, cp must divide the GPU count)")
        raise InfeasibleError(f"no configuration fits in memory; the closest is {shortfall[1]}")
    _raise_bounds(instance, candidates, result, deadline, top)
    return True


def _first_pass(instance, config: Config, candidates: list[Candidate], result: SearchResult, work_bound,
                shortfall):
    """One configuration: skipped if no partition fits (the closest miss kept for the message: returned), else a
    candidate with its (B0) and its default placement's time."""
    world = instance.cluster.num_gpus
    fits, caps = _fits_somehow(instance, config)
    if not fits:
        result.infeasible += 1
        even = placement_for(config, even_split(instance.model.num_layers, config.pp), range(world))
        _, excess, stage = memory_feasible(instance, even)
        if shortfall is None or excess < shortfall[0]:
            shortfall = (excess, f"{config.describe()}, whose stage {stage} exceeds its memory limit by "
                                 f"{excess:.1f} GiB with an even split (and no other split fits)")
        return shortfall
    cand = Candidate(config, work_bound(config), caps=caps)
    split = default_split(instance.model.num_layers, config.pp, config.vpp)
    default = placement_for(config, split, range(world)) if split else None
    if default is not None and memory_feasible(instance, default)[0]:
        est = evaluate(instance, default, check=False)
        if est.fits:
            cand.default_s, cand.placement, cand.estimate = est.iteration_time_s, default, est
            cand.megatron = (default, est)
            _improved(result, cand.estimate.iteration_time_s)
    candidates.append(cand)
    return shortfall


def _raise_bounds(instance, candidates: list[Candidate], result: SearchResult, deadline: float, top: int) -> None:
    """(B1), then (B2), each only where the bound so far leaves a configuration able to beat the K-th best
    default placement, smallest bound first (so that a time limit leaves the global bound as high as the
    time allowed). Each bound is valid alone, so a configuration keeps the larger."""
    upper = _kth_best(candidates, top)
    for refine in (lambda c: lower_bound(instance, c.config, c.caps), lambda c: cut_bound(instance, c.config)):
        candidates.sort(key=lambda c: (c.lower_bound_s, c.config))
        for cand in candidates:
            if cand.lower_bound_s >= upper:
                break  # sorted: no later one can beat the K-th best either
            if time.perf_counter() >= deadline:
                result.stopped = "time limit"  # the bounds reached stay: valid, only weaker
                return
            cand.lower_bound_s = max(cand.lower_bound_s, refine(cand))
    candidates.sort(key=lambda c: (c.lower_bound_s, c.config))


def _improved(result: SearchResult, value: float) -> None:
    record_improvement(result.history, result.started, value)


def _kth_best(candidates: list[Candidate], top: int) -> float:
    return kth_best((c.proven_s if c.proven_s is not None else c.default_s for c in candidates), top)


def _solve_candidates(instance, candidates, result, solver, deadline, start, time_limit_s, threads, seed, top,
                      progress, exact, anneal_moves: int | None = 0, refine: bool = True,
                      program_limit_s: float | None = None) -> None:
    """Most promising first, until no remaining lower bound beats the K-th best: exact programs, or (bound-only)
    exactly optimised partitions of the default maps within their own budget (`refine`), then annealing of the
    best configurations' placements (`anneal_moves` per configuration, 0: none)."""
    if exact:
        _solve_exactly(instance, candidates, result, solver, deadline, threads, seed, top, progress, program_limit_s)
        return
    if refine:
        now = time.perf_counter()
        # with a time limit, a quarter of what is left at most, so that annealing gets the rest
        _refine_partitions(instance, candidates, result, solver, deadline, top,
                           now + min(BOUND_ONLY_BUDGET_S, (deadline - now) / 4 if time_limit_s else INF))
    if anneal_moves != 0:
        close_gap(instance, candidates, result, deadline, seed, top, anneal_moves, _kth_best, _improved,
                  solver=solver)


def _refine_partitions(instance, candidates, result, solver, deadline, top, refine_until) -> None:
    """Bound-only: the default map of each configuration that may still win, its layers split exactly."""
    world = instance.cluster.num_gpus
    for cand in candidates:
        if prunes(cand.lower_bound_s, _kth_best(candidates, top)):
            break
        if time.perf_counter() >= refine_until:
            if time.perf_counter() >= deadline:
                result.stopped = "time limit"
            break
        result.examined += 1
        template = placement_for(cand.config, even_split(instance.model.num_layers, cand.config.pp), range(world))
        better = best_partition(instance, template, solver=solver,
                                time_limit_s=min(30.0, refine_until - time.perf_counter()))
        if better is not None:
            est = evaluate(instance, better)
            if est.fits and (cand.default_s is None or est.iteration_time_s < cand.default_s):
                cand.default_s, cand.placement, cand.estimate = est.iteration_time_s, better, est
                _improved(result, cand.estimate.iteration_time_s)


def _solve_exactly(instance, candidates, result, solver, deadline, threads, seed, top, progress,
                   program_limit_s) -> None:
    """The exact program of each configuration that may still win, smallest bound first."""
    backend = backends.get(solver)
    for cand in candidates:
        if prunes(cand.lower_bound_s, _kth_best(candidates, top)):
            break
        if time.perf_counter() >= deadline:
            result.stopped = "time limit"
            break
        result.examined += 1
        try:
            program = build_program(instance, cand.config)
        except ValueError:
            cand.status, cand.bound_s = "infeasible", INF
            continue
        remaining = None if deadline == INF else max(0.05, deadline - time.perf_counter())
        if program_limit_s is not None:
            remaining = program_limit_s if remaining is None else min(remaining, program_limit_s)
        out = backend.solve(program, time_limit_s=remaining, threads=threads, seed=seed)
        cand.status = out.status
        if out.values is not None:
            out = _keep_solution(instance, program, out, cand, result)
        _record_outcome(cand, out, result, solver, deadline, program_limit_s)
        if progress:
            progress(result.examined, len(candidates), _kth_best(candidates, top), _global_bound(candidates))


def _keep_solution(instance, program, out, cand: Candidate, result: SearchResult):
    """Score the program's answer with the evaluator; keep it if it fits and is no worse. Returns the backend's
    outcome, turned into an error when the program priced its answer otherwise than the referee (to 1e-6)."""
    placement = program.decode(out.values)
    est = evaluate(instance, placement)
    if out.status == "optimal" and abs(est.iteration_time_s - out.objective_s) > 1e-6 * est.iteration_time_s:
        # the program did not price its answer as the referee does: its optimum proves nothing
        out = replace(out, status="error", message=f"program objective {out.objective_s:.9g} s, evaluator "
                                                   f"{est.iteration_time_s:.9g} s: not a proof")
    if est.fits and (cand.default_s is None or est.iteration_time_s <= cand.default_s):
        cand.placement, cand.estimate = placement, est
        _improved(result, cand.estimate.iteration_time_s)
    return out


def _record_outcome(cand: Candidate, out, result: SearchResult, solver: str, deadline: float,
                    program_limit_s: float | None) -> None:
    """What the program proved about its configuration: its optimum, nothing in it, or a bound (and why)."""
    if out.status == "optimal":
        cand.proven_s = cand.bound_s = cand.estimate.iteration_time_s if cand.estimate else INF
        result.solved += 1
    elif out.status == "infeasible":
        cand.bound_s = INF
    elif out.status == "error":
        cand.bound_s = cand.lower_bound_s  # nothing proven beyond the cheap bound
        result.errors.append(f"{cand.config.describe()}: {out.message}")
    else:  # no proof: the time limit, or the backend gave up on its own (CP-SAT UNKNOWN)
        cand.bound_s = max(cand.lower_bound_s, out.bound_s or 0.0)
        if program_limit_s is not None and out.wall_time_s >= 0.9 * program_limit_s:
            result.errors.append(f"{cand.config.describe()}: its program was not closed within "
                                 f"{program_limit_s:g} s (auto's limit per program); its bound is kept")
        elif deadline == INF:
            result.errors.append(f"{cand.config.describe()}: {solver} ended without a proof ({out.status})")
        else:
            result.stopped = "time limit"


def _global_bound(candidates: list[Candidate]) -> float:
    """Smallest time anything not yet proven could still achieve."""
    bounds = []
    for c in candidates:
        if c.proven_s is not None:
            bounds.append(c.proven_s)
        elif c.bound_s is not None:
            bounds.append(c.bound_s)
        else:
            bounds.append(c.lower_bound_s)
    return min(bounds)
