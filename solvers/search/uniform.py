"""The search over one GPU type's configurations: a proof over the whole configuration space.

Every configuration gets a cheap lower bound valid for all of its partitions and GPU maps (`lower_bound`)
and, when its Megatron-style default placement fits, an upper bound (the evaluator's score of that
placement). Configurations are then solved exactly in order of lower bound, by the bound-and-prune driver
that the mixed-type search runs too (solvers/search/driver.py); it stops as soon as no remaining lower bound
can beat the incumbent (or the K-th best, with --top K). The reported bound is the smallest lower bound of
anything not proven, so the gap is honest at any moment, including a time limit. This module supplies what
is particular to one GPU type: the enumeration and its bounds, the exact program of one configuration, and
beyond the exact program's reach the bound-only search (exact partitions of default maps, then annealing).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from formulation.errors import InfeasibleError
from formulation.evaluate import evaluate
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
from solvers.search.driver import (INF, Item, NoPlanInTime, Tally, bound_and_prune, closing_status, global_bound,
                                   interruptible, kth_of, prunes, time_left)
from solvers.local.partition import best_partition
from solvers.search.close_gap import ANNEAL_MOVES, close_gap  # noqa: F401 (solve() reads ANNEAL_MOVES here)


@dataclass
class Candidate(Item):
    """A configuration, its bounds in seconds. `value` is the best time known for it: the default placement's,
    then improved (partitions, annealing), and its proven optimum once its exact program is solved."""

    megatron: tuple | None = None  # (placement, estimate) of the Megatron-style default placement, if it fits
    caps: list[int] | None = None  # the stages' layer capacities (for the bounds)


@dataclass
class SearchResult(Tally):
    """`ranked`: candidates, best first (solved or default); `candidates`: configurations with a partition that
    fits."""

    bound_s: float = 0.0
    method: str = ""
    best_default: Candidate | None = None  # the Megatron-style default placement that is fastest
    annealed: int = 0  # anneals run (a configuration may be annealed in several rounds)
    gap_annealed: int = 0  # of them, anneals of configurations taken in bound order (close_gap's phase 2)
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
# With --time-limit, (B1) and (B2) are raised during at most this share of it: what they leave keeps its work
# bound (valid, weaker), and a loaded machine cannot spend the whole budget proving before any placement is
# searched (measured_64 at 10 s: the bounds take about 3 s alone, 9 s with three other jobs on the 2 cores)
BOUND_SHARE = 0.5
# Beyond the exact program, placements are annealed (solvers/search/close_gap.py: ANNEAL_MOVES proposals each without a
# time limit, deterministic per seed): the GPU map matters where links differ (slow NICs, measured pairs).


def exact_is_tractable(instance) -> bool:
    """Small enough for the exact program (dense or mixture-of-experts: its expert groups are encoded too,
    docs/moe.md)."""
    return instance.cluster.num_gpus * len(instance.cluster.uniform_classes()) <= MAX_EXACT_SIZE


def search(instance, solver: str = "cbc", time_limit_s: float | None = None, threads: int = 1, seed: int = 0,
           top: int = 1, progress=None, exact: bool = True, anneal_moves: int | None = 0,
           refine: bool = True, program_limit_s: float | None = None) -> SearchResult:
    """Bound and prune over every configuration. Stops early, with the best plan so far and an honest bound,
    at the time limit or on Ctrl-C (`stopped` says which); a backend failure leaves that configuration at its
    lower bound and is reported in `errors`."""
    start = time.perf_counter()
    deadline = start + time_limit_s if time_limit_s else INF
    result = SearchResult(method=solver if exact else "bound-only")
    candidates: list[Candidate] = []
    with interruptible(result):
        bounds_until = start + BOUND_SHARE * time_limit_s if time_limit_s else INF
        if _enumerate(instance, candidates, result, deadline, top, bounds_until):
            _solve_candidates(instance, candidates, result, solver, deadline, start, time_limit_s, threads, seed,
                              top, progress, exact, anneal_moves, refine, program_limit_s)
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
    kth = kth_of(candidates, top)
    # also the configurations a time limit kept from the driver, whose bound cannot beat the K-th best either
    result.pruned = sum(1 for c in candidates if c.status == "unsolved" and prunes(c.lower_bound, kth))
    best = result.ranked[0].estimate.iteration_time_s
    # configurations the first pass never reached are bounded by their work bound (B0) alone
    result.bound_s = min(global_bound(candidates), result.unseen_bound_s, best)
    _, result.status = closing_status(best, result.bound_s, result.stopped)
    result.wall_time_s = time.perf_counter() - start
    return result


def _enumerate(instance, candidates: list[Candidate], result: SearchResult, deadline: float, top: int,
               bounds_until: float = INF) -> bool:
    """Every configuration: memory pruning, the work bound (B0) and the default placement as an upper bound;
    then (B1) and (B2) where they matter, most promising first. Every candidate holds a valid lower bound at
    every moment, so a time limit anywhere leaves an honest global bound. False if the time limit ended the
    first pass (after a first plan exists); `result.unseen_bound_s` then bounds the configurations not reached.
    (B1) and (B2) stop at `bounds_until`.

    The limit never stops the pass before a first plan: a short limit on a loaded machine would otherwise end
    with no plan at all although one is a default placement away (what a plan needs is checked, not the clock)."""
    work_bound = WorkBound(instance)
    configs = list(configurations(instance))
    shortfall, have_plan = None, False
    for index, config in enumerate(configs):
        try:
            if have_plan and time.perf_counter() >= deadline:
                result.stopped = "time limit"
                result.unseen_bound_s = min(work_bound(c) for c in configs[index:])
                return False
            shortfall = _first_pass(instance, config, candidates, result, work_bound, shortfall)
            have_plan = have_plan or bool(candidates and candidates[-1].estimate is not None)
        except KeyboardInterrupt:  # Ctrl-C: what was not reached keeps its (B0), so the bound stays honest
            result.unseen_bound_s = min(work_bound(c) for c in configs[index:])
            raise
    result.candidates = len(candidates)
    if not candidates:
        if shortfall is None:
            raise InfeasibleError("no configuration matches the cluster and batch: global_batch_size must be "
                                  "divisible by some data-parallel size dp (and tp, pp, cp must divide the GPU count)")
        raise InfeasibleError(f"no configuration fits in memory; the closest is {shortfall[1]}")
    _raise_bounds(instance, candidates, result, deadline, top, bounds_until)
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
            cand.value, cand.placement, cand.estimate = est.iteration_time_s, default, est
            cand.megatron = (default, est)
            result.improved(cand.estimate.iteration_time_s)
    candidates.append(cand)
    return shortfall


def _raise_bounds(instance, candidates: list[Candidate], result: SearchResult, deadline: float, top: int,
                  until: float = INF) -> None:
    """(B1), then (B2), each only where the bound so far leaves a configuration able to beat the K-th best
    default placement, smallest bound first (so that a time limit leaves the global bound as high as the
    time allowed), until `until` (BOUND_SHARE) or the deadline. Each bound is valid alone, so a configuration
    keeps the larger; the bounds reached when time runs out stay: valid, only weaker."""
    upper = kth_of(candidates, top)
    for refine in (lambda c: lower_bound(instance, c.config, c.caps), lambda c: cut_bound(instance, c.config)):
        candidates.sort(key=lambda c: (c.lower_bound, c.config))
        for cand in candidates:
            if cand.lower_bound >= upper:
                break  # sorted: no later one can beat the K-th best either
            if time.perf_counter() >= min(deadline, until):
                if time.perf_counter() >= deadline:
                    result.stopped = "time limit"
                candidates.sort(key=lambda c: (c.lower_bound, c.config))
                return
            cand.lower_bound = max(cand.lower_bound, refine(cand))
    candidates.sort(key=lambda c: (c.lower_bound, c.config))


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
        close_gap(instance, candidates, result, deadline, seed, top, anneal_moves, solver=solver)


def _refine_partitions(instance, candidates, result, solver, deadline, top, refine_until) -> None:
    """Bound-only: the default map of each configuration that may still win, its layers split exactly, until
    `refine_until` (the annealing that follows gets the rest of the time)."""
    world = instance.cluster.num_gpus

    def refine(cand: Candidate, kth: float) -> None:
        template = placement_for(cand.config, even_split(instance.model.num_layers, cand.config.pp), range(world))
        better = best_partition(instance, template, solver=solver,
                                time_limit_s=min(30.0, refine_until - time.perf_counter()))
        if better is not None:
            est = evaluate(instance, better)
            if est.fits and (cand.value is None or est.iteration_time_s < cand.value):
                cand.value, cand.placement, cand.estimate = est.iteration_time_s, better, est
                result.improved(cand.estimate.iteration_time_s)

    bound_and_prune(candidates, refine, result, top, deadline, until=refine_until)


def _solve_exactly(instance, candidates, result, solver, deadline, threads, seed, top, progress,
                   program_limit_s) -> None:
    """The exact program of each configuration that may still win, smallest bound first."""
    backend = backends.get(solver)

    def solve_one(cand: Candidate, kth: float) -> None:
        try:
            program = build_program(instance, cand.config)
        except ValueError:
            cand.status, cand.bound = "infeasible", INF
            return
        out = backend.solve(program, time_limit_s=time_left(deadline, program_limit_s), threads=threads, seed=seed)
        cand.status = out.status
        if out.values is not None:
            out = _keep_solution(instance, program, out, cand, result)
        _record_outcome(cand, out, result, solver, deadline, program_limit_s)

    bound_and_prune(candidates, solve_one, result, top, deadline, progress)


def _keep_solution(instance, program, out, cand: Candidate, result: SearchResult):
    """Score the program's answer with the evaluator; keep it if it fits and is no worse. Returns the backend's
    outcome, turned into an error when the program priced its answer otherwise than the referee (to 1e-6)."""
    placement = program.decode(out.values)
    est = evaluate(instance, placement)
    if out.status == "optimal" and abs(est.iteration_time_s - out.objective_s) > 1e-6 * est.iteration_time_s:
        # the program did not price its answer as the referee does: its optimum proves nothing
        out = replace(out, status="error", message=f"program objective {out.objective_s:.9g} s, evaluator "
                                                   f"{est.iteration_time_s:.9g} s: not a proof")
    if est.fits and (cand.value is None or est.iteration_time_s <= cand.value):
        cand.placement, cand.estimate = placement, est  # `value` (what the K-th best counts) moves once proven
        result.improved(cand.estimate.iteration_time_s)
    return out


def _record_outcome(cand: Candidate, out, result: SearchResult, solver: str, deadline: float,
                    program_limit_s: float | None) -> None:
    """What the program proved about its configuration: its optimum, nothing in it, or a bound (and why)."""
    if out.status == "optimal":
        cand.value = cand.bound = cand.estimate.iteration_time_s if cand.estimate else INF
        result.solved += 1
    elif out.status == "infeasible":
        cand.bound = INF
    elif out.status == "error":
        cand.bound = cand.lower_bound  # nothing proven beyond the cheap bound
        result.errors.append(f"{cand.config.describe()}: {out.message}")
    else:  # no proof: the time limit, or the backend gave up on its own (CP-SAT UNKNOWN)
        cand.bound = max(cand.lower_bound, out.bound_s or 0.0)
        if program_limit_s is not None and out.wall_time_s >= 0.9 * program_limit_s:
            result.errors.append(f"{cand.config.describe()}: its program was not closed within "
                                 f"{program_limit_s:g} s (auto's limit per program); its bound is kept")
        elif deadline == INF:
            result.errors.append(f"{cand.config.describe()}: {solver} ended without a proof ({out.status})")
        else:
            result.stopped = "time limit"
