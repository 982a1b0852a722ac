"""GPU types, nodes and the network as a GPU-to-GPU bandwidth model.

Bandwidth between two GPUs (GB/s, 1e9 bytes, per GPU and direction, as nccl-tests' busbw; a pair measured
one-way runs at its slower direction, see docs/links.md) is stored at the granularity it is known, so that
16,384 GPUs do not need a 16,384^2 matrix:
- inside a node: one g x g matrix per node (nominal `intra_node_gb_per_s`, overridden per GPU pair);
- between nodes: one N x N matrix of per-GPU (per-NIC) bandwidth, nominal `inter_node_gb_per_s`, lowered
  by per-node NIC overrides (a pair runs at the slower of its two ends) and replaced by measured node pairs;
- measured GPU pairs across nodes: a sparse override table.
NVLink domains (`domain_of_node`, docs/instance-format.md): consecutive nodes (trays) whose GPUs talk over one
NVLink fabric, as in a GB200 NVL72 rack. A pair of nodes of one domain carries the domain's figure in the node
matrix, and the collective groups' two levels are the domain's NVLink and the network beyond it: a group's
"intra" level is every pair inside one domain (inside a tray or across trays), its "inter" level every pair
across domains, N the domains it spans and k its fewest members in one. Without domains every node is its own
domain and all of this is the node-level model unchanged.
Each level has a latency (alpha) so that effective bandwidth grows with message size. Measurement files
(nccl-tests logs, `nvidia-smi topo -m`) are read by `formulation.inputs.ingest`; `cluster_section.py` loads the section.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass, field
from functools import cached_property

import networkx as nx
import numpy as np

from formulation.inputs.gpus import GpuType

# Largest cluster the loader accepts, checked while `cluster.nodes` is read, before anything is sized by it.
# 65,536 GPUs is four times the largest published dense training run (Llama 3: 16,384 H100s); 8,192 nodes (8
# GPUs each) keep the N x N node-bandwidth matrix at 512 MiB (a million nodes would ask for 7 TiB and a
# 100,000-node `count` for 75 GiB: a MemoryError, not an answer).
MAX_GPUS = 65_536
MAX_NODES = 8_192
MAX_GPUS_PER_NODE = 64
# An NVLink domain holds at most 576 GPUs: NVLink 5's largest domain (NVIDIA's NVLink page: "up to 576 GPUs in a
# non-blocking compute fabric"); a node inside a declared domain may then hold more than MAX_GPUS_PER_NODE.
MAX_GPUS_PER_DOMAIN = 576

@dataclass(frozen=True)
class Node:
    name: str
    gpu_type: str
    num_gpus: int


@dataclass(frozen=True, eq=False)
class Cluster:
    """Nodes of GPUs and the bandwidth/latency between every pair of GPUs (see module docstring)."""

    gpu_types: dict[str, GpuType]
    nodes: tuple[Node, ...]
    intra_gb_per_s: tuple[np.ndarray, ...]  # per node, g x g (diagonal unused)
    inter_gb_per_s: np.ndarray  # N x N per-GPU bandwidth between nodes (diagonal unused)
    gpu_pair_gb_per_s: dict[tuple[int, int], float] = field(default_factory=dict)  # cross-node overrides, keys (lo, hi)
    intra_latency_s: float = 5e-6
    inter_latency_s: float = 15e-6
    nominal_levels: tuple[bool, bool] = (True, True)  # (intra, inter) level figures are nominal, not nccl-tests fits
    # NVLink domains: the domain of every node (consecutive runs, numbered in order); None: each node its own
    domain_of_node: tuple[int, ...] | None = None
    domain_names: tuple[str, ...] = ()
    intra_fabric: str = "nvlink"  # fabric kinds (formulation/data/fabrics.json): NCCL's share of a nominal speed
    inter_fabric: str = "infiniband"

    def __post_init__(self) -> None:
        # One semantics for one-way measurements (docs/links.md): a GPU pair runs at the slower of its two
        # directions, for collectives and pipeline sends alike, because every pair a plan uses carries equal
        # traffic both ways (activations forward and their gradients back; ring collectives over both ring
        # directions). Normalising here, once, makes the evaluator, the exact program and the bounds read the
        # same symmetric figures whichever way round they index a pair.
        intra = tuple(np.minimum(m, m.T) for m in self.intra_gb_per_s)
        inter = np.minimum(self.inter_gb_per_s, self.inter_gb_per_s.T)
        pairs: dict[tuple[int, int], float] = {}
        for (a, b), value in self.gpu_pair_gb_per_s.items():
            key = (min(a, b), max(a, b))
            pairs[key] = min(value, pairs.get(key, value))
        object.__setattr__(self, "intra_gb_per_s", intra)
        object.__setattr__(self, "inter_gb_per_s", inter)
        object.__setattr__(self, "gpu_pair_gb_per_s", pairs)

    @cached_property
    def fastest_links(self) -> tuple[float, float]:
        """(fastest intra-node pair, fastest inter-node pair) GB/s, inf where the level has no pair: the links at
        which NCCL's choice of algorithm is made (formulation/physics/collectives.py)."""
        intra = [float(m[~np.eye(len(m), dtype=bool)].max()) for m in self.intra_gb_per_s if len(m) > 1]
        inter = self.inter_gb_per_s[~np.eye(len(self.nodes), dtype=bool)] if len(self.nodes) > 1 else np.array([])
        finite = inter[np.isfinite(inter)]
        pairs = [v for v in self.gpu_pair_gb_per_s.values() if np.isfinite(v)]
        return (max(intra, default=np.inf),
                float(max(finite.max(), max(pairs, default=0.0))) if finite.size else max(pairs, default=np.inf))

    @cached_property
    def gpu_node(self) -> np.ndarray:
        """Node index of every global GPU index (GPUs numbered node by node in the listed order)."""
        return np.repeat(np.arange(len(self.nodes)), [n.num_gpus for n in self.nodes])

    @cached_property
    def node_domain(self) -> np.ndarray:
        """NVLink domain of every node (its own index where no domain is declared)."""
        if self.domain_of_node is None:
            return np.arange(len(self.nodes))
        return np.asarray(self.domain_of_node, dtype=np.int64)

    @cached_property
    def gpu_domain(self) -> np.ndarray:
        """NVLink domain of every GPU: the unit of the collective groups' fast level (`gpu_node` without domains)."""
        if self.domain_of_node is None:
            return self.gpu_node
        return self.node_domain[self.gpu_node]

    @property
    def has_domains(self) -> bool:
        return self.domain_of_node is not None

    @cached_property
    def domain_gpus(self) -> np.ndarray:
        """GPUs of every domain (of every node without domains)."""
        return np.bincount(self.gpu_domain, minlength=int(self.node_domain.max()) + 1 if len(self.nodes) else 0)

    def domain_name(self, domain: int) -> str:
        return self.domain_names[domain] if self.domain_of_node is not None else self.nodes[domain].name

    @cached_property
    def gpu_local(self) -> np.ndarray:
        return np.concatenate([np.arange(n.num_gpus) for n in self.nodes])

    @cached_property
    def node_offset(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum([n.num_gpus for n in self.nodes])])

    @cached_property
    def node_index(self) -> dict[str, int]:
        return {n.name: i for i, n in enumerate(self.nodes)}

    @property
    def num_gpus(self) -> int:
        return int(self.node_offset[-1])

    def gpus_of_nodes(self, order) -> list[int]:
        """The GPUs of the given nodes, node by node in that order (each node's GPUs in local order)."""
        return [g for n in order for g in range(int(self.node_offset[n]), int(self.node_offset[n + 1]))]

    def gpu_name(self, gpu: int) -> str:
        return f"{self.nodes[self.gpu_node[gpu]].name}:{self.gpu_local[gpu]}"

    def gpu_index(self, name: str) -> int:
        node, _, local = name.partition(":")
        i = self.node_index.get(node)
        if i is None or not local.isdigit() or int(local) >= self.nodes[i].num_gpus:
            raise KeyError(name)
        return int(self.node_offset[i]) + int(local)

    def gpu_type_of(self, gpu: int) -> GpuType:
        return self.gpu_types[self.nodes[self.gpu_node[gpu]].gpu_type]

    def bandwidth(self, a: int, b: int) -> float:
        """GB/s between GPUs a and b (the slower direction where measured one-way: see `__post_init__`)."""
        na, nb = self.gpu_node[a], self.gpu_node[b]
        if na == nb:
            return float(self.intra_gb_per_s[na][self.gpu_local[a], self.gpu_local[b]])
        override = self.gpu_pair_gb_per_s.get((min(a, b), max(a, b)))
        return float(override if override is not None else self.inter_gb_per_s[na, nb])

    @cached_property
    def _links_cache(self) -> dict[bytes, tuple[float, float, int, int]]:
        return {}

    def group_links(self, gpus: np.ndarray) -> tuple[float, float, int, int]:
        """Bottlenecks of a collective group: (slowest intra-node pair GB/s, slowest inter-node pair GB/s,
        nodes spanned N, fewest group members on one spanned node k). Infinite where a level is unused.

        Memoised by the set of GPUs: the search scores thousands of placements whose groups repeat (default
        maps of different configurations share their tp, dp and pipeline groups)."""
        gpus = np.asarray(gpus, dtype=np.int64)
        key = hashlib.blake2b(np.sort(gpus).tobytes(), digest_size=16).digest()
        found = self._links_cache.get(key)
        if found is None:
            if len(self._links_cache) > 1_000_000:  # bounded: about 200 MB at most
                self._links_cache.clear()
            found = self._links_cache[key] = self._group_links(gpus)
        return found

    @cached_property
    def _distinct_cache(self) -> dict:
        return {}

    def distinct_group_links(self, groups: np.ndarray) -> frozenset:
        """The distinct `group_links` of the rows of `groups` (one group per row), memoised by the whole array:
        the evaluator wants only the slowest of a stage's groups, whose links repeat, and the default maps of
        configurations that differ in recompute, micro-batch or interleaving share every group."""
        groups = np.ascontiguousarray(groups, dtype=np.int64)
        key = (groups.shape, hashlib.blake2b(groups.tobytes(), digest_size=16).digest())
        found = self._distinct_cache.get(key)
        if found is None:
            if len(self._distinct_cache) > 100_000:  # bounded
                self._distinct_cache.clear()
            found = self._distinct_cache[key] = frozenset(self.group_links(g) for g in groups)
        return found

    def distinct_send_links(self, src: np.ndarray, dst: np.ndarray) -> frozenset:
        """The distinct (GB/s, same NVLink domain) of the GPU pairs (src[j], dst[j]): what a pipeline send between
        two stages costs by (`bandwidth`, `gpu_domain`), memoised by the pair of arrays."""
        src, dst = np.ascontiguousarray(src, dtype=np.int64), np.ascontiguousarray(dst, dtype=np.int64)
        key = ("send", src.shape, hashlib.blake2b(src.tobytes() + dst.tobytes(), digest_size=16).digest())
        found = self._distinct_cache.get(key)
        if found is None:
            if len(self._distinct_cache) > 100_000:
                self._distinct_cache.clear()
            found = self._distinct_cache[key] = frozenset(
                (self.bandwidth(int(a), int(b)), bool(self.gpu_domain[a] == self.gpu_domain[b]))
                for a, b in zip(src, dst))
        return found

    def _group_links(self, gpus: np.ndarray) -> tuple[float, float, int, int]:
        if self.domain_of_node is not None:
            return self._domain_group_links(gpus)
        nodes = self.gpu_node[gpus]
        uniq, counts = np.unique(nodes, return_counts=True)
        intra = np.inf
        for node, count in zip(uniq, counts):
            if count > 1:
                local = self.gpu_local[gpus[nodes == node]]
                sub = self.intra_gb_per_s[node][np.ix_(local, local)]
                intra = min(intra, float(sub[~np.eye(len(local), dtype=bool)].min()))
        inter = np.inf
        if len(uniq) > 1:
            members = [int(g) for g in gpus]
            member_set = set(members)
            if any(a in member_set or b in member_set for a, b in self.gpu_pair_gb_per_s):
                # a measured GPU pair replaces its nodes' figure for that pair only: go pair by pair
                inter = min(self.bandwidth(a, b) for a, b in itertools.combinations(members, 2)
                            if self.gpu_node[a] != self.gpu_node[b])
            else:
                sub = self.inter_gb_per_s[np.ix_(uniq, uniq)]
                inter = float(sub[~np.eye(len(uniq), dtype=bool)].min())
        return intra, inter, int(len(uniq)), int(counts.min())

    def _domain_group_links(self, gpus: np.ndarray) -> tuple[float, float, int, int]:
        """`group_links` with NVLink domains: the fast level is every pair inside one domain (inside a node from
        its matrix, across its nodes from the node matrix, which holds the domain's figure), the slow level every
        pair across domains; N counts domains, k the fewest members in one."""
        nodes = self.gpu_node[gpus]
        used, on_node = np.unique(nodes, return_counts=True)
        domains, where = np.unique(self.node_domain[used], return_inverse=True)
        counts = np.bincount(where, weights=on_node).astype(np.int64)
        intra = np.inf
        shared = used[on_node > 1]  # nodes with two members or more: their own matrix's pairs
        uniform = self._uniform_intra[shared]
        if (~np.isnan(uniform)).any():
            intra = float(np.nanmin(uniform))
        for node in shared[np.isnan(uniform)]:
            local = self.gpu_local[gpus[nodes == node]]
            sub = self.intra_gb_per_s[node][np.ix_(local, local)]
            intra = min(intra, float(sub[~np.eye(len(local), dtype=bool)].min()))
        inter = np.inf
        if len(used) > 1:
            same = self.node_domain[used][:, None] == self.node_domain[used][None, :]
            members = [int(g) for g in gpus]
            member_set = set(members)
            if any(a in member_set or b in member_set for a, b in self.gpu_pair_gb_per_s):
                for a, b in itertools.combinations(members, 2):
                    if self.gpu_node[a] != self.gpu_node[b]:
                        if self.gpu_domain[a] == self.gpu_domain[b]:
                            intra = min(intra, self.bandwidth(a, b))
                        else:
                            inter = min(inter, self.bandwidth(a, b))
            else:
                sub = self.inter_gb_per_s[np.ix_(used, used)]
                off = ~np.eye(len(used), dtype=bool)
                if (same & off).any():
                    intra = min(intra, float(sub[same & off].min()))
                if (~same).any():
                    inter = float(sub[~same].min())
        return intra, inter, int(len(domains)), int(counts.min())

    @cached_property
    def _uniform_intra(self) -> np.ndarray:
        """Per node: the figure of every pair of its GPUs where it has one (NaN where pairs differ or alone)."""
        out = np.full(len(self.nodes), np.nan)
        for i, m in enumerate(self.intra_gb_per_s):
            if m.shape[0] > 1:
                off = m[~np.eye(m.shape[0], dtype=bool)]
                if off.min() == off.max():
                    out[i] = off.min()
        return out

    def interchangeable_nodes(self) -> list[list[int]]:
        """Classes of nodes that can be swapped without changing any bandwidth (same GPU type, same intra-node
        matrix, and the transposition of the two nodes is an automorphism of the inter-node matrix).

        The relation is an equivalence (a composition of automorphisms is one), so its classes are the
        connected components of the graph whose edges are interchangeable pairs; pairs are only tested
        against one representative per class.
        """
        graph = nx.Graph()
        reps: list[int] = []
        touched = {a for pair in self.gpu_pair_gb_per_s for a in (self.gpu_node[pair[0]], self.gpu_node[pair[1]])}
        B = self.inter_gb_per_s
        for i, node in enumerate(self.nodes):
            graph.add_node(i)
            for r in reps:
                if r in touched or i in touched or self.nodes[r].gpu_type != node.gpu_type:
                    continue
                if self.node_domain[r] != self.node_domain[i] and (self.domain_gpus[self.node_domain[r]] != node.num_gpus
                                                                   or self.domain_gpus[self.node_domain[i]] != node.num_gpus):
                    continue  # a node may change domains only where both are alone in theirs
                if self.nodes[r].num_gpus != node.num_gpus or not np.array_equal(self.intra_gb_per_s[r],
                                                                                  self.intra_gb_per_s[i]):
                    continue
                mask = np.ones(len(self.nodes), dtype=bool)
                mask[[r, i]] = False
                if np.array_equal(B[r, mask], B[i, mask]) and np.array_equal(B[mask, r], B[mask, i]):
                    graph.add_edge(r, i)
                    break
            else:
                reps.append(i)
        return [sorted(c) for c in sorted(nx.connected_components(graph), key=min)]

    def uniform_classes(self) -> list[list[int]]:
        """Sets of GPUs (global indices) of one node that any permutation leaves the cluster unchanged: every
        pair inside has the same bandwidth and every member has the same bandwidth to each GPU outside. A
        placement only matters up to which class hosts which ranks, so the exact program assigns ranks to
        classes. GPUs named in cross-node pair overrides stay alone."""
        special = {g for pair in self.gpu_pair_gb_per_s for g in pair}
        classes: list[list[int]] = []
        for node in range(len(self.nodes)):
            M = self.intra_gb_per_s[node]
            offset = int(self.node_offset[node])
            groups: list[list[int]] = []
            for a in range(M.shape[0]):
                for group in groups:
                    if offset + a in special or offset + group[0] in special:
                        continue
                    members = group + [a]
                    inside = {M[x, y] for x in members for y in members if x != y}
                    outside = [z for z in range(M.shape[0]) if z not in members]
                    if len(inside) == 1 and all(len({M[x, z] for x in members}) == 1 for z in outside):
                        group.append(a)
                        break
                else:
                    groups.append([a])
            classes += [[offset + g for g in group] for group in groups]
        return classes

    def interchangeable_gpus(self, node: int) -> list[list[int]]:
        """Classes of local GPUs of one node with identical intra-node bandwidth rows (as above, per node)."""
        if any(self.gpu_node[a] == node or self.gpu_node[b] == node for a, b in self.gpu_pair_gb_per_s):
            return [[g] for g in range(self.nodes[node].num_gpus)]
        M = self.intra_gb_per_s[node]
        g = M.shape[0]
        graph = nx.Graph()
        graph.add_nodes_from(range(g))
        for a in range(g):
            for b in range(a + 1, g):
                perm = np.arange(g)
                perm[[a, b]] = [b, a]
                if np.array_equal(M[np.ix_(perm, perm)], M):
                    graph.add_edge(a, b)
        return [sorted(c) for c in sorted(nx.connected_components(graph), key=min)]
