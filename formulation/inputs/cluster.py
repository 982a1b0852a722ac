"""GPU types, nodes and the network as a GPU-to-GPU bandwidth model.

Bandwidth between two GPUs (GB/s, 1e9 bytes, per GPU and direction, as nccl-tests' busbw; a pair measured
one-way runs at its slower direction, see docs/links.md) is stored at the granularity it is known, so that
16,384 GPUs do not need a 16,384^2 matrix:
- inside a node: one g x g matrix per node (nominal `intra_node_gb_per_s`, overridden per GPU pair);
- between nodes: one N x N matrix of per-GPU (per-NIC) bandwidth, nominal `inter_node_gb_per_s`, lowered
  by per-node NIC overrides (a pair runs at the slower of its two ends) and replaced by measured node pairs;
- measured GPU pairs across nodes: a sparse override table.
Each level has a latency (alpha) so that effective bandwidth grows with message size. Measurement files
(nccl-tests logs, `nvidia-smi topo -m`) are read by `formulation.inputs.ingest`; `_load_network` states the precedence.
"""

from __future__ import annotations

import difflib
import hashlib
import itertools
import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import networkx as nx
import numpy as np

from formulation.data import DATA_DIR
from formulation.errors import Section, is_finite
from formulation.inputs.ingest import network as measured

# Largest cluster the loader accepts, checked while `cluster.nodes` is read, before anything is sized by it.
# 65,536 GPUs is four times the largest published dense training run (Llama 3: 16,384 H100s); 8,192 nodes (8
# GPUs each) keep the N x N node-bandwidth matrix at 512 MiB (a million nodes would ask for 7 TiB and a
# 100,000-node `count` for 75 GiB: a MemoryError, not an answer).
MAX_GPUS = 65_536
MAX_NODES = 8_192
MAX_GPUS_PER_NODE = 64

CATALOG_PATH = DATA_DIR / "gpu_types.json"
CALIBRATION_PATH = DATA_DIR / "calibration.json"


@dataclass(frozen=True)
class GpuType:
    """Hardware facts and achieved-efficiency parameters of one GPU type (see docs/model.md (C1)-(C3))."""

    name: str
    memory_gib: float
    peak_tflops: float  # dense, at the training precision (bf16/fp16)
    hbm_gb_per_s: float
    matmul_efficiency: float  # achieved fraction of peak for large GEMMs
    efficiency_half_gflop: float  # per-GPU forward GFLOP of one layer at which the GEMM efficiency halves
    attention_efficiency: float  # achieved fraction of peak of the attention core (flash attention)
    runtime_overhead_gib: float  # CUDA context, NCCL buffers, framework workspace
    fragmentation_fraction: float  # allocator fragmentation, fraction of the allocated bytes
    iteration_overhead_s: float  # fixed per-iteration cost (data loading, logging, launch)
    price_per_hour: float = 0.0
    peak_fp8_tflops: float = 0.0  # dense FP8 peak (data sheet); 0: the GPU has no FP8 tensor cores
    fp8_matmul_efficiency: float = 1.0  # FP8 GEMM efficiency relative to the bf16 curve (docs/physics.md)

    def matmul_time(self, flops: float, layer_gflop: float, fp8: bool = False) -> float:
        """(C1) t = F / (peak * e_max * W / (W + W_half)), W = per-GPU forward GFLOP of one layer; FP8 GEMMs run
        against the FP8 peak at `fp8_matmul_efficiency` times that curve (GPUs without FP8 run them in bf16)."""
        efficiency = self.matmul_efficiency * layer_gflop / (layer_gflop + self.efficiency_half_gflop)
        if fp8 and self.peak_fp8_tflops > 0:
            return flops / (self.peak_fp8_tflops * 1e12 * efficiency * self.fp8_matmul_efficiency)
        return flops / (self.peak_tflops * 1e12 * efficiency)


_GPU_FIELDS = ("memory_gib", "peak_tflops", "hbm_gb_per_s", "matmul_efficiency", "efficiency_half_gflop",
               "attention_efficiency", "runtime_overhead_gib", "fragmentation_fraction", "iteration_overhead_s",
               "price_per_hour", "peak_fp8_tflops", "fp8_matmul_efficiency")


def _load_json(path: Path) -> dict:
    with path.open() as handle:
        return {k: v for k, v in json.load(handle).items() if not k.startswith("_")}


def gpu_catalog(software_stack: str = "megatron") -> dict[str, dict]:
    """Catalog facts merged with calibrated parameters: `default`, then the type's Megatron-LM fit, then a
    stack-specific fit (`name+torchtitan`, `name+megatron-deepspeed`) where one exists."""
    catalog = _load_json(CATALOG_PATH)
    calibration = _load_json(CALIBRATION_PATH)
    default = {k: v for k, v in calibration.get("default", {}).items() if k in _GPU_FIELDS}
    merged = {}
    for name, facts in catalog.items():
        fitted = {k: v for k, v in calibration.get(name, {}).items() if k in _GPU_FIELDS}
        stack = {k: v for k, v in calibration.get(f"{name}+{software_stack}", {}).items() if k in _GPU_FIELDS}
        merged[name] = {**default, **facts, **fitted, **stack}
    merged["__default__"] = default
    return merged


def gpu_type_from_dict(name: str, data: dict, file: str, path: str, software_stack: str = "megatron") -> GpuType:
    """A GPU type: `{"preset": catalog-name}` and/or explicit fields; catalog and calibration fill the rest."""
    sec = Section(data, file, path)
    catalog = gpu_catalog(software_stack)
    preset = sec.string("preset", default=name if name in catalog else None)
    if preset is not None and preset not in catalog:
        raise sec.error("preset", f"unknown GPU preset {preset!r}; expected one of "
                                  f"{', '.join(k for k in sorted(catalog) if not k.startswith('__'))}")
    base = dict(catalog["__default__"])
    if preset is not None:
        base.update(catalog[preset])
    values = {}
    for key in _GPU_FIELDS:
        positive = key not in ("fragmentation_fraction", "iteration_overhead_s", "runtime_overhead_gib", "price_per_hour",
                               "peak_fp8_tflops")
        maximum = 1.0 if key in ("matmul_efficiency", "attention_efficiency", "fragmentation_fraction",
                                 "fp8_matmul_efficiency") else None
        if key in base or sec.has(key):
            values[key] = sec.number(key, default=base.get(key), positive=positive, minimum=0.0, maximum=maximum)
        else:
            names = sorted(k for k in catalog if not k.startswith("__"))
            closest = ([n for n in names if name.lower() in n]
                       or difflib.get_close_matches(name.lower(), names, n=1, cutoff=0.5))
            hint = f" (closest: {', '.join(closest)})" if closest else ""
            raise sec.error(key, f"required field is missing: {name!r} is not a catalog GPU type{hint}; give "
                                 f"`preset` (one of {', '.join(names)}) or every field")
    sec.done()
    return GpuType(name=name, **values)


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
    def gpu_node(self) -> np.ndarray:
        """Node index of every global GPU index (GPUs numbered node by node in the listed order)."""
        return np.repeat(np.arange(len(self.nodes)), [n.num_gpus for n in self.nodes])

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

    def _group_links(self, gpus: np.ndarray) -> tuple[float, float, int, int]:
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


def load_cluster_section(data: dict, file: str, software_stack: str = "megatron",
                         base_dir: Path | None = None) -> Cluster:
    """The instance's `cluster` section (strict; see docs/instance-format.md). Measurement files are relative to
    `base_dir` (the instance file's directory; default the current directory)."""
    sec = Section(data, file, "cluster")
    types_sec = sec.section("gpu_types")
    if not types_sec.data:
        raise sec.error("gpu_types", "expected at least one GPU type")
    gpu_types = {}
    for name in list(types_sec.data):
        gpu_types[name] = gpu_type_from_dict(name, types_sec.raw(name), file, f"cluster.gpu_types.{name}",
                                             software_stack)
    nodes = _load_nodes(sec, gpu_types)
    net = sec.section("network")
    sec.done()
    return _load_network(net, nodes, gpu_types, base_dir or Path("."))


def _load_nodes(sec: Section, gpu_types: dict) -> tuple[Node, ...]:
    """`nodes`: a list of {"name", "gpu_type", "gpus"}; `{"count": n, "prefix": "node", ...}` expands to n nodes."""
    nodes: list[Node] = []
    total = 0
    for i, item in enumerate(sec.items("nodes")):
        ns = Section(item, sec.file, f"cluster.nodes[{i}]")
        gpu_type = ns.string("gpu_type")
        if gpu_type not in gpu_types:
            raise ns.error("gpu_type", f"GPU type {gpu_type!r} is not defined in cluster.gpu_types "
                                       f"(defined: {', '.join(gpu_types)})")
        gpus = ns.integer("gpus", maximum=MAX_GPUS_PER_NODE)
        if ns.has("count"):
            count = ns.integer("count", maximum=MAX_NODES)
            prefix = ns.string("prefix", default="node")
            width = max(2, len(str(count - 1 + len(nodes))))
            names = [f"{prefix}{len(nodes) + k:0{width}d}" for k in range(count)]
        else:
            names = [ns.string("name")]
        ns.done()
        for name in names:
            if ":" in name:
                raise ns.error("name", f"node names may not contain ':' (got {name!r})")
            nodes.append(Node(name, gpu_type, gpus))
        total += gpus * len(names)
        if len(nodes) > MAX_NODES or total > MAX_GPUS:
            raise sec.error("nodes", f"{len(nodes):,} nodes with {total:,} GPUs (through nodes[{i}]) exceed the "
                                     f"supported maximum of {MAX_NODES:,} nodes and {MAX_GPUS:,} GPUs")
    seen = set()
    for i, node in enumerate(nodes):
        if node.name in seen:
            raise sec.error(f"nodes[{i}].name", f"duplicate node name {node.name!r}")
        seen.add(node.name)
    return tuple(nodes)


def _matrix(net: Section, key: str, size: int) -> np.ndarray:
    rows = net.items(key)
    if len(rows) != size:
        raise net.error(key, f"expected a square {size} x {size} matrix, got {len(rows)} rows")
    out = np.zeros((size, size))
    for i, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != size:
            got = len(row) if isinstance(row, list) else type(row).__name__
            raise net.error(f"{key}[{i}]", f"expected a row of {size} numbers, got {got}")
        for j, value in enumerate(row):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not is_finite(value) or \
                    (value <= 0 and i != j) or value < 0:
                raise net.error(f"{key}[{i}][{j}]", f"expected a positive bandwidth in GB/s, got {value!r}")
            out[i, j] = value
    return out


def _leaf_groups(net: Section, inter: np.ndarray) -> np.ndarray:
    """`leaf_groups`: {"nodes_per_group": g, "cross_group_gb_per_s": b}. A fat tree's leaf switches (or
    scalable units) hold g consecutive listed nodes each; a pair of nodes under different leaves crosses the
    spine and runs at no more than b. The compact form of a node matrix for clusters of thousands of nodes."""
    if not net.has("leaf_groups"):
        return inter
    gs = net.section("leaf_groups")
    size = gs.integer("nodes_per_group")
    cross = gs.number("cross_group_gb_per_s")
    gs.done()
    leaf = np.arange(inter.shape[0]) // size
    return np.where(leaf[:, None] != leaf[None, :], np.minimum(inter, cross), inter)


def _load_network(net: Section, nodes: tuple[Node, ...], gpu_types: dict, base_dir: Path) -> Cluster:
    """Inputs apply from the coarsest to the most specific, later ones winning where they speak: nominal level
    figures -> `nccl_tests` (fitted level figures and latencies) -> `leaf_groups` (unless a node matrix is
    given) -> per-node `nodes` -> `node_matrix_gb_per_s`
    -> `node_pairs` -> `sendrecv_logs` -> `nvidia_smi_topo` -> `gpu_matrix_gb_per_s` -> `gpu_pairs`."""
    intra_nominal = net.number("intra_node_gb_per_s")
    inter_nominal = net.number("inter_node_gb_per_s")
    intra_latency = net.number("intra_node_latency_us", default=5.0, positive=False, minimum=0.0) * 1e-6
    inter_latency = net.number("inter_node_latency_us", default=15.0, positive=False, minimum=0.0) * 1e-6
    fits = measured.nccl_level_fits(net, nodes, base_dir)
    intra_latency = intra_latency if fits.intra_latency_s is None else fits.intra_latency_s
    inter_latency = inter_latency if fits.inter_latency_s is None else fits.inter_latency_s
    index = {n.name: i for i, n in enumerate(nodes)}
    n = len(nodes)
    has_matrix = net.has("node_matrix_gb_per_s")
    # A pair of nodes runs at the slower end: per-node level figures (nominal, or fitted) and NIC caps.
    level = np.array([inter_nominal if v is None else v for v in fits.inter_gb_per_s])
    nic = np.full(n, np.inf)
    intra = [np.full((node.num_gpus, node.num_gpus), intra_nominal if v is None else v)
             for node, v in zip(nodes, fits.intra_gb_per_s)]
    for i, item in enumerate(net.items("nodes", default=[], non_empty=False)):
        ns = Section(item, net.file, f"cluster.network.nodes[{i}]")
        name = ns.string("node")
        if name not in index:
            raise ns.error("node", f"unknown node {name!r}")
        if ns.has("inter_node_gb_per_s"):
            nic[index[name]] = ns.number("inter_node_gb_per_s")
        if ns.has("intra_node_gb_per_s"):
            intra[index[name]][:] = ns.number("intra_node_gb_per_s")
        ns.done()
    inter = _matrix(net, "node_matrix_gb_per_s", n) if has_matrix else _leaf_groups(net, np.minimum.outer(level, level))
    inter = np.minimum(inter, np.minimum.outer(nic, nic))
    for i, item in enumerate(net.items("node_pairs", default=[], non_empty=False)):
        ps = Section(item, net.file, f"cluster.network.node_pairs[{i}]")
        pair = ps.items("nodes")
        if len(pair) != 2 or any(not isinstance(p, str) or p not in index for p in pair) or pair[0] == pair[1]:
            raise ps.error("nodes", f"expected two different known node names, got {pair!r}")
        value = ps.number("gb_per_s")
        ps.done()
        a, b = index[pair[0]], index[pair[1]]
        inter[a, b] = inter[b, a] = value
    for a, b, value in measured.sendrecv_pairs(net, index, base_dir):
        inter[a, b] = inter[b, a] = value
    for k, matrix in measured.topo_matrices(net, nodes, gpu_types, base_dir).items():
        intra[k] = matrix
    np.fill_diagonal(inter, np.inf)
    offsets = np.concatenate([[0], np.cumsum([node.num_gpus for node in nodes])])
    total = int(offsets[-1])

    def gpu(name: object, field: str, ps: Section) -> int:
        node, _, local = str(name).partition(":")
        if node not in index or not local.isdigit() or int(local) >= nodes[index[node]].num_gpus:
            raise ps.error(field, f"expected a GPU as \"node:local_index\" of a listed node, got {name!r}")
        return int(offsets[index[node]]) + int(local)

    node_of_gpu = np.repeat(np.arange(n), [node.num_gpus for node in nodes])
    pairs: dict[tuple[int, int], float] = {}
    if net.has("gpu_matrix_gb_per_s"):
        full = _matrix(net, "gpu_matrix_gb_per_s", total)
        for k in range(n):
            lo, hi = offsets[k], offsets[k + 1]
            intra[k] = full[lo:hi, lo:hi].copy()
        for a in range(total):
            for b in range(a + 1, total):
                na, nb = node_of_gpu[a], node_of_gpu[b]
                slower = min(full[a, b], full[b, a])  # the pair's figure (Cluster.__post_init__)
                if na != nb and slower != min(inter[na, nb], inter[nb, na]):
                    pairs[(a, b)] = float(slower)
    for i, item in enumerate(net.items("gpu_pairs", default=[], non_empty=False)):
        ps = Section(item, net.file, f"cluster.network.gpu_pairs[{i}]")
        pair = ps.items("gpus")
        if len(pair) != 2:
            raise ps.error("gpus", f"expected two GPUs, got {pair!r}")
        a, b = gpu(pair[0], "gpus", ps), gpu(pair[1], "gpus", ps)
        if a == b:
            raise ps.error("gpus", f"expected two different GPUs, got {pair!r}")
        value = ps.number("gb_per_s")
        ps.done()
        na, nb = node_of_gpu[a], node_of_gpu[b]
        if na == nb:
            la, lb = a - offsets[na], b - offsets[na]
            intra[na][la, lb] = intra[na][lb, la] = value
        else:
            pairs[(min(a, b), max(a, b))] = value
    net.done()
    for m in intra:
        np.fill_diagonal(m, np.inf)
    return Cluster(gpu_types=gpu_types, nodes=nodes, intra_gb_per_s=tuple(intra), inter_gb_per_s=inter,
                   gpu_pair_gb_per_s=pairs, intra_latency_s=intra_latency, inter_latency_s=inter_latency,
                   nominal_levels=(all(v is None for v in fits.intra_gb_per_s),
                                   all(v is None for v in fits.inter_gb_per_s)))
