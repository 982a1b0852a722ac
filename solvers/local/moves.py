"""Proposals for the annealer (solvers/local/annealing.py) and the local searches: moves over one configuration's
placement (layer partition + rank-to-GPU permutation), each scored incrementally by a FastScorer.

GPU-level moves (swap, pull, gather, insert, reverse, segment) act on single ranks; node-level moves act on
whole nodes, after Pipette: `nodes` swaps two nodes, `node_insert` moves a node to another slot of the node
order (the nodes between shift by one slot), `node_reverse` reverses a segment of the node order, `critical`
swaps a node of one of the slowest inter-node pairs of a stage whose data-parallel sync is most exposed with a
node of another stage (that sync runs at its slowest pair: a random swap rarely touches it). The node
order is the order of the ranks their first GPUs serve; a node move relabels GPUs (local index for local index,
between nodes of equal size), so it keeps every tp / cp group's intra-node structure and applies to any
permutation, node-contiguous or not. On clusters whose structure is node-level (every node one uniform class:
all GPUs of a node alike) and a start whose nodes serve contiguous blocks of ranks or whose tp groups each lie in
one node, the node moves get most of the weight (NODE_LEVEL_WEIGHTS, node swaps critical ones): their space is
much smaller; a start that splits tp groups keeps the GPU moves that repair it. `node_only=True` draws Pipette's
node moves (random swaps, inserts, reverses) and layer moves only (PIPETTE_WEIGHTS: the baseline of `solve bench`).
"""

from __future__ import annotations

import numpy as np

from solvers.local.fast_score import FastScorer

MOVE_WEIGHTS = {"swap": 0.15, "pull": 0.10, "gather": 0.20, "nodes": 0.10, "insert": 0.08, "reverse": 0.08,
                "segment": 0.09, "layer": 0.20, "node_insert": 0.0, "node_reverse": 0.0, "critical": 0.0}
# all GPUs of every node alike: most draws permute whole nodes (a much smaller space, and the moves keep the
# groups' class multisets among few, so their scores come from the caches); a few GPU moves for groups that
# should straddle nodes. The node swaps are critical ones (measured_64, 100,000 proposals from the search's
# start, 4 seeds: median 8.078 s with random swaps, 8.067 s with critical ones; measured_32, 8 seeds: 7.955 s
# and 7.957 s); where a stage's slowest figure is shared (leaf blocks) they are mostly redrawn, which is cheap
NODE_LEVEL_WEIGHTS = {"swap": 0.01, "pull": 0.01, "gather": 0.01, "nodes": 0.0, "insert": 0.004, "reverse": 0.003,
                      "segment": 0.003, "layer": 0.25, "node_insert": 0.22, "node_reverse": 0.22, "critical": 0.25}
# node_only (Pipette's space and moves, the bench's node-SA baseline): random node swaps, inserts and reverses
PIPETTE_WEIGHTS = {"nodes": 0.25, "layer": 0.25, "node_insert": 0.22, "node_reverse": 0.22}
NODE_WINDOW = 8  # longest node segment an insert or reverse moves (each node moved rescores its groups)
CRITICAL_PAIRS = 3  # a critical move takes a node of one of this many slowest pairs of an exposed stage

class Moves:
    """Draws proposals on a FastScorer; keeps the inverse permutation up to date on commit."""

    def __init__(self, scorer: FastScorer, rng: np.random.Generator, node_only: bool = False):
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
                   "segment": gpu_moves and self.window >= 4, "layer": layer_moves,
                   "node_insert": node_moves and len(cl.nodes) > 2, "node_reverse": node_moves and len(cl.nodes) > 2,
                   "critical": node_moves and scorer.dp * scorer.cp > 1}
        self.node_moves = node_moves
        self.reset_inverse()
        # every node one uniform class (all its GPUs alike) and the start node-aligned (_node_aligned): node moves first
        node_level = len(set(self.cls)) == len(cl.nodes) and self._node_aligned()
        weights = PIPETTE_WEIGHTS if node_only else NODE_LEVEL_WEIGHTS if node_level else MOVE_WEIGHTS
        self.kinds = [k for k, on in enabled.items() if on and weights.get(k, 0) > 0]
        self._order = None  # node order (by the rank its first GPU serves), recomputed after a map move
        self.weights = {k: weights[k] for k in self.kinds}
        w = np.array([weights[k] for k in self.kinds])
        self.cum = np.cumsum(w / w.sum()) if self.kinds else np.array([])
        self.reset_inverse()

    def _node_aligned(self) -> bool:
        """Whether every node's GPUs serve one contiguous block of ranks (or no rank), or every tp group (of
        more than one GPU) lies inside one node: node moves keep either. An annealed map is often the second
        (a GPU move that shifts whole tp groups between nodes); a start that splits tp groups across nodes is
        what the GPU moves repair."""
        node_of, perm, tp = self.node_of, self.sc.perm, self.sc.tp
        if tp > 1 and all(len({node_of[perm[x]] for x in range(lo, lo + tp)}) == 1
                          for lo in range(0, self.world, tp)):
            return True
        for gpus in self.node_gpus:
            ranks = sorted(self.pos_of[g] for g in gpus if self.pos_of[g] < self.world)
            if ranks and ranks[-1] - ranks[0] != len(ranks) - 1:
                return False
        return True

    def reset_inverse(self) -> None:
        self._order = None  # the node order follows the permutation
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
        return kind, self.score(changes)

    def score(self, changes: dict) -> float | None:
        """The scorer's total with the map changed by `changes` (position -> GPU), None if a stage stops fitting;
        follow with `commit(kind, total)` or `sc.reject()`."""
        self.last = changes
        return self.sc.propose_perm(changes)

    def commit(self, kind: str, total: float) -> None:
        self.sc.commit(total)
        if kind != "layer":
            for x, g in self.last.items():
                self.pos_of[g] = x
            self._order = None

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
        n_nodes = len(self.node_gpus)
        for _ in range(8):
            a, b = (int(v) for v in self.rng.choice(n_nodes, size=2, replace=False))
            changes = self.node_swap(a, b)
            if changes is not None:
                return changes
        return None

    def node_swap(self, a: int, b: int):
        """Nodes a and b trade the ranks they serve (local index for local index); None if they are
        interchangeable or differ in size."""
        if self.node_class[a] == self.node_class[b] or len(self.node_gpus[a]) != len(self.node_gpus[b]):
            return None
        changes = {}
        for ga, gb in zip(self.node_gpus[a], self.node_gpus[b]):
            changes[self.pos_of[ga]] = gb
            changes[self.pos_of[gb]] = ga
        return changes

    def node_kick(self):
        """One random node move, a swap, an insert or a reverse of a segment of the node order (the kick of
        solvers/local/polish.py's iterated descent); None when the draw found none."""
        r = self.rng.random()
        if len(self.node_gpus) > 2 and r < 2 / 3:
            return self._node_insert() if r < 1 / 3 else self._node_reverse()
        return self._nodes()

    def _critical(self):
        """Pipette's node swap aimed at the bottleneck: a stage whose data-parallel sync is exposed within 1 % of
        the most, one of the CRITICAL_PAIRS slowest inter-node pairs among its GPUs' nodes (the slowest binds the
        sync; the next ones bind once it is gone), and one node of that pair swapped with a node of another
        stage. The sync of a stage runs at its slowest pair, so a random swap rarely touches what decides it.
        Where no stage's sync is exposed: an end of the slowest send across a random pipeline boundary."""
        sc, rng = self.sc, self.rng
        top = max(st[1] for st in sc.stages)
        if top <= 0:
            if not sc.pairs:
                return None
            j = int(rng.integers(len(sc.pairs)))
            q = sc.pairs[j].index(sc.pair_max[j])
            ends = (j * sc.S + q, ((j + 1) % sc.pp) * sc.S + q)
            return self._swap_node(self.node_of[sc.perm[ends[int(rng.integers(2))]]], set())
        near = [i for i in range(sc.pp) if sc.stages[i][1] >= 0.99 * top]
        stage = near[int(rng.integers(len(near)))]
        nodes = np.unique([self.node_of[g] for g in sc.perm[stage * sc.S:(stage + 1) * sc.S]])
        if len(nodes) < 2:
            return None
        links = np.array(sc.cluster.inter_gb_per_s[np.ix_(nodes, nodes)], dtype=float)
        links[np.triu_indices(len(nodes))] = np.inf  # each pair once
        lows = np.argwhere(links == links.min())
        if len(lows) > 1:  # the slowest figure shared: only a node in all those pairs can lift it, if any
            common = set(lows[0].tolist()).intersection(*(set(p.tolist()) for p in lows[1:]))
            return self._swap_node(int(nodes[min(common)]), set(nodes.tolist())) if common else None
        pairs = len(nodes) * (len(nodes) - 1) // 2
        slowest = np.argsort(links, axis=None, kind="stable")[:min(CRITICAL_PAIRS, pairs)]
        pair = np.unravel_index(int(slowest[int(rng.integers(len(slowest)))]), links.shape)
        return self._swap_node(int(nodes[pair[int(rng.integers(2))]]), set(nodes.tolist()))

    def _swap_node(self, a: int, avoid: set):
        """Node a swapped with a random node outside `avoid` of another class and as many GPUs (8 tries)."""
        for _ in range(8):
            b = int(self.rng.integers(len(self.node_gpus)))
            if b != a and b not in avoid and self.node_class[a] != self.node_class[b] \
                    and len(self.node_gpus[a]) == len(self.node_gpus[b]):
                return self._relabel([a, b], [b, a])
        return None

    def _node_order(self) -> list[int]:
        if self._order is None:
            self._order = sorted(range(len(self.node_gpus)), key=lambda n: self.pos_of[self.node_gpus[n][0]])
        return self._order

    def _relabel(self, old: list[int], new: list[int]):
        """Every rank served by node old[k] is served by node new[k] instead (same local index); None unless all
        these nodes have as many GPUs."""
        size = len(self.node_gpus[old[0]])
        if any(len(self.node_gpus[n]) != size for n in old):
            return None
        changes = {}
        for a, b in zip(old, new):
            if a != b:
                for ga, gb in zip(self.node_gpus[a], self.node_gpus[b]):
                    changes[self.pos_of[ga]] = gb
        return changes or None

    def _node_segment(self) -> list[int]:
        """A segment of at least 3 consecutive nodes of the node order (at most NODE_WINDOW)."""
        order = self._node_order()
        length = int(self.rng.integers(3, min(len(order), NODE_WINDOW) + 1))
        lo = int(self.rng.integers(len(order) - length + 1))
        return order[lo:lo + length]

    def _node_insert(self):
        seg = self._node_segment()
        new = seg[1:] + seg[:1] if self.rng.random() < 0.5 else seg[-1:] + seg[:-1]
        return self._relabel(seg, new)

    def _node_reverse(self):
        seg = self._node_segment()
        return self._relabel(seg, seg[::-1])

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
