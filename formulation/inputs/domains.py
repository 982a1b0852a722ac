"""`cluster.nvlink_domains`: sets of nodes (trays) whose GPUs talk over one NVLink fabric, as the 18 trays of 4
GPUs of a GB200 / GB300 NVL72 rack (docs/instance-format.md, docs/racks.md). Read strictly: every node in at
most one domain, a domain's nodes of one GPU type and listed consecutively, at most MAX_GPUS_PER_DOMAIN GPUs."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from formulation.errors import Section
from formulation.inputs.cluster import MAX_GPUS_PER_DOMAIN, MAX_GPUS_PER_NODE, MAX_NODES, Node


@dataclass(frozen=True)
class Domain:
    name: str
    nodes: tuple[int, ...]  # node indices, consecutive
    gb_per_s: float | None  # None: the network's intra_node_gb_per_s


def load_domains(sec: Section, nodes: tuple[Node, ...]) -> list[Domain]:
    """The domains of `cluster.nvlink_domains` ([] when absent): `{"nodes_per_domain": m, "gpu_type",
    "gb_per_s", "prefix"}` cuts the nodes (of that type, in listed order) into domains of m; a list of
    `{"name", "nodes": [names], "gb_per_s"}` names each one."""
    if not sec.has("nvlink_domains"):
        _check_node_sizes(sec, nodes, set())
        return []
    raw = sec.raw("nvlink_domains")
    field = "nvlink_domains"
    if isinstance(raw, dict):
        domains = _compact(Section(raw, sec.file, f"{sec.path}.{field}"), nodes)
    elif isinstance(raw, list):
        if not raw:
            raise sec.error(field, "expected a non-empty list of domains or a {\"nodes_per_domain\"} object")
        domains = [_explicit(Section(item, sec.file, f"{sec.path}.{field}[{i}]"), nodes)
                   for i, item in enumerate(raw)]
    else:
        raise sec.error(field, 'expected {"nodes_per_domain": m} or a list of {"name", "nodes"} objects, '
                               f"got {type(raw).__name__}")
    owner: dict[int, str] = {}
    names: set[str] = set()
    for i, d in enumerate(domains):
        where = field if isinstance(raw, dict) else f"{field}[{i}]"
        if d.name in names:
            raise sec.error(f"{where}.name", f"duplicate domain name {d.name!r}")
        names.add(d.name)
        for n in d.nodes:
            if n in owner:
                raise sec.error(f"{where}.nodes", f"node {nodes[n].name!r} is already in domain {owner[n]!r}")
            owner[n] = d.name
        types = {nodes[n].gpu_type for n in d.nodes}
        if len(types) > 1:
            raise sec.error(f"{where}.nodes", f"a domain's nodes have one GPU type, got {', '.join(sorted(types))}")
        if list(d.nodes) != list(range(d.nodes[0], d.nodes[0] + len(d.nodes))):
            raise sec.error(f"{where}.nodes", "a domain's nodes must be listed consecutively in cluster.nodes, in "
                                              f"that order (domain {d.name!r})")
        gpus = sum(nodes[n].num_gpus for n in d.nodes)
        if gpus > MAX_GPUS_PER_DOMAIN:
            raise sec.error(f"{where}.nodes", f"domain {d.name!r} holds {gpus:,} GPUs, more than an NVLink domain's "
                                              f"{MAX_GPUS_PER_DOMAIN} (NVLink 5's largest)")
    _check_node_sizes(sec, nodes, set(owner))
    return sorted(domains, key=lambda d: d.nodes[0])


def _compact(ds: Section, nodes: tuple[Node, ...]) -> list[Domain]:
    size = ds.integer("nodes_per_domain", maximum=MAX_NODES)
    gpu_type = ds.string("gpu_type", default=None) if ds.has("gpu_type") else None
    gb_per_s = ds.bandwidth("gb_per_s") if ds.has("gb_per_s") else None
    prefix = ds.string("prefix", default="nvl")
    ds.done()
    chosen = [i for i, n in enumerate(nodes) if gpu_type is None or n.gpu_type == gpu_type]
    if not chosen:
        raise ds.error("gpu_type", f"no node has GPU type {gpu_type!r}")
    if len(chosen) % size:
        what = f"{len(chosen)} nodes" + (f" of type {gpu_type}" if gpu_type else "")
        raise ds.error("nodes_per_domain", f"{what} do not divide into domains of {size} (list the domains "
                                           "explicitly for one of another size)")
    count = len(chosen) // size
    width = max(2, len(str(count - 1)))
    return [Domain(f"{prefix}{k:0{width}d}", tuple(chosen[k * size:(k + 1) * size]), gb_per_s) for k in range(count)]


def _explicit(ds: Section, nodes: tuple[Node, ...]) -> Domain:
    index = {n.name: i for i, n in enumerate(nodes)}
    name = ds.string("name")
    members = ds.items("nodes")
    for value in members:
        if not isinstance(value, str) or value not in index:
            raise ds.error("nodes", f"expected names of listed nodes, got {value!r}")
    if len(set(members)) != len(members):
        raise ds.error("nodes", "a node is listed twice")
    gb_per_s = ds.bandwidth("gb_per_s") if ds.has("gb_per_s") else None
    ds.done()
    return Domain(name, tuple(index[m] for m in members), gb_per_s)


def _check_node_sizes(sec: Section, nodes: tuple[Node, ...], in_domain: set[int]) -> None:
    """A node of more than MAX_GPUS_PER_NODE GPUs is allowed only inside a declared domain."""
    for i, node in enumerate(nodes):
        if node.num_gpus > MAX_GPUS_PER_NODE and i not in in_domain:
            raise sec.error("nodes", f"node {node.name!r} has {node.num_gpus} GPUs: more than {MAX_GPUS_PER_NODE} "
                                     "only inside a declared nvlink_domains entry")


def apply_domains(domains: list[Domain], nodes: tuple[Node, ...], inter: np.ndarray,
                  intra_nominal: float) -> tuple[tuple[int, ...] | None, tuple[str, ...]]:
    """Write each domain's figure into the node matrix (every pair of its nodes) and return the domain of every
    node (nodes outside any declared domain are domains of their own, named after the node)."""
    if not domains:
        return None, ()
    of_node = [-1] * len(nodes)
    for d in domains:
        members = np.array(d.nodes)
        inter[np.ix_(members, members)] = intra_nominal if d.gb_per_s is None else d.gb_per_s
        for n in d.nodes:
            of_node[n] = -2 - domains.index(d)
    names: list[str] = []
    numbering: dict[int, int] = {}
    out = []
    for n, tag in enumerate(of_node):
        key = tag if tag != -1 else n
        if key not in numbering:
            numbering[key] = len(names)
            names.append(domains[-2 - tag].name if tag != -1 else nodes[n].name)
        out.append(numbering[key])
    return tuple(out), tuple(names)
