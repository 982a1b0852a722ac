"""A plan on NVLink domains (racks, `cluster.nvlink_domains`) as launched: where its tp, cp and ep groups sit
against the racks, the environment NCCL and HybridEP read there, the Slurm lines that pin the job to its racks,
and the self-check that the launch keeps every group the plan keeps inside a rack inside it.

Environment, each from its documentation:
- `NCCL_MNNVL_ENABLE=1`: NCCL's multi-node NVLink (NCCL user guide, Environment Variables: 0 off, 1 on, 2 auto, the
  default; its troubleshooting page: "NCCL uses MNNVL for inter-node communication within the same NVLink domain
  if available"). 1 rather than auto: a rack whose IMEX service is down then fails at start instead of silently
  running its cross-tray traffic over the NICs, which the plan did not price.
- `NVLINK_DOMAIN_SIZE`, `USE_MNNVL`, `NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN`: read by DeepEP's HybridEP, the
  backend of Megatron-Core's flex dispatcher (`--moe-flex-dispatcher-backend hybridep`, which its
  TransformerConfig documents as the only backend that supports the MNNVL case). NVIDIA's Megatron-Bridge GB200 /
  GB300 recipes set 72, 1 and the ep ranks sharing one domain (64 for ep 64 on one NVL72); HybridEP asserts that
  the ep group's size is a multiple of the last. Set for plans with ep > 1 only; other dispatchers ignore them.
- Slurm: `#SBATCH --segment=<trays>` (sbatch(1), topology/block: the allocation is built of segments of that many
  nodes, each inside one block), with the rack's trays listed by `--nodelist` as the plan places them.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from formulation.placement import Placement
from solvers.outputs.launch import LaunchMismatch

GROUP_KINDS = ("tp", "cp", "ep")


def _groups(p: Placement, kind: str) -> list[tuple[int, ...]]:
    """The GPUs of every group of `kind` (tp, cp or ep) of the placement."""
    if kind == "ep":
        if p.ep <= 1:
            return []
        grid = p.expert_grid(p.ep, p.etp)
        pp, edp, ep, etp = grid.shape
        return [tuple(int(g) for g in grid[s, d, :, t]) for s in range(pp) for d in range(edp) for t in range(etp)]
    size = p.tp if kind == "tp" else p.cp
    if size <= 1:
        return []
    grid = p.grid  # (pp, dp, cp, tp)
    if kind == "tp":
        return [tuple(int(g) for g in grid[s, d, c, :]) for s in range(grid.shape[0]) for d in range(grid.shape[1])
                for c in range(grid.shape[2])]
    return [tuple(int(g) for g in grid[s, d, :, t]) for s in range(grid.shape[0]) for d in range(grid.shape[1])
            for t in range(grid.shape[3])]


def domain_layout(cluster, p: Placement) -> dict[str, dict]:
    """Per group kind (tp, cp, ep with more than one member): how many groups, whether every one lies inside
    one NVLink domain, and the most domains one group spans."""
    out = {}
    for kind in GROUP_KINDS:
        groups = _groups(p, kind)
        if not groups:
            continue
        spans = [len(set(int(cluster.gpu_domain[g]) for g in group)) for group in groups]
        out[kind] = {"groups": len(groups), "inside_one_domain": max(spans) == 1, "most_domains_spanned": max(spans)}
    return out


def ep_ranks_per_domain(cluster, p: Placement) -> int | None:
    """The ranks of an ep group on one domain when every ep group has the same count on every domain it touches
    (HybridEP's NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN), else None."""
    counts = set()
    for group in _groups(p, "ep"):
        _, per = np.unique([int(cluster.gpu_domain[g]) for g in group], return_counts=True)
        counts.update(int(c) for c in per)
    return counts.pop() if len(counts) == 1 else None


def rack_environment(instance, p: Placement) -> tuple[dict[str, str], list[str]]:
    """(environment variables, notes) for a plan on a cluster with NVLink domains; ({}, []) without them."""
    cluster = instance.cluster
    if not cluster.has_domains:
        return {}, []
    used = sorted({int(cluster.gpu_domain[g]) for g in p.gpus})
    size = max(int(cluster.domain_gpus[d]) for d in used)
    env = {"NCCL_MNNVL_ENABLE": "1"}
    notes = [f"NVLink domains: the plan runs on {len(used)} of them (up to {size} GPUs each); NCCL_MNNVL_ENABLE=1 "
             "makes NCCL use multi-node NVLink across a rack's trays or fail at start (the plan prices those pairs "
             "at the domain's figure)"]
    if p.ep > 1:
        env.update({"NVLINK_DOMAIN_SIZE": str(size), "USE_MNNVL": "1"})
        per = ep_ranks_per_domain(cluster, p)
        if per is not None:
            env["NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN"] = str(per)
        else:
            notes.append("the ep groups meet the racks unevenly: NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN is left to "
                         "HybridEP's own detection")
    return env, notes


def layout_lines(cluster, p: Placement) -> list[str]:
    """The plan's groups against the racks, in words (the launch README)."""
    if not cluster.has_domains:
        return []
    lines = []
    for kind, row in domain_layout(cluster, p).items():
        where = ("inside one NVLink domain (rack)" if row["inside_one_domain"]
                 else f"across up to {row['most_domains_spanned']} NVLink domains")
        lines.append(f"{kind}: {row['groups']} groups of {getattr(p, kind)}, every one {where}")
    return lines


def slurm_rack_lines(cluster, hosts: list[str]) -> list[str]:
    """`#SBATCH --segment` (trays per rack, when every rack used gives the job the same number) and one comment
    line per rack: its trays in the job."""
    if not cluster.has_domains:
        return []
    by_domain: dict[int, list[str]] = {}
    for host in hosts:
        by_domain.setdefault(int(cluster.node_domain[cluster.node_index[host]]), []).append(host)
    counts = {len(v) for v in by_domain.values()}
    lines = [f"#SBATCH --segment={counts.pop()}"] if len(counts) == 1 else []
    lines.append("# NVLink domains (racks) of the job, each pinned by --nodelist to the trays the plan gives it:")
    for d, members in sorted(by_domain.items()):
        lines.append(f"#   {cluster.domain_name(d)}: {len(members)} trays, {members[0]} .. {members[-1]}")
    return lines


def check_domains(instance, p: Placement, gpus: list[int], route: str) -> None:
    """Raise `LaunchMismatch` unless every tp, cp and ep group of the
    launch (`gpus`: the GPU of every global rank as the route starts it) lies inside one NVLink domain wherever
    the plan's own groups of that kind do."""
    cluster = instance.cluster
    if not cluster.has_domains:
        return
    planned = domain_layout(cluster, p)
    launched = domain_layout(cluster, dataclasses.replace(p, gpus=tuple(gpus)))
    for kind, want in planned.items():
        if want["inside_one_domain"] and not launched[kind]["inside_one_domain"]:
            raise LaunchMismatch(f"{route}: a {kind} group spans {launched[kind]['most_domains_spanned']} NVLink domains; "
                             f"the plan keeps every {kind} group inside one")
