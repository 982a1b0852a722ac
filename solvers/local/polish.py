"""Iterated descent: the last touch of a search on a plan that annealing brought near a local optimum.

An anneal ends cold but not at a local optimum of its own moves: its proposals are random, and at the end of
the schedule it stops after a fixed number of them. A descent tries every neighbour in turn instead: every swap
of two nodes that are not interchangeable (the node order is where the gains are on clusters whose nodes differ,
issue 19) and every move of one layer chunk (vpp layers) from a stage to another, first improvement taken, until
none improves. On 16 nodes a sweep over the 120 node pairs costs about 20 ms, so many descents fit in a second:
iterated descent (Lourenco, Martin and Stuetzle's iterated local search) kicks the best plan with KICK_MOVES
random node moves (swaps, inserts, reverses of a segment of the node order), descends, and keeps the result when
it is better; otherwise it goes back to the best. Measured on measured_16 from `auto`'s 10 s plans (3 seeds):
one descent took 7.807769 s to itself (a local optimum already) and 7.807697 s to 7.807283 s; three seconds of
kicks took them to 7.807064 s and 7.807236 s, where a node-permutation SA over the whole 10 s ends at 7.80706-
7.80755 s. On 64 nodes a sweep costs about 0.4 s and the descent alone gains 0.01-0.02 %.

Every committed move is scored by the annealer's FastScorer (the evaluator's arithmetic, incrementally), and the
result is checked against `evaluate()` as the annealer's is.
"""

from __future__ import annotations

import itertools
import time

import numpy as np

from formulation.space import placement_for
from solvers.local.annealing import AnnealResult, checked_estimate, start_scorer
from solvers.local.moves import Moves

KICK_MOVES = (2, 3)  # a kick is 2 or 3 random node moves (fewer returns to the same optimum; more is a restart)
CLOCK_EVERY = 16  # proposals between looks at the clock inside a sweep


def _improves(total, current: float) -> bool:
    return total is not None and total < current * (1 - 1e-12)


class _Tally:
    """Proposals scored and taken (AnnealResult's `moves` and `accepted`)."""

    def __init__(self):
        self.scored = self.taken = 0

    def take_if(self, sc, total, better: bool) -> bool:
        """Count a scored proposal; True if it is to be committed (`better`, or any fitting one)."""
        self.scored += 1
        ok = total is not None and (_improves(total, sc.total) if better else True)
        if ok:
            self.taken += 1
        else:
            sc.reject()
        return ok


def _node_sweep(sc, mv: Moves, tally: _Tally, deadline: float) -> bool:
    """One pass over every pair of nodes of different classes and equal size; True if a swap was taken."""
    improved = False
    for k, (a, b) in enumerate(itertools.combinations(range(len(mv.node_gpus)), 2)):
        if k % CLOCK_EVERY == 0 and time.perf_counter() >= deadline:
            break
        changes = mv.node_swap(a, b)
        if changes is not None:
            total = mv.score(changes)
            if tally.take_if(sc, total, better=True):
                mv.commit("nodes", total)
                improved = True
    return improved


def _layer_sweep(sc, tally: _Tally, deadline: float) -> bool:
    """One pass over every move of one chunk (vpp layers) from a stage to another; True if one was taken."""
    improved = False
    for src, dst in itertools.permutations(range(sc.pp), 2):
        if time.perf_counter() >= deadline:
            break
        if sc.layers[src] < 2 * sc.vpp:  # every stage keeps at least one chunk
            continue
        layers = list(sc.layers)
        layers[src] -= sc.vpp
        layers[dst] += sc.vpp
        total = sc.propose_layers(layers)
        if tally.take_if(sc, total, better=True):
            sc.commit(total)
            improved = True
    return improved


def descend(sc, mv: Moves, tally: _Tally, deadline: float, max_sweeps: int | None = None) -> None:
    """Node and layer sweeps until neither improves (a local optimum of both), the deadline or `max_sweeps`."""
    sweeps = 0
    while time.perf_counter() < deadline and (max_sweeps is None or sweeps < max_sweeps):
        sweeps += 1
        nodes = _node_sweep(sc, mv, tally, deadline) if mv.node_moves else False
        layers = _layer_sweep(sc, tally, deadline) if sc.pp > 1 else False
        if not (nodes or layers):
            break


def polish(instance, start, *, seed: int = 0, time_limit_s: float | None = None,
           max_sweeps: int | None = None, kicks: bool = True) -> AnnealResult:
    """Descend from `start` (a fitting placement) for at most `max_sweeps` sweeps; with a time limit (and `kicks`),
    then kick and descend again until it is spent (iterated descent). Without kicks the result is deterministic
    unless the time limit cuts the descent short."""
    t_start = time.perf_counter()
    deadline = t_start + time_limit_s if time_limit_s is not None else float("inf")
    rng = np.random.default_rng(seed)
    sc = start_scorer(instance, start.config, start)
    mv = Moves(sc, rng)
    start_s = sc.total
    history = [(0.0, start_s)]
    tally = _Tally()
    descend(sc, mv, tally, deadline, max_sweeps)
    best, best_perm, best_layers = sc.total, list(sc.perm), list(sc.layers)
    if best < start_s:
        history.append((time.perf_counter() - t_start, best))
    while kicks and time_limit_s is not None and mv.node_moves and time.perf_counter() < deadline:
        for _ in range(int(rng.integers(KICK_MOVES[0], KICK_MOVES[1] + 1))):
            changes = mv.node_kick()
            if changes is not None:
                total = mv.score(changes)
                if tally.take_if(sc, total, better=False):  # a kick goes uphill too, if it fits
                    mv.commit("nodes", total)
        descend(sc, mv, tally, deadline)
        if _improves(sc.total, best):
            best, best_perm, best_layers = sc.total, list(sc.perm), list(sc.layers)
            history.append((time.perf_counter() - t_start, best))
        elif sc.perm != best_perm or sc.layers != best_layers:
            sc.perm, sc.layers = list(best_perm), list(best_layers)
            sc.rebuild()
            mv.reset_inverse()
    placement = placement_for(start.config, best_layers, best_perm[:sc.world])
    return AnnealResult(placement=placement, estimate=checked_estimate(instance, placement, best), moves=tally.scored,
                        accepted=tally.taken, wall_time_s=time.perf_counter() - t_start, start_s=start_s,
                        history=history)
