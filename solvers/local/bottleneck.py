"""Stage node groups whose slowest inside link is as fast as possible: a start for the annealer on clusters whose
nodes differ in their links (issue 19).

When every stage is a whole number K of nodes, each stage's data-parallel collectives span its K nodes and run at
the slowest pair among them (C5), and the plan's time follows its slowest stages (C9-C11). Choosing each stage's
nodes is then a max-min partition: split the nodes into pp groups of K so that the smallest link inside any group
is as large as possible. Found here by binary search on the threshold t over the matrix's distinct figures, each
step a min-conflicts search (Minton et al. 1992) for groups with no pair below t: swap the two nodes that remove
the most conflicts, with random swaps of a conflicting node to leave plateaus.

On measured_64 (i.i.d. 15-25 GB/s node pairs; tp=4 pp=8 dp=16, 8 stages of 8 nodes) it finds groups with every
inside link at 17.8-18.0 GB/s in 0.2 s (3 seeds), where 10 s of annealing leaves its slowest stage at 16.0 GB/s;
that map with the even split scores 7.849-7.854 s before any annealing, about what a node-permutation SA reaches
in 10 s (7.852-7.868 s). The annealer then orders the stages and pairs the nodes for the pipeline sends.
"""

from __future__ import annotations

import numpy as np

from formulation.space import placement_for

MAX_NODES = 128  # each step scores every node pair (n^2 numpy work): 0.2 s in all at 64 nodes
STEPS = 400  # min-conflicts steps per threshold before it counts as not reached
RANDOM_WALK = 0.7  # share of steps without an improving swap that take a random swap of a conflicting node


def nodes_per_stage(instance, config) -> int:
    """K, the nodes of each stage, where the partition applies: one GPU type, nodes of one size, every GPU used,
    each stage whole nodes (K >= 2), pp >= 2, at most MAX_NODES nodes, and links that differ. Else 0."""
    cluster = instance.cluster
    n = len(cluster.nodes)
    sizes = {node.num_gpus for node in cluster.nodes}
    world = config.tp * config.pp * config.cp * config.dp
    if (len(sizes) != 1 or len({node.gpu_type for node in cluster.nodes}) != 1 or world != cluster.num_gpus
            or config.pp < 2 or n > MAX_NODES):
        return 0
    per_node = sizes.pop()
    if (world // config.pp) % per_node:
        return 0
    K = world // config.pp // per_node
    links = cluster.inter_gb_per_s[~np.eye(n, dtype=bool)]
    return K if K >= 2 and links.min() < links.max() else 0


def _groups_at(bad: np.ndarray, groups: int, size: int, rng: np.random.Generator) -> np.ndarray | None:
    """Group of every node, `groups` groups of `size`, with no `bad` pair in a group; None if STEPS do not find it."""
    n = len(bad)
    assign = np.repeat(np.arange(groups), size)
    rng.shuffle(assign)
    conflicts = bad @ np.eye(groups)[assign]  # [x, g]: x's bad partners in group g
    for _ in range(STEPS):
        own = conflicts[np.arange(n), assign]
        if not own.any():
            return assign
        across = conflicts[:, assign]  # [x, y]: x's bad partners in y's group
        delta = across + across.T - own[:, None] - own[None, :] - 2 * bad  # conflicts gained by swapping x, y
        delta[assign[:, None] == assign[None, :]] = np.inf
        delta[(own == 0)[:, None] & (own == 0)[None, :]] = np.inf  # a swap must move a node in conflict
        best = delta.min()
        if best >= 0 and rng.random() < RANDOM_WALK:
            x = rng.choice(np.flatnonzero(own > 0))
            y = rng.choice(np.flatnonzero(assign != assign[x]))
        else:
            ties = np.argwhere(delta <= best)
            x, y = ties[rng.integers(len(ties))]
        gx, gy = assign[x], assign[y]
        conflicts[:, gx] += bad[:, y] - bad[:, x]
        conflicts[:, gy] += bad[:, x] - bad[:, y]
        assign[x], assign[y] = gy, gx
    return None


def max_min_groups(links: np.ndarray, groups: int, size: int, seed: int = 0) -> tuple[float, list[list[int]]]:
    """Nodes split into `groups` groups of `size` with the smallest inside link as large as the search reaches:
    (that link in GB/s, the groups' nodes in ascending order)."""
    rng = np.random.default_rng(seed)
    n = len(links)
    off = ~np.eye(n, dtype=bool)
    values = np.unique(links[off])
    lo, hi = 0, len(values) - 1
    found = (float(values[0]), np.repeat(np.arange(groups), size))  # any split holds the smallest link
    while lo <= hi:
        mid = (lo + hi) // 2
        assign = _groups_at(((links < values[mid]) & off).astype(float), groups, size, rng)
        if assign is not None:
            found, lo = (float(values[mid]), assign), mid + 1
        else:
            hi = mid - 1
    threshold, assign = found
    return threshold, [[int(x) for x in np.flatnonzero(assign == g)] for g in range(groups)]


def max_min_order(instance, config, seed: int = 0, cache: dict | None = None) -> list[int] | None:
    """The node order that puts each stage of `config` on one max-min group of nodes, or None where
    `nodes_per_stage` does not apply. `cache` keeps the groups per (pp, K, seed): configurations that differ in
    other sizes share them."""
    K = nodes_per_stage(instance, config)
    if not K:
        return None
    cache = {} if cache is None else cache
    key = (config.pp, K, seed)
    if key not in cache:
        cache[key] = max_min_groups(instance.cluster.inter_gb_per_s, config.pp, K, seed)[1]
    return [n for group in cache[key] for n in group]


def bottleneck_start(instance, config, layers_per_stage, seed: int = 0, cache: dict | None = None):
    """The placement of `config` on `max_min_order`'s nodes (ranks in node order, so that tp groups stay inside
    nodes), or None where it does not apply."""
    order = max_min_order(instance, config, seed, cache)
    if order is None:
        return None
    return placement_for(config, layers_per_stage, instance.cluster.gpus_of_nodes(order))
