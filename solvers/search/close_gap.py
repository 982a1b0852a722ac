"""Beyond the exact program: spend the search's remaining budget where the bound says the optimum may be.

After the enumeration (every configuration's lower bound, its default placement scored) and the exactly
optimised partitions of the default maps, the bound-only search improves placements in two phases:

1. the best placements found so far (ANNEAL_CONFIGURATIONS of them): where every stage is whole nodes, moved
   onto max-min node groups if that is faster (solvers/local/bottleneck.py: each stage's dp sync runs at the
   slowest link inside its group), weak nodes relocated (solvers/local/relocate.py), then annealed
   (solvers/local/annealing.py);
2. rounds over every configuration whose lower bound is below the incumbent, in bound order (the one that may
   hold the optimum first): annealed from its best placement (round 0), then restarted from a different map
   (odd rounds: the default map with its node order shuffled, or, with a time limit where every stage is whole
   nodes and the slot tables apply, a random node order annealed over node orders on them,
   solvers/local/node_slots.py) or from its best again with another seed, with twice the moves of the round
   before (round 0 first tries the max-min groups and relocation, as phase 1);
   after each anneal, the exact partition program
   (solvers/local/partition.py) re-splits the layers for the annealed map. The incumbent falls as placements
   improve, and configurations whose bound no longer beats it drop out of later rounds.

Without a time limit both phases run on move counts (deterministic per seed) and phase 2 runs GAP_ROUNDS
rounds of at most GAP_MOVES proposals in all; GAP_BUDGET_S of wall time is only a safety net (a machine loaded
far beyond what the move budget assumes), the one clock-dependent stop without a time limit. With a time limit
phase 1 is a race: each of the best configurations gets a short anneal (PHASE1_SHARES of what is left, at most
PHASE1_MOVES_FACTOR x ANNEAL_MOVES proposals), then the best plan after them is annealed on (DEEPEN_SHARE of what
is left, as many proposals at most); phase 2 runs rounds until FINAL_SHARE of the time it started with is left,
and that goes to iterated descent on the best plan found (solvers/local/polish.py: every node swap and layer move
tried in turn, kicked and tried again) on clusters of at most POLISH_NODES nodes, else to one more warm anneal of
it. Without a time limit the best plan on those clusters gets one deterministic descent.
The winner is the one that most needs depth, but which one wins shows only after annealing (measured_64: the best
default split is pp=4, the best annealed plan pp=8); and the anneals that continue a plan start WARM of the way
down their cooling schedule, not re-heated (measured_64, pp=8, 3 seeds: an anneal of 2 s then one of 4 s from
its plan gives 8.0039-8.0072 s started warm, 8.0082-8.0172 s re-heated). This is what lets `auto` match a
node-permutation SA that anneals its configuration for the whole budget (docs/search-beyond-exact.md).
Nothing is annealed once the bounds prove the plans reported (`settled`: the global bound meets the best plan to
OPTIMAL_GAP, with --top K every reported plan its own bound or the K-th best): a time limit is not spent proving
what is proven (h100_128 under --framework torchtitan: 6 s instead of the 300 s limit).
Every improvement is recorded in the search's history (time, best), from which the gap over time follows (the
bound is fixed once the enumeration ends).
"""

from __future__ import annotations

import time

import numpy as np

from formulation.errors import InfeasibleError
from formulation.evaluate import evaluate
from formulation.placement import even_split
from formulation.space import placement_for

from solvers.local.annealing import anneal
from solvers.local.bottleneck import bottleneck_start, max_min_order, nodes_per_stage
from solvers.local.node_slots import slot_anneal, slot_placement, slot_tables
from solvers.local.partition import best_partition
from solvers.local.polish import polish
from solvers.local.relocate import relocate_weak_nodes
from solvers.search.driver import OPTIMAL_GAP, kth_of, prunes

INF = float("inf")
# phase 1: the placements of this many best configurations are annealed (ANNEAL_MOVES proposals each without
# a time limit)
ANNEAL_CONFIGURATIONS = 3
ANNEAL_MOVES = 4000
# phase 2 without a time limit: rounds over the configurations the bound leaves open, a budget of proposals
# (deterministic), and a wall-clock safety net. The shipped instances, h100_16384 included, use under 20,000
# proposals in both phases, a few seconds; a 10 s clock cap used to cut phase 2 short when the machine was
# loaded, so the same seed could give another plan.
GAP_ROUNDS = 2
GAP_MOVES = 50 * ANNEAL_MOVES
GAP_BUDGET_S = 60.0
# phase 1 with a time limit: the share of the time left that each of the best configurations gets (a short
# anneal each: which one wins shows only after annealing; giving half to the best default split spent 3.4 s of a
# 10 s budget on measured_64's pp=4 and 0.7 s on the pp=8 that won)
PHASE1_SHARES = (0.12, 0.12, 0.12)
# ... and at most this many times ANNEAL_MOVES (64 GPUs converge in a few seconds: the rest of a long budget
# is better spent on the configurations the bound leaves open), times (classes / PHASE1_NODE_CLASSES)^2 where the
# cluster has more node classes than that (nodes that are not interchangeable): the node orders an anneal must
# sort grow with them, and on measured_32 (32 classes) a single anneal still improves after 100,000 proposals
PHASE1_MOVES_FACTOR = 4
PHASE1_NODE_CLASSES = 8
# then the best plan after them is annealed on for this share of what is left (at most as many proposals; a
# short budget is best spent deep on the plan most likely to win; 0.8 by the clock alone, with the anneals of
# plans 1 % above the best skipped, did not help: measured_16 at 10 s, 3 seeds, 7.80776-7.80787 s against
# 7.80706-7.80746 s), starting WARM of the way down its cooling schedule (T0 / 1000^WARM): it continues an
# annealed plan
DEEPEN_SHARE = 0.5
WARM = 0.5
# with a time limit, the last share of what phase 2 starts with goes to the best plan found (depth where the
# winner is, after breadth where the bound points): on clusters of at most POLISH_NODES nodes to iterated descent
# (solvers/local/polish.py: every node swap and layer move tried in turn, kicked and tried again), on larger ones
# to one more warm anneal (a sweep over 128 nodes' 8,128 pairs costs seconds: one 60 s run of
# deepseek_v3_h100_1024 with the descent found nothing in its last 40 s and ended 0.01 % above the anneal's plan).
# From the same plans the descent ends lower than the anneal (seconds of the model before the per-iteration
# overhead; measured_16, 10 s plans: 3 s of it 7.807064-7.807283 s, node-SA's 10 s 7.80726-7.80750 s), and at 10 s
# on measured_32 / 64 (3 seeds) auto's median went 7.9115 -> 7.8954 s and 8.0132 -> 8.0121 s with all of the
# share to it instead of half. Without a time limit one descent of at most POLISH_SWEEPS sweeps on those
# clusters: deterministic
FINAL_SHARE = 0.3
POLISH_SWEEPS = 20
POLISH_NODES = 64
# an anneal is not started with less time than this left (its start and final evaluate() take about that on
# 512 GPUs): the time limit is a promise
MIN_ANNEAL_S = 0.5
# with a time limit, phase 2's restarts (odd rounds), where every stage is whole nodes and the slot tables apply
# (solvers/local/node_slots.py): a random node order annealed over node orders with this many times the round's
# proposals, each table look-ups (measured_16: about 93,000 a second, the annealer 12,000). measured_16 at 60 s,
# seeds 0-2: 7.682575 / 7.682384 / 7.682384 s, where the annealer's restarts ended at 7.682582-7.682980 s and a
# node-permutation SA of the whole 60 s at 7.68238-7.68291 s (median 7.68268). Without a time limit phase 2's one
# restart stays the annealer's: with the tables h100_128's plan went from 29.518308 to 29.518356 s (the annealer's
# layer and GPU moves found the better one there)
SLOT_MOVES_FACTOR = 8
# ... and the deepening of phase 1's best plan is such an anneal (for the deepening's time): from a random order
# where its stages are two nodes (their dp syncs reach their floor on most pairings and the plans differ in the
# chain of sends, which the tables walk faster: measured_16 at 10 s, seeds 0-2, 7.682833 / 7.682384 / 7.682575 s
# against 7.683135 / 7.682681 / 7.682575 s with the warm anneal, whose 3 s there found nothing in a traced run),
# from the max-min node groups where they are more (a random start did worse on measured_64's 8-node stages,
# 7.8417-7.8445 s against the warm anneal's 7.8297-7.8387 s; from the groups, measured_32 / measured_64 at 10 s
# gave medians 7.7489 / 7.8357 s against the warm anneal's 7.7584 / 7.8386 s in the same hour)


def close_gap(instance, candidates, result, deadline: float, seed: int, top: int, moves: int | None,
              solver: str = "cpsat") -> None:
    """Both phases (module docstring). `moves`: proposals per anneal (None: share the time left until the
    deadline); a configuration stays open while its bound beats the K-th best of the candidates' values. Nothing
    is annealed once the bounds prove the plans reported (`settled`): the time left is not spent."""
    if settled(candidates, top):
        return
    incumbent = min((c.estimate.iteration_time_s for c in candidates if c.estimate is not None), default=INF)
    open_ = [c for c in candidates if c.lower_bound < (c.estimate.iteration_time_s if c.estimate else incumbent)
             * (1 - 1e-9)]
    # plans in hand first, by estimated time; a configuration with none yet (its default split does not fit) by
    # its bound, after them: a bound the time limit left at (B0) would otherwise jump the queue
    first = sorted(open_, key=lambda c: (c.estimate is None, c.estimate.iteration_time_s if c.estimate else
                                         c.lower_bound, c.config))
    first = first[:max(ANNEAL_CONFIGURATIONS, top)]
    now = time.perf_counter()
    timed = deadline != INF and moves is None
    done = set()
    groups = {}  # max-min node groups per (pp, nodes per stage, seed), shared by the configurations
    tables = {}  # node-slot tables per (configuration, split), None where they do not apply
    for k, cand in enumerate(first):
        if time.perf_counter() >= deadline or settled(candidates, top):
            break
        # with a time limit: PHASE1_SHARES of what was left (the best plan so far gets most of it); a share too
        # short to anneal in is not started (its relocation would only take time from the next phase)
        share = None if not timed else (deadline - now) * PHASE1_SHARES[min(k, len(PHASE1_SHARES) - 1)]
        if share is not None and share < MIN_ANNEAL_S:
            if k > 0:
                continue
            share = min(MIN_ANNEAL_S, deadline - now)  # the best plan so far gets one anneal (a loaded machine)
        _bottleneck(instance, cand, result, seed, groups)
        # relocation is a greedy pass of evaluate() calls: at most a tenth of what is left with a time limit
        _relocate(instance, cand, result, deadline if not timed else time.perf_counter() + (deadline - now) / 10)
        count = moves if not timed else PHASE1_MOVES_FACTOR * ANNEAL_MOVES * class_scale(instance)
        if _anneal(instance, cand, result, seed, count, share, deadline):
            done.add(cand.config)
    if settled(candidates, top):
        return
    if timed and time.perf_counter() < deadline:  # the probes' best continues, cooler (DEEPEN_SHARE)
        _deepen(instance, candidates, result, seed + 2, done, DEEPEN_SHARE * (deadline - time.perf_counter()),
                deadline, PHASE1_MOVES_FACTOR * ANNEAL_MOVES * class_scale(instance), tables, groups)
    if time.perf_counter() >= deadline:
        result.stopped = "time limit"
        return
    budget_end = min(deadline, time.perf_counter() + GAP_BUDGET_S) if deadline == INF else deadline
    if timed:  # the last FINAL_SHARE of the time goes to the best plan found (below)
        budget_end = deadline - FINAL_SHARE * (deadline - time.perf_counter())
    _rounds(instance, candidates, result, seed, top, moves, solver, done, budget_end,
            *((GAP_ROUNDS, GAP_MOVES) if deadline == INF else (1_000_000, INF)), groups=groups,
            tables=tables if timed else None)
    small = len(instance.cluster.nodes) <= POLISH_NODES
    if settled(candidates, top):
        return
    if timed and not small and time.perf_counter() < deadline:  # a descent sweep costs seconds: anneal on
        _deepen(instance, candidates, result, seed + 1, done, deadline - time.perf_counter(), deadline, None)
    elif small:
        _polish(instance, candidates, result, seed + 1, deadline if timed else None, deadline)
    if time.perf_counter() >= deadline:
        result.stopped = "time limit"


def settled(candidates, top: int) -> bool:
    """Whether the bounds prove the `top` best plans (to OPTIMAL_GAP, the reported gap's "optimal"): every
    candidate's bound reaches its own best time where that is among them, else the K-th best. No anneal can then
    improve what is reported."""
    kth = kth_of(candidates, top)
    return kth < INF and all(c.open_bound >= min(kth, INF if c.value is None else c.value) * (1 - OPTIMAL_GAP)
                             for c in candidates)


def _deepen(instance, candidates, result, seed, done: set, time_s, deadline, moves,
            tables: dict | None = None, groups: dict | None = None) -> None:
    """The best plan so far annealed on for `time_s` (and at most `moves`) from where an earlier anneal left it:
    WARM of the cooling schedule already done (re-heated to T0, a short anneal spends its time undoing and
    re-finding what the last one found); hot if it was never annealed. Where the slot tables apply (given
    `tables`), a node-order anneal on them instead (SLOT_MOVES_FACTOR): from a random order for stages of two
    nodes, else from the max-min node groups (`groups`: their cache)."""
    best = _best(candidates)
    if best is None:
        return
    if tables is not None and _slot_tables(instance, best, tables) is not None and _slot_restart(
            instance, best, result, seed, SLOT_MOVES_FACTOR * moves, min(deadline, time.perf_counter() + time_s),
            None, tables, _max_min_order(instance, best, seed, groups)):
        done.add(best.config)
    elif _anneal(instance, best, result, seed, moves, time_s, deadline, warm=WARM if best.config in done else 0.0):
        done.add(best.config)


def _best(candidates):
    """The candidate holding the best plan so far (None before any plan)."""
    return min((c for c in candidates if c.estimate is not None), default=None,
               key=lambda c: (c.estimate.iteration_time_s, c.config))


def _polish(instance, candidates, result, seed, deadline, fallback_deadline: float = INF) -> None:
    """The best plan's iterated descent (solvers/local/polish.py) until `deadline`; without one (None), a single
    descent of at most POLISH_SWEEPS sweeps (deterministic), stopped at `fallback_deadline` (the search's own,
    when its anneals run on move counts)."""
    best = _best(candidates)
    if best is None:
        return
    if deadline is None:  # one descent, cut only by the search's deadline if it has one
        if time.perf_counter() >= fallback_deadline:
            return
        found = polish(instance, best.placement, max_sweeps=POLISH_SWEEPS, kicks=False,
                       time_limit_s=None if fallback_deadline == INF else fallback_deadline - time.perf_counter())
    else:
        if deadline - time.perf_counter() < MIN_ANNEAL_S:
            return
        found = polish(instance, best.placement, seed=seed, time_limit_s=deadline - time.perf_counter())
    if found.estimate.iteration_time_s < best.estimate.iteration_time_s:
        _keep(best, found.placement, found.estimate, result)


def class_scale(instance) -> int:
    """How many times ANNEAL_MOVES an anneal needs with a time limit: (node classes / PHASE1_NODE_CLASSES)^2,
    at least 1."""
    return max(1, round((len(instance.cluster.interchangeable_nodes()) / PHASE1_NODE_CLASSES) ** 2))


def _rounds(instance, candidates, result, seed, top, moves, solver, done, budget_end, rounds: int,
            move_budget: float, groups: dict | None = None, tables: dict | None = None) -> None:
    """Phase 2 (module docstring): at most `rounds` rounds and `move_budget` proposals, until `budget_end`; given
    `tables` (a cache, with a time limit) the restarts are on node-slot tables where they apply."""
    base = moves or ANNEAL_MOVES * class_scale(instance)
    spent = 0  # proposals given to phase 2's anneals
    for r in range(rounds):
        order = sorted((c for c in candidates if not prunes(c.lower_bound, kth_of(candidates, top))),
                       key=lambda c: (c.lower_bound, c.config))
        order = [c for c in order if r > 0 or c.config not in done]
        if not order and r > 0:
            break
        for cand in order:
            if budget_end - time.perf_counter() < MIN_ANNEAL_S:
                return  # no anneal starts in what is left (it would return at once, round after round): the
                # rest goes to the final share
            if settled(candidates, top):
                return
            if prunes(cand.lower_bound, kth_of(candidates, top)):
                continue  # the incumbent fell below its bound during this round
            if r == 0:
                _bottleneck(instance, cand, result, seed, groups)
                _relocate(instance, cand, result, budget_end)
            if spent + base * 2 ** r > move_budget:
                return
            spent += base * 2 ** r
            if tables is not None and r % 2 and _slot_restart(
                    instance, cand, result, seed + r, SLOT_MOVES_FACTOR * base * 2 ** r, budget_end, solver, tables):
                result.gap_annealed += 1
                done.add(cand.config)
                continue
            start = _shuffled_start(instance, cand, seed + r) if r % 2 else cand.placement
            if _anneal(instance, cand, result, seed + r, base * 2 ** r, budget_end - time.perf_counter(),
                       budget_end, start=start, repartition=solver):
                result.gap_annealed += 1
                done.add(cand.config)  # annealed: a later anneal of it may start cooler


def _slot_restart(instance, cand, result, seed: int, moves: int, budget_end: float, solver: str | None,
                  tables: dict, start: list | None = None) -> bool:
    """A restart of the configuration from `start` (a node order; None: a random one), annealed over whole-node
    orders on its slot tables (solvers/local/node_slots.py), its layers then re-split exactly with `solver` (None:
    kept); False where the tables do not apply."""
    if cand.placement is None or budget_end - time.perf_counter() < MIN_ANNEAL_S:
        return False
    found = _slot_tables(instance, cand, tables)
    if found is None:
        return False
    if start is None:
        start = [int(n) for n in np.random.default_rng(seed).permutation(len(instance.cluster.nodes))]
    _, order = slot_anneal(found, start, moves, seed, budget_end)
    placement = slot_placement(instance, cand.placement, order)
    _finish(instance, cand, result, placement, evaluate(instance, placement), solver, budget_end)
    result.annealed += 1
    return True


def _max_min_order(instance, cand, seed: int, groups: dict | None) -> list[int] | None:
    """The configuration's node order on max-min node groups (solvers/local/bottleneck.py) where its stages are
    three nodes or more; None for two (a random order starts those)."""
    if nodes_per_stage(instance, cand.config) < 3:
        return None
    return max_min_order(instance, cand.config, seed, groups)


def _slot_tables(instance, cand, tables: dict):
    """The configuration's node-slot tables for its best plan's split (cached; None where they do not apply)."""
    key = (cand.config, cand.placement.layers_per_stage)  # the tables hold the split's schedule
    if key not in tables:
        tables[key] = slot_tables(instance, cand.placement)
    return tables[key]


def _bottleneck(instance, cand, result, seed: int, groups: dict | None) -> None:
    """The configuration's stages on max-min node groups (solvers/local/bottleneck.py), kept if faster: where every
    stage is whole nodes, its dp sync runs at the slowest pair inside its group, which random node moves improve
    slowly."""
    if cand.placement is None:
        return
    start = bottleneck_start(instance, cand.config, cand.placement.layers_per_stage, seed, groups)
    if start is not None:
        _keep_if_faster(instance, cand, start, result)


def _relocate(instance, cand, result, deadline) -> None:
    if cand.placement is None:
        return
    moved = relocate_weak_nodes(instance, cand.placement, None if deadline == INF else deadline)
    if moved.gpus != cand.placement.gpus:
        _keep_if_faster(instance, cand, moved, result)


def _keep_if_faster(instance, cand, placement, result) -> None:
    """`placement` becomes the configuration's best if it fits and the evaluator scores it faster."""
    est = evaluate(instance, placement)
    if est.fits and est.iteration_time_s < cand.estimate.iteration_time_s:
        _keep(cand, placement, est, result)


def _keep(cand, placement, est, result) -> None:
    cand.placement, cand.estimate = placement, est
    cand.value = min(cand.value or INF, est.iteration_time_s)
    result.improved(est.iteration_time_s)


def _anneal(instance, cand, result, seed, moves, time_s, deadline, start="best",
            repartition: str | None = None, warm: float = 0.0) -> bool:
    """Anneal one configuration (from `start`, by default its best placement); keep what improves it. With
    `repartition` (a backend name) the annealed map's layers are re-split exactly. False if nothing fits."""
    if start == "best":
        start = cand.placement
    if time_s is not None and time_s < MIN_ANNEAL_S:
        return False
    try:
        found = anneal(instance, cand.config, seed=seed, max_moves=moves, time_limit_s=time_s, start=start,
                       warm=warm)
    except InfeasibleError:  # no split of the start's map fits: nothing to start from
        return False
    result.annealed += 1
    _finish(instance, cand, result, found.placement, found.estimate, repartition, deadline)
    return True


def _finish(instance, cand, result, placement, est, repartition: str | None, deadline: float) -> None:
    """A searched placement's layers re-split exactly for its map (with `repartition`, a backend name); kept as the
    configuration's best if it fits and is faster."""
    if repartition and placement.pp > 1 and time.perf_counter() < deadline:
        split = best_partition(instance, placement, solver=repartition,
                               time_limit_s=min(10.0, max(0.05, deadline - time.perf_counter())))
        if split is not None:
            better = evaluate(instance, split)
            if better.fits and better.iteration_time_s < est.iteration_time_s:
                placement, est = split, better
    if est.fits and (cand.estimate is None or est.iteration_time_s < cand.estimate.iteration_time_s):
        _keep(cand, placement, est, result)


def _shuffled_start(instance, cand, seed: int):
    """The configuration's default map with its node order shuffled (seeded): a restart elsewhere in the space
    of node permutations; the annealer repairs the split if it does not fit there."""
    cluster, config = instance.cluster, cand.config
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(cluster.nodes))
    gpus = cluster.gpus_of_nodes(order)
    world = config.tp * config.pp * config.cp * config.dp
    if cand.placement is not None:
        layers = cand.placement.layers_per_stage
    elif instance.model.num_layers % config.vpp == 0:
        layers = [u * config.vpp for u in even_split(instance.model.num_layers // config.vpp, config.pp)]
    else:
        return None  # the annealer's own start (the default map)
    return placement_for(config, layers, gpus[:world])
