"""Simulated annealing over one configuration's placements (layer partition + rank-to-GPU map), after Pipette.

    anneal(instance, config, seed=0, max_moves=None, time_limit_s=None, start=None, progress=None) -> AnnealResult

State: the full placement, i.e. `layers_per_stage` and a permutation of all the cluster's GPUs whose first
`world` entries are the GPUs of ranks 0..world-1 in Megatron-LM's tp-cp-dp-pp order (the rest are spares).
Every state visited fits in memory (evaluate()'s memory model: layers per stage and the GPU types of the stage);
moves that break it are rejected, and the start is repaired to a memory-feasible split when needed.

Moves (solvers/local/fast_score.py scores each incrementally, exactly as evaluate() would), drawn with MOVE_WEIGHTS:
  swap     two GPUs, preferably (3 in 4) on different nodes; never two GPUs of one uniform class (a no-op)
  pull     a rank takes a GPU from the node of a fellow member of its tp, cp or dp group (swap)
  gather   a group's members not on node n swap with n's GPUs, n the node of a random member: a tp group
           spread over nodes comes back inside one node in one move (single swaps cannot: the collective
           runs at its slowest link and the stage at its slowest group, so half-way states are no faster)
  nodes    all GPUs of two nodes exchanged (local index for local index); not for interchangeable nodes
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
the spread of sampled moves (the median of the uphill deltas of 64 proposals from the start, / ln 2: a typical
uphill move is accepted with probability 1/2), and cooling is geometric to T0 / 1000 over the move budget
(max_moves), or over the time limit when only time_limit_s is given. Exact ties in time (frequent: a stage's
time only sees its slowest group) are decided by Metropolis on the scorer's slack, the sum of all group
times, at a temperature calibrated and cooled the same way: it steers plateau moves towards faster groups
without ever trading iteration time for it. After a stall of a tenth of the budget (2,000 moves without a
budget) the walk restarts from the best state.

Determinism: numpy Generator(seed) drives every choice, so the same seed and max_moves give the same result on
any machine; time_limit_s is then only a safety stop. With time_limit_s alone (no max_moves) the run stops at
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

DEFAULT_MOVES = 20_000
CALIBRATION_MOVES = 64
FINAL_TEMPERATURE_RATIO = 1e-3
MOVE_WEIGHTS = {"swap": 0.15, "pull": 0.10, "gather": 0.20, "nodes": 0.10, "insert": 0.08, "reverse": 0.08,
                "segment": 0.09, "layer": 0.20}


@dataclass(frozen=True)
class AnnealResult:
    placement: Placement
    estimate: Estimate  # evaluate(instance, placement, check=True)
    moves: int  # proposals scored (including those rejected for memory)
    accepted: int
    wall_time_s: float
    start_s: float  # evaluate() of the start placement
    history: list = field(default_factory=list)  # (seconds since start, best iteration time) when the best improves


def config_of(placement: Placement) -> Config:
    return Config(*placement.config_key())


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
            if scorer._stage_fits(i, mid * vpp, scorer.tkeys[i]):
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


class _Moves:
    """Draws proposals on a FastScorer; keeps the inverse permutation up to date on commit."""

    def __init__(self, scorer: FastScorer, rng: np.random.Generator):
        self.sc, self.rng = scorer, rng
        cl = scorer.cluster
        self.node_of = [int(n) for n in cl.gpu_node]
        self.cls = scorer.class_of
        self.world, self.N = scorer.world, scorer.N
        self.multi_node = len(cl.nodes) > 1
        node_class = {}
        for k, members in enumerate(cl.interchangeable_nodes()):
            for n in members:
                node_class[n] = k
        self.node_class = node_class
        self.node_gpus = [list(range(int(cl.node_offset[n]), int(cl.node_offset[n + 1]))) for n in range(len(cl.nodes))]
        self.window = min(self.world, max(16, 2 * max(n.num_gpus for n in cl.nodes), 2 * scorer.tp * scorer.cp))
        gpu_moves = len(set(self.cls)) > 1 and self.world > 1
        node_moves = gpu_moves and len(set(node_class.values())) > 1
        layer_moves = scorer.pp > 1 and scorer.model.num_layers >= (scorer.pp + 1) * scorer.vpp
        enabled = {"swap": gpu_moves, "pull": gpu_moves and self.multi_node, "gather": gpu_moves and self.multi_node,
                   "nodes": node_moves, "insert": gpu_moves, "reverse": gpu_moves,
                   "segment": gpu_moves and self.window >= 4, "layer": layer_moves}
        self.kinds = [k for k, on in enabled.items() if on]
        w = np.array([MOVE_WEIGHTS[k] for k in self.kinds])
        self.cum = np.cumsum(w / w.sum()) if self.kinds else np.array([])
        self.reset_inverse()

    def reset_inverse(self) -> None:
        self.pos_of = [0] * self.N
        for x, g in enumerate(self.sc.perm):
            self.pos_of[g] = x

    def propose(self) -> tuple[str, float | None] | None:
        """One scored proposal (kind, total or None if it breaks memory), or None when the draw was a no-op."""
        pick = int(np.searchsorted(self.cum, self.rng.random(), side="right"))
        kind = self.kinds[min(pick, len(self.kinds) - 1)]
        if kind == "layer":
            return self._layer()
        changes = getattr(self, "_" + kind)()
        if changes is None:
            return None
        perm, cls = self.sc.perm, self.cls
        if not any(cls[g] != cls[perm[x]] for x, g in changes.items() if x < self.world):
            return None
        self.last = changes
        return kind, self.sc.propose_perm(changes)

    def commit(self, kind: str, total: float) -> None:
        self.sc.commit(total)
        if kind != "layer":
            for x, g in self.last.items():
                self.pos_of[g] = x

    def _swap(self):
        rng, perm = self.rng, self.sc.perm
        a = int(rng.integers(self.world))
        ga = perm[a]
        far = self.multi_node and rng.random() < 0.75
        for _ in range(8):
            g = int(rng.integers(self.N))
            if (far and self.node_of[g] == self.node_of[ga]) or self.cls[g] == self.cls[ga]:
                continue
            return {a: g, self.pos_of[g]: ga}
        return None

    def _group_of_random_rank(self):
        """(position of a random rank, positions of one of its tp / cp / dp groups), or None without groups."""
        rng, sc = self.rng, self.sc
        a = int(rng.integers(self.world))
        stage, q = divmod(a, sc.S)
        kinds = [k for k, size in (("tp", sc.tp), ("cp", sc.cp), ("dp", sc.dp * sc.cp)) if size > 1]
        if not kinds:
            return None
        kind = kinds[int(rng.integers(len(kinds)))]
        index = {"tp": q // sc.tp, "cp": (q // (sc.tp * sc.cp)) * sc.tp + q % sc.tp, "dp": q % sc.tp}[kind]
        return a, sc._group_positions(kind, stage, index)

    def _gather(self):
        """Bring GPUs of one node (that of a random member) into a group's other positions, swapping."""
        found = self._group_of_random_rank()
        if found is None:
            return None
        rng, perm = self.rng, self.sc.perm
        members = list(found[1])
        node = self.node_of[perm[members[int(rng.integers(len(members)))]]]
        inside = set(members)
        targets = [x for x in members if self.node_of[perm[x]] != node]
        spare = [g for g in self.node_gpus[node] if self.pos_of[g] not in inside]
        k = min(len(targets), len(spare))
        if k == 0:
            return None
        changes = {}
        for x, i in zip(rng.permutation(targets)[:k], rng.permutation(len(spare))[:k]):
            g = spare[int(i)]
            changes[int(x)] = g
            changes[self.pos_of[g]] = perm[int(x)]
        return changes

    def _pull(self):
        """Swap into rank a a GPU from the node of a fellow member of a's tp, cp or dp group (co-location)."""
        found = self._group_of_random_rank()
        if found is None:
            return None
        rng, perm = self.rng, self.sc.perm
        a, members = found
        b = members[int(rng.integers(len(members)))]
        node = self.node_gpus[self.node_of[perm[b]]]
        g = node[int(rng.integers(len(node)))]
        if self.cls[g] == self.cls[perm[a]]:
            return None
        return {a: g, self.pos_of[g]: perm[a]}

    def _nodes(self):
        rng = self.rng
        n_nodes = len(self.node_gpus)
        for _ in range(8):
            a, b = (int(v) for v in rng.choice(n_nodes, size=2, replace=False))
            if self.node_class[a] != self.node_class[b] and len(self.node_gpus[a]) == len(self.node_gpus[b]):
                changes = {}
                for ga, gb in zip(self.node_gpus[a], self.node_gpus[b]):
                    changes[self.pos_of[ga]] = gb
                    changes[self.pos_of[gb]] = ga
                return changes
        return None

    def _rotate(self, lo: int, hi: int, shift: int) -> dict:
        seg = self.sc.perm[lo:hi]
        new = seg[shift:] + seg[:shift]
        return {lo + k: g for k, g in enumerate(new) if g != seg[k]}

    def _range(self, length: int) -> tuple[int, int]:
        lo = int(self.rng.integers(self.world - length + 1))
        return lo, lo + length

    def _insert(self):
        lo, hi = self._range(int(self.rng.integers(2, self.window + 1)))
        return self._rotate(lo, hi, 1 if self.rng.random() < 0.5 else hi - lo - 1)

    def _reverse(self):
        lo, hi = self._range(int(self.rng.integers(2, self.window + 1)))
        seg = self.sc.perm[lo:hi]
        return {lo + k: g for k, g in enumerate(reversed(seg)) if g != seg[k]}

    def _segment(self):
        lo, hi = self._range(int(self.rng.integers(3, self.window + 1)))
        return self._rotate(lo, hi, int(self.rng.integers(2, min(hi - lo - 1, self.window // 2) + 1)))

    def _layer(self):
        """vpp layers (one chunk) from a stage to a neighbour (40% of draws), to any other stage (15%), from a
        slowest stage to a fastest (25%), or from every stage within 1% of the slowest to the fastest ones
        (20%: the pipeline term m x max_i t_i only drops once all the slowest stages do)."""
        sc, rng = self.sc, self.rng
        pp, vpp = sc.pp, sc.vpp
        layers = list(sc.layers)
        r = rng.random()
        if r < 0.55:
            src = int(rng.integers(pp))
            if r < 0.4:
                dst = src + (1 if rng.random() < 0.5 else -1)
                if not 0 <= dst < pp:  # the neighbour that exists
                    dst = 2 * src - dst
            else:
                dst = (src + int(rng.integers(1, pp))) % pp
            moves = [(src, dst)]
        else:
            times = [st[0] for st in sc.stages]
            top, low = max(times), min(times)
            if r < 0.8:
                slow = [i for i in range(pp) if times[i] == top]
                fast = [i for i in range(pp) if times[i] == low]
                moves = [(slow[int(rng.integers(len(slow)))], fast[int(rng.integers(len(fast)))])]
            else:
                slow = [i for i in range(pp) if times[i] >= 0.99 * top]
                fast = sorted((i for i in range(pp) if i not in slow), key=lambda i: (times[i], i)) or slow
                moves = [(src, fast[k % len(fast)]) for k, src in enumerate(slow)]
        for src, dst in moves:
            layers[src] -= vpp
            layers[dst] += vpp
        if layers == sc.layers or min(layers) < vpp:
            return None
        return "layer", sc.propose_layers(layers)


def start_scorer(instance, config: Config, start: Placement | None = None) -> FastScorer:
    """A scorer on the start: `start`, else Megatron's default split with ranks filled node by node; its split
    replaced by `feasible_split` when it does not fit. Raises `InfeasibleError` when no split fits that map."""
    N = instance.cluster.num_gpus
    world = config.tp * config.pp * config.cp * config.dp
    if start is not None:
        if config_of(start) != config:
            raise ValueError(f"start placement is for {config_of(start).describe()}, not {config.describe()}")
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
           time_limit_s: float | None = None, start: Placement | None = None, progress=None) -> AnnealResult:
    """Anneal the placement of one configuration (see the module docstring). `progress(moves, best_s)` is
    called every 1,000 moves. Raises `InfeasibleError` when no layer split of the start's GPU map fits."""
    t_start = time.perf_counter()
    rng = np.random.default_rng(seed)
    sc = start_scorer(instance, config, start)
    world = sc.world
    start_placement = sc.placement()
    start_s = evaluate(instance, start_placement, check=True).iteration_time_s
    moves_gen = _Moves(sc, rng)
    budget = max_moves if max_moves is not None else (None if time_limit_s is not None else DEFAULT_MOVES)
    deadline = t_start + time_limit_s if time_limit_s is not None else math.inf
    best, best_layers, best_perm = sc.total, list(sc.layers), list(sc.perm)
    history = [(time.perf_counter() - t_start, best)]

    def draw():
        """A scored proposal; None if 100 draws in a row were no-ops (nothing left to move)."""
        for _ in range(100):
            out = moves_gen.propose()
            if out is not None:
                return out
        return None

    # initial temperatures from the spread of sampled move deltas (all rejected): time, and slack on ties
    uphill, tie_uphill = [], []
    for _ in range(CALIBRATION_MOVES if moves_gen.kinds and budget != 0 else 0):
        out = draw()
        if out is None:
            break
        if out[1] is not None and out[1] > sc.total:
            uphill.append(out[1] - sc.total)
        elif out[1] == sc.total and sc.pending_slack > sc.slack:
            tie_uphill.append(sc.pending_slack - sc.slack)
        sc.reject()
    t0 = float(np.median(uphill)) / math.log(2) if uphill else max(sc.total * 1e-6, 1e-12)
    s0 = float(np.median(tie_uphill)) / math.log(2) if tie_uphill else t0
    stall = max(1, budget // 10) if budget else 2000
    moves = accepted = last_best = 0
    while moves_gen.kinds and (budget is None or moves < budget):
        now = time.perf_counter()
        if now >= deadline:
            break
        cooled = FINAL_TEMPERATURE_RATIO ** min(moves / budget if budget else (now - t_start) / time_limit_s, 1.0)
        out = draw()
        if out is None:
            break
        kind, total = out
        moves += 1
        if total is None:
            accept = False
        elif total != sc.total:  # Metropolis on the change of predicted iteration time (seconds)
            accept = total < sc.total or rng.random() < math.exp(-(total - sc.total) / (t0 * cooled))
        else:  # an exact tie: Metropolis on the slack (sum of all group times below the maxima)
            d = sc.pending_slack - sc.slack
            accept = d <= 0 or rng.random() < math.exp(-d / (s0 * cooled))
        if accept:
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
    estimate = evaluate(instance, placement, check=True)
    if not estimate.fits or abs(estimate.iteration_time_s - best) > 1e-9 * best:
        raise RuntimeError(f"annealing scorer disagrees with evaluate(): {best} vs {estimate.iteration_time_s} "
                           f"(fits={estimate.fits})")
    return AnnealResult(placement=placement, estimate=estimate, moves=moves, accepted=accepted,
                        wall_time_s=time.perf_counter() - t_start, start_s=start_s, history=history)
