"""Failed GPUs and the cluster that survives them: the `--failed` list of `solve replan` (whole nodes, trays and
single GPUs) read against an instance, and the survivors as a cluster of their own, in the order their plans
fill them (docs/replan.md).

A node (a tray of a rack is a node: a host with its GPUs) with some failed GPUs keeps the others as a smaller
node; a failed node leaves the cluster. Survivors keep every bandwidth they had: a GPU pair's figure does not
depend on which other GPUs failed."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from formulation.errors import InputError
from formulation.inputs.cluster import Cluster, Node


def parse_failed(text: str, cluster, flag: str = "--failed") -> tuple[int, ...]:
    """`node-a,node-b:3`: every GPU of node-a and GPU 3 of node-b, as sorted global GPU indices. An unknown node,
    a GPU index outside its node, an empty entry or a list that leaves no GPU is an `InputError` naming `flag`."""
    failed: set[int] = set()
    for item in text.split(","):
        name = item.strip()
        if not name:
            raise InputError(flag, text, "expected a comma-separated list of nodes (node) and GPUs (node:index), "
                                         "found an empty entry")
        node, colon, local = name.partition(":")
        index = cluster.node_index.get(node)
        if index is None:
            listed = cluster.nodes
            raise InputError(flag, name, f"unknown node {node!r} (the instance lists {len(listed)} nodes: "
                                         f"{listed[0].name} ... {listed[-1].name})")
        count = cluster.nodes[index].num_gpus
        offset = int(cluster.node_offset[index])
        if not colon:
            failed.update(range(offset, offset + count))
            continue
        if not local.isdigit() or int(local) >= count:
            raise InputError(flag, name, f"GPU index {local!r} out of range: {node} has {count} GPUs (0 .. {count - 1})")
        failed.add(offset + int(local))
    if len(failed) >= cluster.num_gpus:
        raise InputError(flag, text, f"every one of the {cluster.num_gpus} GPUs failed: nothing left to plan on")
    return tuple(sorted(failed))


@dataclass(frozen=True, eq=False)
class Survivors:
    """The GPUs left after `failed`, in the order plans fill them: whole nodes first, in the listed order except
    that nodes whose fastest link to the others is slower than most nodes' (a slow NIC) come after them, then the
    nodes that lost some GPUs. `order[k]` is the original global index of survivor k; `instance` is the original."""

    instance: object
    failed: tuple[int, ...]
    order: tuple[int, ...]
    node_order: tuple[int, ...]  # original node indices, in the survivors' order

    @classmethod
    def of(cls, instance, failed) -> "Survivors":
        cluster = instance.cluster
        failed = tuple(sorted(set(int(g) for g in failed)))
        dead = set(failed)
        lost = np.bincount(cluster.gpu_node[list(failed)], minlength=len(cluster.nodes)) if failed else \
            np.zeros(len(cluster.nodes), dtype=int)
        inter = cluster.inter_gb_per_s
        alive = [n for n in range(len(cluster.nodes)) if lost[n] < cluster.nodes[n].num_gpus]
        whole = [n for n in alive if lost[n] == 0]
        links = np.where(np.isfinite(inter), inter, -np.inf)[np.ix_(whole, whole)]
        fastest = dict(zip(whole, links.max(axis=1).tolist())) if len(whole) > 1 else {n: 0.0 for n in whole}
        usual = float(np.median(list(fastest.values()))) if fastest else 0.0
        key = {n: (lost[n] > 0, fastest.get(n, 0.0) < usual, n) for n in alive}
        node_order = tuple(sorted(alive, key=key.__getitem__))
        order = tuple(g for n in node_order for g in cluster.gpus_of_nodes([n]) if g not in dead)
        return cls(instance, failed, order, node_order)

    @property
    def num_gpus(self) -> int:
        return len(self.order)

    @cached_property
    def whole_node_gpus(self) -> int:
        """GPUs on nodes that lost none (they come first in `order`)."""
        lost = set(int(self.instance.cluster.gpu_node[g]) for g in self.failed)
        return sum(self.instance.cluster.nodes[n].num_gpus for n in self.node_order if n not in lost)

    def first(self, world: int):
        """An instance whose cluster is the first `world` survivors (the last node cut to what is taken), and the
        original index of each of its GPUs. Cached: the searches ask for the same worlds again."""
        cached = self._firsts.get(world)
        if cached is None:
            cached = self._firsts[world] = self._subcluster(self.order[:world])
        return cached

    @cached_property
    def _firsts(self) -> dict:
        return {}

    @cached_property
    def all(self):
        """Every survivor: the instance a fresh `solve` on the reduced cluster would plan."""
        return self.first(self.num_gpus)

    def _subcluster(self, gpus: tuple[int, ...]):
        cluster = self.instance.cluster
        nodes, intra, node_ids, new_index = [], [], [], {}
        for g in gpus:
            n = int(cluster.gpu_node[g])
            if not node_ids or node_ids[-1] != n:
                node_ids.append(n)
                nodes.append([])
            new_index[g] = len(new_index)
            nodes[-1].append(int(cluster.gpu_local[g]))
        for n, locals_ in zip(node_ids, nodes):
            intra.append(cluster.intra_gb_per_s[n][np.ix_(locals_, locals_)].copy())
        inter = cluster.inter_gb_per_s[np.ix_(node_ids, node_ids)].copy()
        pairs = {(new_index[a], new_index[b]): v for (a, b), v in cluster.gpu_pair_gb_per_s.items()
                 if a in new_index and b in new_index}
        # every other field (latencies, fabrics, ...) as the cluster has it; NVLink domains renumbered in the
        # survivors' order (a domain is a set of nodes, so a survivor keeps its rack-mates at the domain's figure)
        domains = None
        if cluster.domain_of_node is not None:
            renumber: dict[int, int] = {}
            domains = tuple(renumber.setdefault(cluster.domain_of_node[n], len(renumber)) for n in node_ids)
        sub = dataclasses.replace(
            cluster, nodes=tuple(Node(cluster.nodes[n].name, cluster.nodes[n].gpu_type, len(l))
                                 for n, l in zip(node_ids, nodes)),
            intra_gb_per_s=tuple(intra), inter_gb_per_s=inter, gpu_pair_gb_per_s=pairs, domain_of_node=domains,
            domain_names=tuple(cluster.domain_names[d] for d in dict.fromkeys(cluster.domain_of_node[n]
                                                                              for n in node_ids))
            if domains is not None and cluster.domain_names else cluster.domain_names)
        return dataclasses.replace(self.instance, cluster=sub), np.asarray(gpus, dtype=np.int64)
