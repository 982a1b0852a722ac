"""(B5) T's slowest stage taken jointly with the dp exposure, at levels of the exposure (solvers/bounds/every_placement.py).

T adds the least dp exposure of any stage to the least pipeline, each taken alone: the exposure at the fewest
layers and the best group shapes, the pipeline with every stage as loaded as it likes. They pull apart. The
iteration counts the largest exposure of any stage, delta = max_i E_i, and a stage's exposure grows with its
layers (its gradients): so at a level delta every stage holds only as many layers as keep its exposure within
delta, and the pipeline must make do with those caps. On the shipped Mixtral instance the fast H100 stages
that the pipeline wants loaded sync their experts across nodes.

The best group shapes of a stage are not free. A stage whose tp groups and ep groups all lie inside nodes
("in") has narrow dp groups (a node holds at most cap / tp of its tp groups, so at most cap / tp members of one
dp group; likewise cap / ep members of one expert-dp group, whose members lie in distinct ep groups): its
exposure is the least over those shapes (`stage_parts(whole_tp=True, whole_ep=True)`). A stage with some tp or
ep group across nodes ("out") runs every layer no faster than with that group at its least over shapes of two
or more nodes, and its exposure is the unrestricted least. Each stage is one or the other:

    for every placement with largest exposure delta*, and delta the largest candidate level <= delta* (the
    candidates are every floor E(position, type, option, layers) itself), each stage holds a count q with its
    option's floor E(q) <= delta; the least slowest stage over such partitions, each stage taking the better of
    its two options, and the stage sum at least T's (`_pipeline_at_levels`) give the pipeline, plus delta.

T_exposure = min over candidate levels delta of that, with the chain, optimizer step and overhead as T takes
them. Each stage's figures are the least (its caps the most) over the GPU types no faster than its grouping
type, as T's are."""

from __future__ import annotations

import bisect
import math
from dataclasses import replace

import numpy as np

from formulation.physics import cost
from solvers.bounds.parts import INF, best_group_time, expert_layer_floor, stage_parts


def _crossing_unit(instance, b, at, groups: tuple) -> float:
    """The least layer time at `at`'s type of a stage with some tp or ep group across nodes (INF where none can
    be: tp and ep of one member, or larger than a node, already priced across in `groups`)."""
    model, job, cluster, config = instance.model, instance.training, instance.cluster, b.config
    tp, cp, ag, rs = groups
    best = INF
    if 1 < config.tp <= b.per_node_cap and b.max_nodes > 1:
        split = best_group_time(lambda lk: cost.tp_layer_comm(model, job, b.placement, lk, cluster), config.tp,
                                b.intra, b.inter, b.max_nodes, b.per_node_cap, 2, b.span)
        best = min(best, at.unit(max(tp, split), cp, ag, rs))
    if 1 < config.ep <= b.per_node_cap and b.max_nodes > 1:
        across = expert_layer_floor(instance, b.placement, b.intra, b.inter, b.max_nodes, b.per_node_cap, b.span,
                                    ep_min_nodes=2)
        best = min(best, at.unit(tp, cp, ag, rs, max(across, b.ep)))
    return best


def stage_options(instance, b, types: list, groups: dict, layers: int) -> dict:
    """Per GPU type name: [(unit, exposures[position][q], caps[position])] for the in and out options (see the
    module docstring); exposures[i][q] for q = 0..layers (INF above the memory cap)."""
    config = b.config
    P, v = config.pp, config.vpp
    narrow = stage_parts(instance, config, whole_tp=True, caps=b.caps, whole_ep=True)
    out = {}
    for g in types:
        at = replace(b, gpu_type=g, _constants={})
        at_narrow = replace(narrow, gpu_type=g, _constants={})
        caps = groups[g.name]["caps"]
        unit = at.unit(*groups[g.name]["groups"])
        options = [(unit, at_narrow)]
        crossing = _crossing_unit(instance, b, at, groups[g.name]["groups"])
        if crossing < INF:
            options.append((max(crossing, unit), at))
        table = []
        for u, parts in options:
            exposure = np.full((P, layers + 1), INF)
            known: dict = {}  # the middle stages' constants are alike: their exposures too
            for i in range(P):
                for q in range(v, min(caps[i], layers) + 1, v):
                    key = (min(i, 1) if i < P - 1 else 2, q)
                    if key not in known:
                        known[key] = parts.dp_exposure(i, q, parts.inter, 1)
                    exposure[i, q] = known[key]
            table.append((u, exposure))
        out[g.name] = table
    return out


def least_slowest_at_exposure(stages: list[list[tuple]], extras: np.ndarray, level: float, layers: int,
                              step: int) -> float:
    """The least slowest stage over the orders of `stages` along the pipeline and their layer counts when
    every stage's exposure is at most `level`: stages[j] lists its options (unit, exposures[position][q]), the
    stage taking the better at each level (an assignment per level of the slowest stage, as
    `least_slowest_stage_any_order`); extras[i][j] the output layer of position i held by stage j."""
    from scipy.optimize import linear_sum_assignment  # here: scipy.optimize takes 0.6 s to import

    P = len(stages)
    unusable = -float(layers) * (P + 1)
    # per stage and option, per position: the most layers (a multiple of step) whose exposure fits `level`
    room = [[np.array([max((q for q in range(step, layers + 1, step) if e[i, q] <= level), default=0)
                       for i in range(P)]) for _, e in options] for options in stages]
    levels = sorted({q * u + float(extras[i, j]) for j, options in enumerate(stages)
                     for (u, _), r in zip(options, room[j]) for i in range(P) for q in range(step, int(r[i]) + 1, step)})

    def holds(tau: float) -> bool:
        fit = np.full((P, P), unusable)
        for j, options in enumerate(stages):
            for (u, _), r in zip(options, room[j]):
                f = np.minimum(r, np.floor((tau * (1 + 1e-12) - extras[:, j]) / u + 1e-9))
                f = np.where(f >= step, f // step * step, unusable)
                fit[:, j] = np.maximum(fit[:, j], f)
        rows, cols = linear_sum_assignment(fit, maximize=True)
        return fit[rows, cols].sum() >= layers

    at = bisect.bisect_left(range(len(levels)), True, key=lambda idx: holds(levels[idx]))
    return levels[at] if at < len(levels) else INF


def exposure_split(stages: list[list[tuple]], extras: np.ndarray, layers: int, step: int, pipeline, rest: float,
                   floor: float, enough: float) -> float:
    """min over candidate levels delta of pipeline(least slowest stage at delta) + max(delta, floor) + rest
    (module docstring); `pipeline(M)` the least schedule with the slowest stage at least M, non-decreasing in M.
    Levels are tried upwards until delta + pipeline(every stage's best) + rest reaches the least found or
    `enough`."""
    base = pipeline(least_slowest_at_exposure(stages, extras, INF, layers, step))
    candidates = sorted({float(x) for options in stages for _, e in options for x in e.ravel()
                         if math.isfinite(x)})
    best = INF
    for delta in candidates:
        if max(delta, floor) + base + rest >= min(best, enough):
            # every level from here on gives at least this: the bound is reached (or `enough` is)
            return min(best, max(delta, floor) + base + rest)
        M = least_slowest_at_exposure(stages, extras, delta, layers, step)
        if M < INF:
            best = min(best, pipeline(M) + max(delta, floor) + rest)
    return best
