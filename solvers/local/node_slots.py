"""Whole-node stages scored from tables: a fast annealer over the order of the cluster's nodes (issue 19).

Where every stage is K >= 2 whole nodes of one GPU type (solvers/local/bottleneck.py's `nodes_per_stage`), tp and
cp groups lie inside a node (tp x cp divides the GPUs per node) and the model has no experts and no per-layer dp
collectives (ZeRO-2 and 3), a node-contiguous map is a node order: stage i's slot s holds node order[i K + s], whose GPUs serve the stage's
ranks s g .. (s + 1) g - 1 in local order. Its evaluator time is then

    t(order) = F + sum_j w_j max_s c[order[j K + s], order[(j + 1) K + s]] + max_i max_{a, b in stage i} e_i[a, b]

- F: the schedule (C9), optimizer step (C13) and per-iteration overhead, the same for every order (the stages'
  compute and tp / cp communication stay inside nodes of one kind);
- c[n, m]: one pipeline send from node n's GPU l to node m's GPU l at the slowest l (C7, C10), w_j the chain's
  weight of boundary j (C10: 2 x rounds x vpp, and 2 x (vpp - 1) for the last-to-first wrap of an interleaved
  schedule);
- e_i[a, b]: stage i's exposed dp sync (C11) if its dp groups' slowest inter-node pair is (a, b) (C5: a
  collective runs at the slowest pair of each level).

The tables are built from the evaluator's own functions: F is evaluate() of the node order 0, 1, ..., n - 1 less
the rest, and the tables must then give evaluate()'s time on CHECK_ORDERS random orders before they are used
(`slot_tables` returns None where they do not). A cluster they cannot describe (a node with other NVLink figures,
GPU pairs with figures of their own) is left to the annealer at once. A proposal costs table look-ups for the
stages and boundaries it touches, not a FastScorer update: on measured_16 about 93,000 a second, the annealer's
about 12,000 (one run of each, two seeds: 7.6-7.8 times).

`slot_anneal` is simulated annealing over node orders with Pipette's node moves (a swap of two nodes, the reverse
of a segment of the order, a segment rotated by one): a reverse is a 2-opt move on the K chains of sends (one
per slot), a rotation re-pairs every stage it spans. On measured_16 (tp=4 pp=8 dp=4 vpp=2, 8 stages of 2 nodes)
the plans that matter share their exposed dp sync (one stage's, at its floor), and what separates them is the
chain of sends; from a random order 1.5 million proposals end in one of a few optima (7.682384, 7.682575,
7.682699 s), the first in half of the runs. The search restarts on these tables (solvers/search/close_gap.py).
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, replace

import numpy as np

from formulation.evaluate import evaluate, stage_estimate
from formulation.stage_links import pipeline_message, pipeline_send, stage_links
from formulation.physics import cost, moe_cost
from formulation.physics.v_schedules import V_FAMILIES
from formulation.space import placement_for

from solvers.local.annealing import CALIBRATION_MOVES, FINAL_TEMPERATURE_RATIO  # the annealer's schedule
from solvers.local.bottleneck import nodes_per_stage

MAX_NODES = 64  # the exposure table has pp x n^2 / 2 entries, each a stage estimate: 0.3-0.5 s at 64 nodes
CHECK_ORDERS = 3  # random orders on which the tables must give evaluate()'s time before they are used
TOLERANCE = 1e-9  # relative
MIN_WINDOW = 8  # longest segment a reverse or rotation moves, at least two stages' nodes


@dataclass(frozen=True)
class SlotTables:
    """The time of a node order of one configuration and layer split (module docstring)."""

    nodes_per_stage: int  # K
    pp: int
    send: tuple  # send[n][m], seconds
    exposed: tuple  # exposed[i][n][m], seconds
    weights: tuple  # w_j, j = 0 .. pp - 1 (pp - 1: the wrap)
    fixed_s: float  # F


def slot_tables(instance, placement) -> SlotTables | None:
    """The tables of `placement`'s configuration and layer split, or None where they do not apply or do not
    reproduce evaluate() (module docstring)."""
    config, cluster = placement.config, instance.cluster
    K = nodes_per_stage(instance, config)
    per_node = cluster.nodes[0].num_gpus
    if (not K or len(cluster.nodes) > MAX_NODES or moe_cost.is_moe(instance.model) or placement.zero_stage >= 2
            or placement.dp_replicate > 1
            or per_node % (config.tp * config.cp) or cluster.gpu_pair_gb_per_s or cluster.has_domains
            or any(not np.array_equal(m, cluster.intra_gb_per_s[0]) for m in cluster.intra_gb_per_s)):
        return None  # a node's links inside or GPU pairs of their own: its place would change more than the tables
    base = slot_placement(instance, placement, range(len(cluster.nodes)))
    est = evaluate(instance, base)
    if not est.fits:
        return None
    tables = _tables(instance, base, K)
    tables = replace(tables, fixed_s=est.iteration_time_s - slot_time(tables, range(len(cluster.nodes))))
    rng = np.random.default_rng(0)
    for _ in range(CHECK_ORDERS):
        order = [int(n) for n in rng.permutation(len(cluster.nodes))]
        want = evaluate(instance, slot_placement(instance, placement, order)).iteration_time_s
        if abs(slot_time(tables, order) - want) > TOLERANCE * want:
            return None
    return tables


def _tables(instance, base, K: int) -> SlotTables:
    """The tables of `base` (a node-contiguous placement), F still 0."""
    cluster, pp = instance.cluster, base.pp
    n, per_node = len(cluster.nodes), cluster.nodes[0].num_gpus
    first = [int(cluster.node_offset[a]) for a in range(n)]
    message = pipeline_message(instance, base)
    send = [[0.0 if a == b else max(pipeline_send(cluster, message, first[a] + l, first[b] + l)
                                    for l in range(per_node)) for b in range(n)] for a in range(n)]
    inter = {(a, b): cluster.group_links(np.array([first[a], first[b]]))[1]
             for a, b in itertools.combinations(range(n), 2)}
    exposed = []
    for i in range(pp):
        links = stage_links(instance, base, i)
        row = [[0.0] * n for _ in range(n)]
        for (a, b), gb_per_s in inter.items():
            dp = tuple(replace(group, inter_gb_per_s=gb_per_s) for group in links.dp_links)
            row[a][b] = row[b][a] = stage_estimate(instance, base, i, base.layers_per_stage[i],
                                                   links=replace(links, dp_links=dp)).dp_exposed_s
        exposed.append(tuple(tuple(r) for r in row))
    # (C10) is linear in the boundary times: each one's weight is the chain of a unit time there and 0 elsewhere
    m = base.num_micro_batches(instance.training.global_batch_size)
    wraps = base.schedule not in V_FAMILIES  # a V sends no wrap (docs/schedules.md (S3))
    weights = tuple(cost.p2p_chain([float(j == k) for j in range(pp - 1)], float(k == pp - 1 and wraps), m, pp,
                                   base.vpp) for k in range(pp))
    return SlotTables(K, pp, tuple(tuple(r) for r in send), tuple(exposed), weights, 0.0)


def slot_placement(instance, placement, order):
    """`placement`'s configuration and layer split on the node-contiguous map of `order`."""
    return placement_for(placement.config, placement.layers_per_stage, instance.cluster.gpus_of_nodes(order))


def _boundary(t: SlotTables, order, j: int) -> float:
    K, nxt = t.nodes_per_stage, (j + 1) % t.pp
    return max(t.send[order[j * K + s]][order[nxt * K + s]] for s in range(K))


def _stage(t: SlotTables, order, i: int) -> float:
    K, e = t.nodes_per_stage, t.exposed[i]
    return max(e[a][b] for a, b in itertools.combinations(order[i * K:(i + 1) * K], 2))


def slot_time(t: SlotTables, order) -> float:
    """The evaluator's iteration time of the node order (module docstring; equal to it up to float rounding)."""
    return _Walk(t, order).total


class _Walk:
    """A node order with its boundaries' and stages' terms, moved and scored incrementally."""

    def __init__(self, tables: SlotTables, order):
        self.t, self.order = tables, list(order)
        self.bounds = [_boundary(tables, self.order, j) for j in range(tables.pp)]
        self.stages = [_stage(tables, self.order, i) for i in range(tables.pp)]
        self.total = self._total(self.bounds, self.stages)
        self.pending = None

    def _total(self, bounds, stages) -> float:
        return self.t.fixed_s + sum(w * b for w, b in zip(self.t.weights, bounds)) + max(stages)

    def propose(self, changes: dict) -> float:
        """The time with positions moved as `changes` says (position -> node); `commit` or `reject` next."""
        old = {x: self.order[x] for x in changes}
        for x, node in changes.items():
            self.order[x] = node
        K, pp = self.t.nodes_per_stage, self.t.pp
        touched = {x // K for x in changes}
        bounds, stages = list(self.bounds), list(self.stages)
        for i in touched:
            stages[i] = _stage(self.t, self.order, i)
        for j in touched | {(i - 1) % pp for i in touched}:
            bounds[j] = _boundary(self.t, self.order, j)
        self.pending = (old, bounds, stages)
        return self._total(bounds, stages)

    def commit(self, total: float) -> None:
        _, self.bounds, self.stages = self.pending
        self.total = total

    def reject(self) -> None:
        for x, node in self.pending[0].items():
            self.order[x] = node


def _random_move(rng, order: list, window: int) -> dict:
    """A swap of two nodes, the reverse of a segment of the order, or a segment rotated by one (a third each), as
    the positions it changes (position -> node)."""
    n, kind = len(order), rng.random()
    if kind < 1 / 3:
        a, b = (int(v) for v in rng.choice(n, size=2, replace=False))
        return {a: order[b], b: order[a]}
    length = int(rng.integers(3, min(n, window) + 1))
    lo = int(rng.integers(n - length + 1))
    seg = order[lo:lo + length]
    new = seg[::-1] if kind < 2 / 3 else seg[1:] + seg[:1] if rng.random() < 0.5 else seg[-1:] + seg[:-1]
    return {lo + k: node for k, node in enumerate(new) if node != seg[k]}


def slot_anneal(tables: SlotTables, order, moves: int, seed: int = 0,
                deadline: float = math.inf) -> tuple[float, list[int]]:
    """(time, order) of the best node order an anneal of `moves` proposals from `order` finds (deterministic per
    seed unless `deadline`, a time.perf_counter() value, stops it first). T0: the median uphill change of
    CALIBRATION_MOVES proposals from the start / ln 2, cooled geometrically to T0 / 1000 over the moves or the
    time to the deadline, whichever runs out first (so a deadline that binds still ends cold); after a tenth of
    the budget without a new best the walk goes back to the best order."""
    rng = np.random.default_rng(seed)
    walk = _Walk(tables, order)
    n = len(walk.order)
    window = min(n, max(MIN_WINDOW, 2 * tables.nodes_per_stage))
    uphill = []
    for _ in range(CALIBRATION_MOVES):
        total = walk.propose(_random_move(rng, walk.order, window))
        walk.reject()
        if total > walk.total:
            uphill.append(total - walk.total)
    t0 = float(np.median(uphill)) / math.log(2) if uphill else walk.total * 1e-6
    best, best_order = walk.total, list(walk.order)
    stall, last_best = max(1, moves // 10), 0
    started, clock = time.perf_counter(), 0.0
    for k in range(moves):
        if k % 256 == 0:  # the schedule follows the move count or the clock, whichever is further along
            now = time.perf_counter()
            if now >= deadline:
                break
            clock = (now - started) / (deadline - started) if deadline != math.inf else 0.0
        total = walk.propose(_random_move(rng, walk.order, window))
        if total <= walk.total or rng.random() < math.exp(
                -(total - walk.total) / (t0 * FINAL_TEMPERATURE_RATIO ** max(k / moves, clock))):
            walk.commit(total)
            if total < best:
                best, best_order, last_best = total, list(walk.order), k
        else:
            walk.reject()
        if k - last_best >= stall and walk.total > best:
            walk = _Walk(tables, best_order)
            last_best = k
    return best, best_order
