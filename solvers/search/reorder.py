"""Plans whose pipeline visits an island more than once, on clusters of several GPU types.

The composition program (formulation/programs/composition.py, (H4)) runs each island's stages as one contiguous
stretch of the pipeline. That can cost: the first stages hold the most micro-batches in flight (the smallest
memory caps) and the last one the output layer, so the fast island's stages want the middle positions and a
slow stage the last. On mixtral_8x7b_a100_h100_64 (tp 2, pp 8, dp 4, one node a stage) A100 stages at positions
0-2 and 7 around four H100 stages take 4.891 s, the best contiguous order (A100 first) 5.066 s: with an A100
stage last, the H100 stages sit where they can hold 6 layers each without the output layer.

This search takes configurations in the order of their work floor (B5's W) and, for each, the slowest stage's
level tau upwards: at tau, every position i on every island k holds at most the most layers whose stage time
(the island's tabulated time for the position's role) is within tau and that fit its memory; an assignment of
positions to the islands' slots (each slot once) holding the most layers says whether tau is reachable. The
first few reachable levels are turned into placements (layers trimmed to the model's from the slowest
positions) and scored by the evaluator. It proves nothing; the bound comes from (B5)."""

from __future__ import annotations

import time

import numpy as np

from formulation.evaluate import evaluate
from formulation.physics import layer_kinds
from formulation.programs.composition import island_tables, role
from formulation.programs.islands import find_islands
from formulation.space import placement_for

LEVELS = 4  # reachable levels of the slowest stage scored per configuration


def reorder_search(instance, incumbent_s: float, deadline: float, floors: list):
    """The fastest placement found whose stages sit on island slots in any order, if it beats `incumbent_s`:
    (placement, estimate), else None. Configurations in work-floor order while the floor is below the best time
    found and the `deadline` is not reached."""
    if layer_kinds.is_mixed(instance.model):  # tables by layer mix: not done here
        return None
    islands = find_islands(instance.cluster)
    if len(islands) < 2:
        return None
    best, best_s = None, incumbent_s
    seen = set()
    for floor, _, config in floors:
        if floor >= best_s or time.perf_counter() > deadline:
            break
        if config.pp < 3:  # with two stages every order is a composition
            continue
        for placement in level_placements(instance, config, islands):
            key = (config, placement.layers_per_stage, tuple(placement.gpus))
            if time.perf_counter() > deadline or key in seen:
                continue
            seen.add(key)
            estimate = evaluate(instance, placement, check=False)
            if estimate.fits and estimate.iteration_time_s < best_s:
                best, best_s = (placement, estimate), estimate.iteration_time_s
    return best


def level_placements(instance, config, islands):
    """Up to LEVELS placements of `config` at the lowest reachable levels of the slowest stage (module docstring)."""
    from scipy.optimize import linear_sum_assignment  # here: scipy.optimize takes 0.6 s to import

    tables = [tb for tb in island_tables(instance, config, islands) if tb.slots and max(tb.caps) >= config.vpp]
    P, v, L = config.pp, config.vpp, instance.model.num_layers
    slots = [(k, s) for k, tb in enumerate(tables) for s in tb.slots]
    if len(tables) < 2 or len(slots) < P:
        return
    times = np.full((len(tables), P, L + 1), np.inf)  # island, position, layers -> stage time
    for k, tb in enumerate(tables):
        for i in range(P):
            for q in range(v, min(tb.caps[i], L) + 1, v):
                times[k, i, q] = tb.time.get((role(i, P), q), np.inf)
    levels = np.unique(times[np.isfinite(times)])
    column = np.array([k for k, _ in slots])
    found = 0
    for tau in levels:
        fits = times <= tau * (1 + 1e-12)
        most = np.where(fits.any(axis=2), L - np.argmax(fits[:, :, ::-1], axis=2), 0)  # [island, position]
        grid = most[column, :].T  # [position, slot]
        rows, cols = linear_sum_assignment(grid, maximize=True)
        if grid[rows, cols].min() < v or grid[rows, cols].sum() < L:
            continue
        layers = [int(grid[i, c]) for i, c in zip(rows, cols)]
        isl = [int(column[c]) for c in cols]
        while sum(layers) > L:  # trim from the slowest position that can give a chunk
            i = max((j for j in range(P) if layers[j] > v), key=lambda j: times[isl[j], j, layers[j]])
            layers[i] -= v
        gpus = [g for c in cols for g in slots[c][1]]
        yield placement_for(config, tuple(layers), tuple(gpus))
        found += 1
        if found >= LEVELS:
            return
