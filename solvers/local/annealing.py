"""Simulated annealing over one configuration's placements (layer partition + rank-to-GPU map), after Pipette.

    anneal(instance, config, seed=0, max_moves=None, time_limit_s=None, start=None, progress=None,
           node_only=False, warm=0.0) -> AnnealResult

State: the full placement, i.e. `layers_per_stage` and a permutation of all the cluster's GPUs whose first
`world` entries are the GPUs of ranks 0..world-1 in Megatron-LM's tp-cp-dp-pp order (the rest are spares).
Every state visited fits in memory (evaluate()'s memory model: layers per stage and the GPU types of the stage);
moves that break it are rejected, and the start is repaired to a memory-feasible split when needed.

Moves (solvers/local/moves.py; solvers/local/fast_score.py scores each incrementally, exactly as evaluate()
would), drawn with MOVE_WEIGHTS (NODE_LEVEL_WEIGHTS where all GPUs of every node are alike):
  swap     two GPUs, preferably (3 in 4) on different nodes; never two GPUs of one uniform class (a no-op)
  pull     a rank takes a GPU from the node of a fellow member of its tp, cp or dp group (swap)
  gather   a group's members not on node n swap with n's GPUs, n the node of a random member: a tp group
           spread over nodes comes back inside one node in one move (single swaps cannot: the collective
           runs at its slowest link and the stage at its slowest group, so half-way states are no faster)
  nodes    all GPUs of two nodes exchanged (local index for local index); not for interchangeable nodes
  node_insert / node_reverse   Pipette's insert and segment-reverse over the order of whole nodes
  critical a node of one of the slowest pairs of a most exposed stage's dp sync swapped with another stage's
  insert   one rank's GPU moved to another position within a window, the ranks between shifted by one
  reverse  a segment of the rank order (length <= window) reversed
  segment  a segment (length <= window / 2) moved past its neighbours within the window
  layer    vpp layers (one chunk: every stage holds multiples of vpp) moved across a stage boundary: to a
           neighbour, to any stage, from a slowest stage to a fastest, or from every stage within 1% of the
           slowest to the fastest ones at once (m x max_i t_i drops only when all the slowest stages do)
Window = max(16, 2 x GPUs per node, 2 x tp x cp), at most the world size: segment moves change every rank in
the range they shift, so they are kept local to stay cheap. A proposal that changes no rank's GPU class is
redrawn (not counted).

Acceptance: Metropolis on the change of predicted iteration time in seconds, exp(-delta / T). T0 is set from
the spread of sampled moves: of 64 proposals from the start, each move kind's median uphill delta, and the median
of those with each kind weighing its share of the draws, / ln 2 (a typical uphill move is accepted with
probability 1/2). The kinds differ by orders of magnitude (measured_32 from its start: a node move 1e-4 to 1e-3 s,
a layer chunk 0.4 s, a GPU swap that splits a tp group 8 s), so the median of all samples pooled flipped to the
coarse kinds whenever they were half the uphill samples (as likely as not there), and such a walk stayed hot,
slow and random for most of its budget. Cooling is geometric to T0 / 1000 over the move budget (max_moves), or
over the time limit when only time_limit_s is given; `warm` (0 to 1) starts the schedule that far along
(T0 x 1000^-warm), for an anneal that continues from a placement an earlier anneal found: re-heated to T0 the
walk leaves it and, on a short budget, spends its time finding its way back (solvers/search/close_gap.py).
Exact ties in time (frequent: a stage's time only sees its slowest group) are decided by Metropolis on the
scorer's slack, the sum of all group times, at a temperature calibrated and cooled the same way: it steers
plateau moves towards faster groups without ever trading iteration time for it. After a stall of a tenth of
the budget (2,000 moves without a budget) the walk restarts from the best state.

Determinism: numpy Generator(seed) drives every choice, so the same seed and max_moves give the same result on
any machine when time_limit_s does not bind (with both given the cooling follows whichever is further along,
so a binding time limit still ends cold). With time_limit_s alone (no max_moves) the run stops at
the time limit and the schedule follows the clock: the number of moves, and so the result, depends on the
machine's speed. Neither given: max_moves = DEFAULT_MOVES.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from formulation.errors import InfeasibleError
from formulation.evaluate import Estimate, evaluate
from formulation.placement import Placement, check_placement, default_split, even_split
from formulation.space import Config, placement_for

from solvers.local.fast_score import FastScorer
from solvers.local.moves import Moves

DEFAULT_MOVES = 20_000
CALIBRATION_MOVES = 64
FINAL_TEMPERATURE_RATIO = 1e-3


@dataclass(frozen=True)
class AnnealResult:
    placement: Placement
    estimate: Estimate  # evaluate(instance, placement, check=True)
    moves: int  # proposals scored (including those rejected for memory)
    accepted: int
    wall_time_s: float
    start_s: float  # evaluate() of the start placement
    history: list = field(default_factory=list)  # (seconds since start, best iteration time) when the best improves


def feasible_split(scorer: FastScorer) -> list[int] | None:
    """A memory-feasible partition for the scorer's GPU map: the even split (in whole chunks of vpp layers)
    clipped to each stage's capacity, the remainder given to the stages with the most room. None if none fits."""
    L, pp, vpp = scorer.model.num_layers, scorer.pp, scorer.vpp
    units = L // vpp
    caps = []
    for i in range(pp):
        lo, hi = 0, units - (pp - 1)  # most units that fit (memory grows with the layer count)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if scorer.stage_fits(i, mid * vpp, scorer.tkeys[i]):
                lo = mid
            else:
                hi = mid - 1
        caps.append(lo)
    if L % vpp or min(caps) < 1 or sum(caps) < units:
        return None
    split = [min(t, c) for t, c in zip(even_split(units, pp), caps)]
    while sum(split) < units:
        i = max(range(pp), key=lambda s: (caps[s] - split[s], -s))
        split[i] += 1
    return [u * vpp for u in split]



def start_scorer(instance, config: Config, start: Placement | None = None) -> FastScorer:
    """A scorer on the start: `start`, else Megatron's default split with ranks filled node by node; its split
    replaced by `feasible_split` when it does not fit. Raises `InfeasibleError` when no split fits that map."""
    N = instance.cluster.num_gpus
    world = config.tp * config.pp * config.cp * config.dp
    if start is not None:
        if start.config != config:
            raise ValueError(f"start placement is for {start.config.describe()}, not {config.describe()}")
        used = set(start.gpus)
        layers, perm = list(start.layers_per_stage), list(start.gpus) + [g for g in range(N) if g not in used]
    else:
        layers, perm = default_split(instance.model.num_layers, config.pp, config.vpp), list(range(N))
        if layers is None:  # no Megatron default with interleaving: an even split in whole chunks
            layers = [u * config.vpp for u in even_split(instance.model.num_layers // config.vpp, config.pp)]
    check_placement(instance, placement_for(config, layers, perm[:world]), "<start placement>")
    sc = FastScorer(instance, config, layers, perm)
    if not sc.fits:
        split = feasible_split(sc)
        if split is None:
            raise InfeasibleError(f"{config.describe()}: no layer split fits in memory on the start's GPU map")
        sc.layers = split
        sc.rebuild()
    return sc


def anneal(instance, config: Config, *, seed: int = 0, max_moves: int | None = None,
           time_limit_s: float | None = None, start: Placement | None = None, progress=None,
           node_only: bool = False, warm: float = 0.0) -> AnnealResult:
    """Anneal the placement of one configuration (see the module docstring). `progress(moves, best_s)` is
    called every 1,000 moves; `node_only`: whole-node and layer moves only (Pipette's search space); `warm`:
    the share of the cooling schedule already done at the start (a continuation). Raises
    `InfeasibleError` when no layer split of the start's GPU map fits."""
    t_start = time.perf_counter()
    rng = np.random.default_rng(seed)
    sc = start_scorer(instance, config, start)
    world = sc.world
    start_placement = sc.placement()
    start_s = evaluate(instance, start_placement, check=True).iteration_time_s
    moves_gen = Moves(sc, rng, node_only=node_only)
    budget = max_moves if max_moves is not None else (None if time_limit_s is not None else DEFAULT_MOVES)
    deadline = t_start + time_limit_s if time_limit_s is not None else math.inf
    best, best_layers, best_perm = sc.total, list(sc.layers), list(sc.perm)
    history = [(time.perf_counter() - t_start, best)]

    t0, s0 = _initial_temperatures(sc, moves_gen, CALIBRATION_MOVES if moves_gen.kinds and budget != 0 else 0)
    stall = max(1, budget // 10) if budget else 2000
    moves = accepted = last_best = 0
    while moves_gen.kinds and (budget is None or moves < budget):
        now = time.perf_counter()
        if now >= deadline:
            break
        # the schedule follows whichever of the move budget and the clock is further along: a time limit that
        # binds before the moves are spent still ends cold
        done = max(moves / budget if budget else 0.0, (now - t_start) / time_limit_s if time_limit_s else 0.0)
        cooled = FINAL_TEMPERATURE_RATIO ** (warm + (1 - warm) * min(done, 1.0))
        out = _draw(moves_gen)
        if out is None:
            break
        kind, total = out
        moves += 1
        if _accept(sc, total, rng, t0 * cooled, s0 * cooled):
            moves_gen.commit(kind, total)
            accepted += 1
            if total < best:
                best, best_layers, best_perm, last_best = total, list(sc.layers), list(sc.perm), moves
                history.append((time.perf_counter() - t_start, best))
        else:
            sc.reject()
        if moves - last_best >= stall and sc.total > best:  # restart from the best state
            sc.layers, sc.perm = list(best_layers), list(best_perm)
            sc.rebuild()
            moves_gen.reset_inverse()
            last_best = moves
        if progress is not None and moves % 1000 == 0:
            progress(moves, best)
    placement = placement_for(config, best_layers, best_perm[:world])
    return AnnealResult(placement=placement, estimate=checked_estimate(instance, placement, best), moves=moves,
                        accepted=accepted, wall_time_s=time.perf_counter() - t_start, start_s=start_s,
                        history=history)


def _draw(moves_gen: Moves):
    """A scored proposal (kind, total or None); None if 100 draws in a row were no-ops (nothing left to move)."""
    for _ in range(100):
        out = moves_gen.propose()
        if out is not None:
            return out
    return None


def _initial_temperatures(sc, moves_gen: Moves, samples: int) -> tuple[float, float]:
    """Initial temperatures from the spread of sampled move deltas (all rejected): for time (a typical uphill
    move, `_typical_uphill`), and for the slack that breaks exact ties."""
    uphill, tie_uphill = {}, []
    for _ in range(samples):
        out = _draw(moves_gen)
        if out is None:
            break
        if out[1] is not None and out[1] > sc.total:
            uphill.setdefault(out[0], []).append(out[1] - sc.total)
        elif out[1] == sc.total and sc.pending_slack > sc.slack:
            tie_uphill.append(sc.pending_slack - sc.slack)
        sc.reject()
    t0 = _typical_uphill(uphill, moves_gen.weights) / math.log(2) if uphill else max(sc.total * 1e-6, 1e-12)
    s0 = float(np.median(tie_uphill)) / math.log(2) if tie_uphill else t0
    return t0, s0


def _typical_uphill(uphill: dict, weights: dict) -> float:
    """A typical uphill delta: each move kind's median uphill delta, and the median of those with each kind
    weighing its share of the draws (not its share of the uphill samples: a kind whose moves are always uphill
    would otherwise count for more than it is drawn)."""
    medians = sorted((float(np.median(deltas)), weights[kind]) for kind, deltas in uphill.items())
    half, seen = sum(w for _, w in medians) / 2, 0.0
    for value, w in medians:
        seen += w
        if seen >= half:
            return value
    return medians[-1][0]


def _accept(sc, total: float | None, rng, temperature: float, slack_temperature: float) -> bool:
    """Metropolis on the change of predicted iteration time (seconds); on an exact tie, on the slack (the sum of
    all group times below the maxima). A proposal that does not fit (total None) is rejected."""
    if total is None:
        return False
    if total != sc.total:
        return total < sc.total or rng.random() < math.exp(-(total - sc.total) / temperature)
    d = sc.pending_slack - sc.slack
    return d <= 0 or rng.random() < math.exp(-d / slack_temperature)


def checked_estimate(instance, placement: Placement, best: float):
    """The evaluator's estimate of the annealed placement, which must equal the incremental scorer's."""
    estimate = evaluate(instance, placement, check=True)
    if not estimate.fits or abs(estimate.iteration_time_s - best) > 1e-9 * best:
        raise RuntimeError(f"annealing scorer disagrees with evaluate(): {best} vs {estimate.iteration_time_s} "
                           f"(fits={estimate.fits})")
    return estimate
