"""The cluster's link levels as the lower bounds see them (solvers/bounds/parts.py): units a group can span (nodes,
or NVLink domains where declared), the fastest pair inside and between units, the weakest cuts and the best slowest
pair of a group over N units."""

from __future__ import annotations

import functools

import numpy as np

INF = float("inf")


@functools.lru_cache(maxsize=2)
def _node_pair_links(cluster) -> np.ndarray:
    """N x N over nodes: the fastest GPU pair between two nodes (the node figure, or a faster measured GPU
    pair), -INF on the diagonal."""
    W = np.array(cluster.inter_gb_per_s, dtype=float)
    for (a, b), value in cluster.gpu_pair_gb_per_s.items():
        i, j = int(cluster.gpu_node[a]), int(cluster.gpu_node[b])
        W[i, j] = W[j, i] = max(W[i, j], value)
    np.fill_diagonal(W, -INF)
    return W


@functools.lru_cache(maxsize=2)
def node_links(cluster) -> np.ndarray:
    """U x U over the units of the groups' slow level (nodes, or NVLink domains where declared): the fastest GPU
    pair between two units, -INF on the diagonal. The graph the cut and span bounds reason about. Cached. Units are
    grouped by domain number, not by runs of nodes (a re-plan's survivors may list a rack's trays apart)."""
    W = _node_pair_links(cluster)
    if not cluster.has_domains:
        return W
    domain = cluster.node_domain
    units = int(domain.max()) + 1
    rows = np.full((units, W.shape[1]), -INF)
    np.maximum.at(rows, domain, W)
    D = np.full((units, units), -INF)
    np.maximum.at(D.T, domain, rows.T)
    np.fill_diagonal(D, -INF)
    return D


def level_units(cluster) -> tuple[int, int]:
    """(units a group can span, most GPUs in one unit): nodes, or NVLink domains where declared."""
    return len(cluster.domain_gpus), int(cluster.domain_gpus.max())


@functools.lru_cache(maxsize=2)
def cluster_extremes(cluster) -> tuple[float, float]:
    """Fastest GPU pair anywhere in the cluster at the fast level (inside a node, or across nodes of one NVLink
    domain) and at the slow level (across nodes, or across domains) (INF: no such pair). Cached."""
    intra = max((float(m[~np.eye(m.shape[0], dtype=bool)].max()) for m in cluster.intra_gb_per_s if m.shape[0] > 1),
                default=INF)
    if cluster.has_domains:
        W = _node_pair_links(cluster)
        same = cluster.node_domain[:, None] == cluster.node_domain[None, :]
        np.fill_diagonal(same, False)
        if same.any():
            intra = max(intra, float(W[same].max())) if intra != INF else float(W[same].max())
    inter = float(node_links(cluster).max()) if level_units(cluster)[0] > 1 else INF
    return intra, inter


def weakest_cuts(cluster, limit: int = 3) -> list[tuple[float, int]]:
    """Cuts of the nodes with no GPU pair across faster than a bandwidth: (bandwidth, GPUs on one side).

    Every edge of a maximum spanning tree of the node graph (edge = fastest GPU pair between two nodes)
    defines one: removing it splits the tree, and no link across is faster than the edge (else the tree
    would not be maximum). The `limit` weakest edges give the strongest cuts. Prim, O(N^2); [] for one node.
    """
    n = level_units(cluster)[0]
    if n < 2:
        return []
    W = node_links(cluster)
    in_tree = np.zeros(n, dtype=bool)
    in_tree[0] = True
    reach, via = W[0].copy(), np.zeros(n, dtype=int)
    edges = []
    for _ in range(n - 1):
        reach[in_tree] = -INF
        j = int(np.argmax(reach))
        edges.append((float(reach[j]), int(via[j]), j))
        in_tree[j] = True
        closer = W[j] > reach
        reach[closer], via[closer] = W[j][closer], j
    children: dict[int, list[int]] = {}
    for _, parent, child in edges:
        children.setdefault(parent, []).append(child)
    gpus = [int(g) for g in cluster.domain_gpus]
    cuts = []
    for weight, _, child in sorted(edges)[:limit]:
        side, stack = 0, [child]  # the subtree below the edge
        while stack:
            v = stack.pop()
            side += gpus[v]
            stack.extend(children.get(v, []))
        cuts.append((weight, side))
    return cuts


@functools.lru_cache(maxsize=4)
def span_bandwidth(cluster) -> np.ndarray:
    """ub[N]: no group spanning N nodes has a slowest inter-node pair faster than this (N >= 2).

    In a set S of N nodes, every member v meets the others over at most its (N-1)-th fastest link, so the
    slowest pair of S is at most min over v in S of that; the best S can do is the N-th largest of these
    figures over all nodes. Exact for N = all nodes (the slowest pair anywhere). O(n^2 log n), cached."""
    n = level_units(cluster)[0]
    ub = np.full(n + 1, INF)
    if n < 2:
        return ub
    W = node_links(cluster)
    rows = -np.sort(-W, axis=1)[:, :n - 1]  # each node's links, fastest first
    columns = -np.sort(-rows, axis=0)  # per rank of link, nodes fastest first
    ub[2:] = columns[np.arange(1, n), np.arange(0, n - 1)]
    return ub
