"""The instance's `cluster` section read into a `Cluster`: GPU types, nodes (limits checked before anything
is sized by them) and the network, from nominal figures to measured files; `_load_network` states the
precedence of the network's inputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from formulation.errors import MAX_GB_PER_S, MIN_GB_PER_S, Section, is_finite
from formulation.inputs.cluster import MAX_GPUS, MAX_GPUS_PER_DOMAIN, MAX_GPUS_PER_NODE, MAX_NODES, Cluster, Node
from formulation.inputs.domains import apply_domains, load_domains
from formulation.inputs.gpus import gpu_type_from_dict
from formulation.inputs.ingest import network as measured
from formulation.physics.collectives import fabrics


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
    nodes = _load_nodes(sec, gpu_types, MAX_GPUS_PER_DOMAIN if sec.has("nvlink_domains") else MAX_GPUS_PER_NODE)
    domains = load_domains(sec, nodes)
    net = sec.section("network")
    sec.done()
    return _load_network(net, nodes, gpu_types, base_dir or Path("."), domains)


def _load_nodes(sec: Section, gpu_types: dict, max_gpus_per_node: int = MAX_GPUS_PER_NODE) -> tuple[Node, ...]:
    """`nodes`: a list of {"name", "gpu_type", "gpus"}; `{"count": n, "prefix": "node", ...}` expands to n nodes,
    as an item of the list or alone (the compact form of a cluster of identical nodes needs no brackets)."""
    nodes: list[Node] = []
    total = 0
    alone = isinstance(sec.raw("nodes", None), dict)
    items = [sec.raw("nodes")] if alone else sec.items("nodes")
    if alone and not Section(items[0], sec.file, "cluster.nodes").has("count"):
        raise sec.error("nodes", 'expected a list of nodes, or one {"count", "prefix", "gpu_type", "gpus"} '
                                 'object for many identical nodes; got an object without "count"')
    for i, item in enumerate(items):
        ns = Section(item, sec.file, "cluster.nodes" if alone else f"cluster.nodes[{i}]")
        gpu_type = ns.string("gpu_type")
        if gpu_type not in gpu_types:
            raise ns.error("gpu_type", f"GPU type {gpu_type!r} is not defined in cluster.gpu_types "
                                       f"(defined: {', '.join(gpu_types)})")
        gpus = ns.integer("gpus", maximum=max_gpus_per_node)
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


MAX_LATENCY_US = 1e6  # one second: any link's latency is microseconds


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
                    (i != j and not MIN_GB_PER_S <= value <= MAX_GB_PER_S) or value < 0:
                raise net.error(f"{key}[{i}][{j}]", f"expected a bandwidth in GB/s, {MIN_GB_PER_S:g} to "
                                                   f"{MAX_GB_PER_S:g}, got {value!r}")
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
    cross = gs.bandwidth("cross_group_gb_per_s")
    gs.done()
    leaf = np.arange(inter.shape[0]) // size
    return np.where(leaf[:, None] != leaf[None, :], np.minimum(inter, cross), inter)


def _load_network(net: Section, nodes: tuple[Node, ...], gpu_types: dict, base_dir: Path,
                  domains: list | None = None) -> Cluster:
    """Inputs apply from the coarsest to the most specific, later ones winning where they speak: nominal level
    figures -> `nccl_tests` (fitted level figures and latencies) -> `leaf_groups` (unless a node matrix is
    given) -> per-node `nodes` -> `node_matrix_gb_per_s` -> `cluster.nvlink_domains` (pairs of nodes of one domain)
    -> `node_pairs` -> `sendrecv_logs` -> `nvidia_smi_topo` -> `gpu_matrix_gb_per_s` -> `gpu_pairs`."""
    intra_nominal = net.bandwidth("intra_node_gb_per_s")
    inter_nominal = net.bandwidth("inter_node_gb_per_s")
    intra_latency = net.number("intra_node_latency_us", default=5.0, positive=False, minimum=0.0,
                               maximum=MAX_LATENCY_US) * 1e-6
    inter_latency = net.number("inter_node_latency_us", default=15.0, positive=False, minimum=0.0,
                               maximum=MAX_LATENCY_US) * 1e-6
    intra_fabric = net.string("intra_node_fabric", default="nvlink", choices=sorted(fabrics()["intra"]))
    inter_fabric = net.string("inter_node_fabric", default="infiniband", choices=sorted(fabrics()["inter"]))
    fits = measured.nccl_level_fits(net, nodes, base_dir, fabrics()["intra"][intra_fabric]["nccl_hw"])
    intra_latency = intra_latency if fits.intra_latency_s is None else fits.intra_latency_s
    inter_latency = inter_latency if fits.inter_latency_s is None else fits.inter_latency_s
    index = {n.name: i for i, n in enumerate(nodes)}
    # A pair of nodes runs at the slower end: per-node level figures (nominal, or fitted) and NIC caps.
    level = np.array([inter_nominal if v is None else v for v in fits.inter_gb_per_s])
    intra = [np.full((node.num_gpus, node.num_gpus), intra_nominal if v is None else v)
             for node, v in zip(nodes, fits.intra_gb_per_s)]
    nic = _per_node_figures(net, index, intra)
    inter = (_matrix(net, "node_matrix_gb_per_s", len(nodes)) if net.has("node_matrix_gb_per_s")
             else _leaf_groups(net, np.minimum.outer(level, level)))
    inter = np.minimum(inter, np.minimum.outer(nic, nic))
    domain_of_node, domain_names = apply_domains(domains or [], nodes, inter, intra_nominal)
    _node_pairs(net, index, inter)
    for a, b, value in measured.sendrecv_pairs(net, index, base_dir):
        inter[a, b] = inter[b, a] = value
    for k, matrix in measured.topo_matrices(net, nodes, gpu_types, base_dir).items():
        intra[k] = matrix
    np.fill_diagonal(inter, np.inf)
    pairs = _gpu_level_figures(net, nodes, intra, inter)
    net.done()
    for m in intra:
        np.fill_diagonal(m, np.inf)
    return Cluster(gpu_types=gpu_types, nodes=nodes, intra_gb_per_s=tuple(intra), inter_gb_per_s=inter,
                   gpu_pair_gb_per_s=pairs, intra_latency_s=intra_latency, inter_latency_s=inter_latency,
                   nominal_levels=(all(v is None for v in fits.intra_gb_per_s),
                                   all(v is None for v in fits.inter_gb_per_s)),
                   domain_of_node=domain_of_node, domain_names=domain_names,
                   intra_fabric=intra_fabric, inter_fabric=inter_fabric)


def _per_node_figures(net: Section, index: dict[str, int], intra: list[np.ndarray]) -> np.ndarray:
    """`network.nodes`: a node's NIC figure (returned, inf where none is given) and its intra-node figure
    (written into `intra`)."""
    nic = np.full(len(index), np.inf)
    for i, item in enumerate(net.items("nodes", default=[], non_empty=False)):
        ns = Section(item, net.file, f"cluster.network.nodes[{i}]")
        name = ns.string("node")
        if name not in index:
            raise ns.error("node", f"unknown node {name!r}")
        if ns.has("inter_node_gb_per_s"):
            nic[index[name]] = ns.bandwidth("inter_node_gb_per_s")
        if ns.has("intra_node_gb_per_s"):
            intra[index[name]][:] = ns.bandwidth("intra_node_gb_per_s")
        ns.done()
    return nic


def _node_pairs(net: Section, index: dict[str, int], inter: np.ndarray) -> None:
    """`network.node_pairs`: one figure for a pair of nodes, both directions, written into `inter`."""
    for i, item in enumerate(net.items("node_pairs", default=[], non_empty=False)):
        ps = Section(item, net.file, f"cluster.network.node_pairs[{i}]")
        pair = ps.items("nodes")
        if len(pair) != 2 or any(not isinstance(p, str) or p not in index for p in pair) or pair[0] == pair[1]:
            raise ps.error("nodes", f"expected two different known node names, got {pair!r}")
        value = ps.bandwidth("gb_per_s")
        ps.done()
        a, b = index[pair[0]], index[pair[1]]
        inter[a, b] = inter[b, a] = value


def _gpu_level_figures(net: Section, nodes: tuple[Node, ...], intra: list[np.ndarray],
                       inter: np.ndarray) -> dict[tuple[int, int], float]:
    """`gpu_matrix_gb_per_s` and `gpu_pairs`: figures inside a node go into `intra`; pairs across nodes that
    differ from their node pair's figure are returned, keyed by (lower, higher) global GPU index."""
    index = {n.name: i for i, n in enumerate(nodes)}
    offsets = np.concatenate([[0], np.cumsum([node.num_gpus for node in nodes])])
    node_of_gpu = np.repeat(np.arange(len(nodes)), [node.num_gpus for node in nodes])
    pairs: dict[tuple[int, int], float] = {}
    if net.has("gpu_matrix_gb_per_s"):
        full = _matrix(net, "gpu_matrix_gb_per_s", int(offsets[-1]))
        for k in range(len(nodes)):
            intra[k] = full[offsets[k]:offsets[k + 1], offsets[k]:offsets[k + 1]].copy()
        for a in range(int(offsets[-1])):
            for b in range(a + 1, int(offsets[-1])):
                na, nb = node_of_gpu[a], node_of_gpu[b]
                slower = min(full[a, b], full[b, a])  # the pair's figure (Cluster.__post_init__)
                if na != nb and slower != min(inter[na, nb], inter[nb, na]):
                    pairs[(a, b)] = float(slower)

    def gpu(name: object, ps: Section) -> int:
        node, _, local = str(name).partition(":")
        if node not in index or not local.isdigit() or int(local) >= nodes[index[node]].num_gpus:
            raise ps.error("gpus", f"expected a GPU as \"node:local_index\" of a listed node, got {name!r}")
        return int(offsets[index[node]]) + int(local)

    for i, item in enumerate(net.items("gpu_pairs", default=[], non_empty=False)):
        ps = Section(item, net.file, f"cluster.network.gpu_pairs[{i}]")
        pair = ps.items("gpus")
        if len(pair) != 2:
            raise ps.error("gpus", f"expected two GPUs, got {pair!r}")
        a, b = gpu(pair[0], ps), gpu(pair[1], ps)
        if a == b:
            raise ps.error("gpus", f"expected two different GPUs, got {pair!r}")
        value = ps.bandwidth("gb_per_s")
        ps.done()
        na, nb = node_of_gpu[a], node_of_gpu[b]
        if na == nb:
            la, lb = a - offsets[na], b - offsets[na]
            intra[na][la, lb] = intra[na][lb, la] = value
        else:
            pairs[(min(a, b), max(a, b))] = value
    return pairs
