"""(B1) The least slowest stage of any layer partition under memory caps (solvers/bounds/parts.py)."""

from __future__ import annotations

import bisect
import collections
import math

import numpy as np

INF = float("inf")


def least_slowest_stage(us: list[float], extras: list[float], caps: list[int], layers: int, step: int,
                        fixed: dict[int, int] | None = None) -> float:
    """The smallest possible max_i (l_i u_i + extra_i) over partitions with l_i <= cap_i (memory), l_i a positive
    multiple of `step`, sum l_i = layers, and l_i = fixed[i] where given. INF if no partition exists.

    The most layers the stages can hold at a level grows with the level, so the answer is the smallest
    candidate level (some stage exactly at q u_i + extra_i) at which they hold all layers: binary search."""
    fixed = fixed or {}
    P = len(us)
    if not all(math.isfinite(u) for u in us):  # a stage no placement of this kind can run holds no layer
        return INF
    if sum(fixed.get(i, step) for i in range(P)) > layers or any(fixed.get(i, step) > caps[i] for i in range(P)):
        return INF
    if any(f % step for f in fixed.values()):
        return INF
    # the answer is some stage's time at a layer count it can hold; stages alike give the same candidates
    shapes = {(us[i], extras[i], fixed[i], fixed[i]) if i in fixed else (us[i], extras[i], step, min(caps[i], layers))
              for i in range(P)}
    levels = sorted({q * u + e for u, e, lo, hi in shapes for q in range(lo, hi + 1, step)})

    # stages alike (per-layer time, extra, memory cap, fixed count) hold alike: each kind is tested once, counted
    # as often as it occurs (measured_64's 32-stage configurations have a handful of kinds; the bound phase runs
    # this 16,000 times there)
    kinds = collections.Counter((us[i], extras[i], caps[i], fixed.get(i)) for i in range(P))

    def holds(level: float) -> bool:
        room = 0
        for (u, extra, cap, pinned), count in kinds.items():
            if pinned is not None:
                if pinned * u + extra > level * (1 + 1e-12):
                    return False
                room += pinned * count
                continue
            fit = min(cap, int((level - extra) / u + 1e-9)) if u > 0 else cap
            fit = fit // step * step
            if fit < step:
                return False
            room += fit * count
        return room >= layers

    at = bisect.bisect_left(range(len(levels)), True, key=lambda idx: holds(levels[idx]))
    return levels[at] if at < len(levels) else INF


def least_slowest_stage_any_order(us: list[float], extras: list[float], caps: list[int], layers: int,
                                  step: int) -> float:
    """The smallest `least_slowest_stage(us permuted, extras, caps, layers, step)` over every order of `us`: each
    stage i (its extra and memory cap fixed by its position) gets one of the per-layer times. `extras` may also
    be a matrix: extras[i][j] the extra of position i when it holds the j-th time's stage (an output layer priced
    at that stage's GPU type), and `caps` too (the memory of that stage's GPU type). At a level, the
    most layers the stages hold over all orders is an assignment problem (stages x times, Hungarian), and that
    most grows with the level: binary search over the candidate levels, as `least_slowest_stage`."""
    from scipy.optimize import linear_sum_assignment  # here: scipy.optimize takes 0.6 s to import, on every CLI start

    P = len(us)
    if not all(math.isfinite(u) and u > 0 for u in us):
        return INF
    u_col = np.asarray(us, dtype=float)[None, :]
    e_row = np.asarray(extras, dtype=float)
    e_row = e_row if e_row.ndim == 2 else e_row[:, None]  # extras[i][j]: position i holding time j's stage
    cap_row = np.minimum(np.asarray(caps), layers)
    cap_row = cap_row if cap_row.ndim == 2 else cap_row[:, None]  # caps[i][j] likewise, if a matrix
    unusable = -float(layers) * (P + 1)  # a stage that cannot hold `step` layers: no order may leave it so
    grid = np.broadcast_arrays(u_col, e_row, cap_row)  # every (position, time) pair, once per distinct triple
    pairs = np.unique(np.stack([a.ravel().astype(float) for a in grid], axis=1), axis=0)
    levels = sorted({q * u + e for u, e, cap in pairs.tolist() for q in range(step, int(cap) + 1, step)})

    def holds(level: float) -> bool:
        fit = np.minimum(cap_row, np.floor((level * (1 + 1e-12) - e_row) / u_col + 1e-9))
        fit = np.where(fit >= step, fit // step * step, unusable)
        rows, cols = linear_sum_assignment(fit, maximize=True)
        return fit[rows, cols].sum() >= layers

    at = bisect.bisect_left(range(len(levels)), True, key=lambda idx: holds(levels[idx]))
    return levels[at] if at < len(levels) else INF
