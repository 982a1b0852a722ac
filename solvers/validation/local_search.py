"""Baselines for `solve bench` that use no bound: a plain local search over every configuration, and a
Pipette-style simulated annealing that permutes whole nodes of a given configuration.

`local_search(instance, time_limit_s, seed)`: every configuration with a split that fits starts from its
default map (split repaired to fit), scored by the incremental scorer (which calls the evaluator's own
functions, so its score is evaluate()'s). Then successive halving: round r climbs each configuration still in
the pool for 200 x 2^r proposals (the annealer's move set: GPU swaps, node swaps / inserts / reverses, group
gathers, layer moves; accepted when not worse), from its best placement on even rounds and from a random node
order on odd rounds (a restart), and keeps the better half of the pool for the next round; once one is left it
keeps restarting and climbing it until the time is up. No bound, no exact program: it is what a careful user
would write against `evaluate()`, run at the planner's wall time so "at least as good as local search" is
measured.

`node_sa(instance, config, time_limit_s, seed)`: the annealer restricted to node moves and layer moves from the
configuration's default map (Pipette's search space: whole nodes permuted, layers moved across stage
boundaries), calibrated as the planner's annealer is (Pipette sets its initial temperature by hand; the
baseline takes the same automatic rule as `auto`, so that a better rule cannot favour one side).
"""

from __future__ import annotations

import time

import numpy as np

from formulation.errors import InfeasibleError
from formulation.evaluate import evaluate
from formulation.space import Config, configurations, partition_fits, placement_for

from solvers.local.annealing import anneal, start_scorer
from solvers.local.fast_score import FastScorer
from solvers.local.moves import Moves

FIRST_ROUND_MOVES = 200


def _climb(scorer, rng, moves: int, deadline: float) -> None:
    """Greedy: accept a proposal when it is not worse (plateaus are walked), `moves` proposals or the deadline."""
    gen = Moves(scorer, rng)
    for k in range(moves):
        if k % 32 == 0 and time.perf_counter() >= deadline:
            return
        out = gen.propose()
        if out is None:
            continue
        kind, total = out
        if total is not None and total <= scorer.total:
            gen.commit(kind, total)
        else:
            scorer.reject()


def _restart_perm(instance, rng) -> list[int]:
    cl = instance.cluster
    return cl.gpus_of_nodes(rng.permutation(len(cl.nodes)))


def local_search(instance, time_limit_s: float, seed: int = 0) -> tuple:
    """(placement, estimate, history) of the best placement found within `time_limit_s` (module docstring);
    history: (seconds, best time) at every improvement."""
    started = time.perf_counter()
    deadline = started + time_limit_s
    rng = np.random.default_rng(seed)
    biggest = max(instance.cluster.gpu_types.values(), key=lambda g: g.memory_gib)
    pool, history, best = [], [], None  # pool: [best total, config, layers, perm]
    for config in configurations(instance):
        if time.perf_counter() >= deadline and best is not None:
            break
        if not partition_fits(instance, config, biggest)[0]:
            continue
        try:
            sc = start_scorer(instance, config)
        except InfeasibleError:
            continue
        pool.append([sc.total, config, list(sc.layers), list(sc.perm)])
        if best is None or sc.total < best[0]:
            best = pool[-1][:]
            history.append((time.perf_counter() - started, sc.total))
    if best is None:
        raise InfeasibleError("local search: no configuration has a layer split that fits")
    r = 0
    while time.perf_counter() < deadline:
        pool.sort(key=lambda e: (e[0], e[1]))
        for entry in pool:
            if time.perf_counter() >= deadline:
                break
            total, config, layers, perm = entry
            if r % 2 == 0:
                sc = FastScorer(instance, config, layers, perm)
            else:  # a restart: the same configuration on a random node order, split repaired to fit
                start = placement_for(config, layers, _restart_perm(instance, rng)[:_world(config)])
                try:
                    sc = start_scorer(instance, config, start)
                except InfeasibleError:
                    continue
            _climb(sc, rng, FIRST_ROUND_MOVES * 2 ** r, deadline)
            if sc.fits and sc.total < total:
                entry[:] = [sc.total, config, list(sc.layers), list(sc.perm)]
            if sc.fits and sc.total < best[0]:
                best = entry[:]
                history.append((time.perf_counter() - started, sc.total))
        pool.sort(key=lambda e: (e[0], e[1]))
        pool = pool[:max(1, len(pool) // 2)]
        r += 1
    placement = placement_for(best[1], best[2], best[3][:_world(best[1])])
    estimate = evaluate(instance, placement)
    return placement, estimate, history


def _world(config: Config) -> int:
    return config.tp * config.pp * config.cp * config.dp


def node_sa(instance, config: Config, time_limit_s: float, seed: int = 0):
    """Pipette-style SA on `config`: node and layer moves only, from the default map, for `time_limit_s`."""
    return anneal(instance, config, seed=seed, time_limit_s=time_limit_s, node_only=True)
