"""Islands: sets of identical GPUs with one link profile, and the slots in which they host whole stages.

A cluster grows by purchases: racks of one GPU type behind one kind of network. Following Tangram, the
planner composes model slices per island into work-balanced pipelines (formulation/programs/composition.py). An
island here is a set of nodes such that

- every node has the same GPU type, the same GPU count and the same intra-node bandwidth matrix, and
- the inter-node bandwidth is one figure inside the island and one figure between any two islands
  (the node partition is refined until every block of the node matrix is constant), and
- the nodes of an NVLink domain (a rack of trays, `cluster.nvlink_domains`) are in no island with other nodes.

Then every stage-sized block ("slot") of an island sees the same links, so a stage's time and memory depend
only on its island, its position in the pipeline and its layer count: that is what makes the composition
program exact. A node with a degraded NIC or a measured odd pair ends up an island of its own; nodes touched
by GPU-pair overrides are islands of their own too.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Island:
    index: int
    gpu_type: str
    nodes: tuple[int, ...]  # node indices, in the cluster's listed order
    gpus_per_node: int
    uniform_intra: bool  # every intra-node GPU pair at one bandwidth: a stage may then take part of a node
    intra_gb_per_s: float  # slowest intra-node pair
    inter_gb_per_s: float  # between two nodes of the island (inf for a one-node island)

    @property
    def num_gpus(self) -> int:
        return len(self.nodes) * self.gpus_per_node

    def gpus(self, cluster) -> list[int]:
        """Global GPU indices in canonical order: nodes as listed, GPUs by local index."""
        return [int(cluster.node_offset[n]) + j for n in self.nodes for j in range(self.gpus_per_node)]

    def describe(self, cluster) -> str:
        names = [cluster.nodes[n].name for n in self.nodes]
        span = names[0] if len(names) == 1 else f"{names[0]}..{names[-1]}"
        return f"{self.gpu_type} x {self.num_gpus} ({len(names)} node{'s' * (len(names) > 1)} {span})"


def find_islands(cluster) -> list[Island]:
    """Islands of `cluster` (see the module docstring), ordered by their first node."""
    B = np.asarray(cluster.inter_gb_per_s, dtype=float)
    touched = {int(cluster.gpu_node[g]) for pair in cluster.gpu_pair_gb_per_s for g in pair}
    start: dict[tuple, list[int]] = {}
    for i, node in enumerate(cluster.nodes):
        key = ("alone", i) if i in touched else (node.gpu_type, node.num_gpus,
                                                  np.asarray(cluster.intra_gb_per_s[i]).tobytes(), _rack(cluster, i))
        start.setdefault(key, []).append(i)
    classes = sorted(start.values(), key=min)
    while True:
        split = _split_once(B, classes)
        if split is None:
            break
        classes = sorted(split, key=min)
    out = []
    for index, nodes in enumerate(classes):
        first = cluster.nodes[nodes[0]]
        M = np.asarray(cluster.intra_gb_per_s[nodes[0]], dtype=float)
        off = M[~np.eye(len(M), dtype=bool)]
        inter = float(B[nodes[0], nodes[1]]) if len(nodes) > 1 else float("inf")
        out.append(Island(index=index, gpu_type=first.gpu_type, nodes=tuple(nodes), gpus_per_node=first.num_gpus,
                          uniform_intra=bool(off.size == 0 or off.min() == off.max()),
                          intra_gb_per_s=float(off.min()) if off.size else float("inf"), inter_gb_per_s=inter))
    return out


def _rack(cluster, node: int) -> int | None:
    """The NVLink domain of a node that shares one with other nodes (None otherwise): a rack starts as an island
    of its own, so that the refinement never parts one of its trays from the others."""
    domain = int(cluster.node_domain[node])
    return domain if int(cluster.domain_gpus[domain]) > cluster.nodes[node].num_gpus else None


def _split_once(B: np.ndarray, classes: list[list[int]]) -> list[list[int]] | None:
    """One refinement step: a class D whose members a node i sees at different bandwidths is split by that
    bandwidth; a class C whose members see some class D at different (constant) bandwidths is split by it.
    None when every block is constant."""
    for C in classes:
        for D in classes:
            for i in C:
                others = [d for d in D if d != i]
                if not others:
                    continue
                values = B[i, others]
                if values.min() != values.max():  # i sees D unevenly: split D by what i sees
                    groups: dict[float, list[int]] = {}
                    for d in others:
                        groups.setdefault(float(B[i, d]), []).append(d)
                    if i in D:  # i itself goes with the largest group (it need not be told apart from it)
                        max(groups.values(), key=len).append(i)
                    return [c for c in classes if c is not D] + [sorted(g) for g in groups.values()]
            seen: dict[float, list[int]] = {}
            for i in C:
                others = [d for d in D if d != i]
                seen.setdefault(float(B[i, others[0]]) if others else -1.0, []).append(i)
            if len([v for v in seen if v >= 0]) > 1:  # C's members see D at different figures
                return [c for c in classes if c is not C] + list(seen.values())
    return None


def island_slots(island: Island, cluster, stage_gpus: int, tp: int) -> list[tuple[int, ...]]:
    """The island cut into blocks of `stage_gpus` GPUs that each host one pipeline stage, in canonical
    order: whole nodes when a stage needs at least a node (stage_gpus a multiple of the node size),
    else equal parts of a node (the node size a multiple of stage_gpus, intra-node links uniform, so that
    every part sees the same links). Tensor-parallel groups must fit in a node. [] when the island cannot
    host a stage of this size."""
    g = island.gpus_per_node
    if g % tp:
        return []
    if stage_gpus >= g:
        if stage_gpus % g:
            return []
    elif g % stage_gpus or not island.uniform_intra:
        return []
    gpus = island.gpus(cluster)
    count = len(gpus) // stage_gpus
    return [tuple(gpus[j * stage_gpus:(j + 1) * stage_gpus]) for j in range(count)]


def stages_per_node(island: Island, stage_gpus: int) -> int:
    """How many consecutive slots share one node (1 when a stage takes whole nodes)."""
    return max(1, island.gpus_per_node // stage_gpus)
