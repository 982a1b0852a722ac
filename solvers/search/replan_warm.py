"""The old plan's configuration on the survivors of a failure, the first candidates of a re-plan
(solvers/search/replan.py, docs/replan.md): on spare GPUs (the same configuration), or with a smaller dp (the
replicas that lost no GPU kept in place), each scored by the evaluator on the original cluster."""

from __future__ import annotations

import dataclasses

import numpy as np

from formulation.errors import InputError
from formulation.evaluate import evaluate
from formulation.inputs.failures import Survivors
from formulation.placement import Placement, check_placement
from formulation.space import divisors


def warm_starts(instance, old: Placement, surv: Survivors) -> list[tuple[str, Placement, object]]:
    """The old configuration on the survivors, scored on the original cluster: `spares` (failed GPUs replaced by
    unused survivors, node for node where a whole node is free) and `smaller dp` (the replicas that lost no GPU
    kept where they were, the others' ranks on unused survivors). Those that do not fit are left out."""
    out = []
    for label, placement in (("spares", _on_spares(old, surv)), ("smaller dp", _smaller_dp(instance, old, surv))):
        if placement is None:
            continue
        try:
            check_placement(instance, placement, f"<{label}>")
        except InputError:
            continue
        est = evaluate(instance, placement, check=False)
        if est.fits:
            out.append((label, placement, est))
    return out


def _unused(used, surv: Survivors) -> list[int]:
    used = set(used)
    return [g for g in surv.order if g not in used]


def _on_spares(old: Placement, surv: Survivors) -> Placement | None:
    cluster, dead = surv.instance.cluster, set(surv.failed)
    hit = [g for g in old.gpus if g in dead]
    if not hit:
        return old
    spare = _unused(old.gpus, surv)
    if len(spare) < len(hit):
        return None
    swap: dict[int, int] = {}
    free_nodes = [n for n in surv.node_order if all(g in spare for g in cluster.gpus_of_nodes([n]))]
    for node in dict.fromkeys(int(cluster.gpu_node[g]) for g in hit):
        size = cluster.nodes[node].num_gpus
        twin = next((n for n in free_nodes if cluster.nodes[n].num_gpus == size and
                     cluster.nodes[n].gpu_type == cluster.nodes[node].gpu_type), None)
        if twin is not None:
            free_nodes.remove(twin)
            for g, s in zip(cluster.gpus_of_nodes([node]), cluster.gpus_of_nodes([twin])):
                if g in dead:
                    swap[g] = s
    taken = set(swap.values())
    rest = iter(g for g in spare if g not in taken)
    gpus = [swap.get(g) or next(rest) if g in dead else g for g in old.gpus]
    return dataclasses.replace(old, gpus=tuple(int(g) for g in gpus))


def _smaller_dp(instance, old: Placement, surv: Survivors) -> Placement | None:
    """The old configuration with the largest smaller dp that fits (its recompute first, then the job's other
    choices: fewer replicas hold more optimizer state each)."""
    for recompute in dict.fromkeys([old.recompute, *instance.training.recompute]):
        candidate = _fewer_replicas(instance, dataclasses.replace(old, recompute=recompute), surv)
        if candidate is not None and evaluate(instance, candidate, check=False).fits:
            return candidate
    return None


def _fewer_replicas(instance, old: Placement, surv: Survivors) -> Placement | None:
    dead, gbs = set(surv.failed), instance.training.global_batch_size
    grid = old.grid  # [pp, dp, cp, tp]
    whole = [d for d in range(old.dp) if not any(int(g) in dead for g in grid[:, d].ravel())]
    per_replica = old.tp * old.cp * old.pp
    for dp in sorted((d for d in divisors(gbs) if d < old.dp and d * per_replica <= surv.num_gpus), reverse=True):
        if gbs % (old.micro_batch_size * dp):
            continue
        kept = whole[:dp]
        spare = iter(_unused(grid[:, kept].ravel(), surv))
        new = np.empty((old.pp, dp, old.cp, old.tp), dtype=np.int64)
        new[:, :len(kept)] = grid[:, kept]
        for d in range(len(kept), dp):
            for s in range(old.pp):
                new[s, d] = np.array([next(spare) for _ in range(old.cp * old.tp)]).reshape(old.cp, old.tp)
        placement = dataclasses.replace(old, dp=dp, gpus=tuple(int(g) for g in new.ravel()))
        try:
            check_placement(instance, placement, "<smaller dp>")
        except InputError:
            continue
        return placement
    return None
