"""The cluster a measured run ran on, as an instance's `cluster` section: a uniform cluster of the row's GPU type,
with the row's link figures and, where the row names one (an optional `nvlink_domain_gpus` column), NVLink domains
beyond a node (a GB200 / GB300 NVL72 rack of trays: docs/racks.md, formulation/inputs/domains.py)."""

from __future__ import annotations

import math


def cluster_section(gpu_type: str, n_gpus: int, per_node: int, intra_gb_per_s: float | None,
                    inter_gb_per_s: float | None, domain_gpus: int | None = None) -> dict:
    """Nodes of `per_node` GPUs (the last one as full as the run's GPUs allow, as before); with `domain_gpus`, the
    nodes (trays) are cut into NVLink domains of that many GPUs, in node order, each at the intra-node figure.
    A domain size that is not a whole number of nodes, or that does not divide the run's nodes, is a ValueError
    naming the column (the row is then skipped with that reason)."""
    section = {"gpu_types": {gpu_type: {"preset": gpu_type}},
               "nodes": [{"count": max(1, math.ceil(n_gpus / per_node)), "prefix": "n", "gpu_type": gpu_type,
                          "gpus": min(per_node, n_gpus)}],
               "network": {"intra_node_gb_per_s": intra_gb_per_s, "inter_node_gb_per_s": inter_gb_per_s}}
    if not domain_gpus:
        return section
    nodes = section["nodes"][0]["count"]
    if domain_gpus % per_node or n_gpus % per_node:
        raise ValueError(f"column nvlink_domain_gpus: {domain_gpus} GPUs per domain is not a whole number of nodes of "
                         f"{per_node} GPUs (the run has {n_gpus} GPUs)")
    per_domain = domain_gpus // per_node
    if nodes % per_domain:
        raise ValueError(f"column nvlink_domain_gpus: the run's {nodes} nodes of {per_node} GPUs do not divide into "
                         f"domains of {domain_gpus} GPUs")
    section["nvlink_domains"] = {"nodes_per_domain": per_domain, "prefix": "rack"}
    return section
