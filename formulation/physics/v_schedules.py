"""torchtitan's V-shaped pipeline schedules (docs/schedules.md (S3)): ZBVZeroBubble (Qi et al., ICLR 2024, section
6) and DualPipeV (torch's ScheduleDualPipeV, DeepSeek's DualPipe cut in half). Two chunks per rank (vpp = 2), rank r
holding virtual stages r and 2 pp - 1 - r, so the first and the last chunk (embedding and output layer) sit on rank
0 and no send wraps from the last rank to the first.

Time. With every stage alike (F, B, W a rank's forward, input-gradient and weight-gradient time per micro-batch over
both its chunks) and m >= 2 pp micro-batches, the event simulation of torch's op order
(formulation/physics/pipeline_sim.py) runs m (F + B + W) plus a bubble that is the maximum of a few linear forms of
F, B, W, independent of m (derived and checked in docs/schedules.md):

    ZBV        x(F, B, W) / 2 + (pp - 2) y(F, B, W) / 2,   x in X_ZBV, y in Y_ZBV (both maxima)
    DualPipeV  (pp - 1) L(F, B, W) / 2 - d_L F / 2,        L in L_DPV

With stages unlike, a *row* per critical stage k and pair of forms, as (S1) does for the other schedules:
m t_k + alpha . (F_k, B_k, W_k) + gamma . sum_{j != k} (F_j, B_j, W_j), the time the largest row. Each row is
stored times D = 2 (pp - 1) with integer coefficients (what the exact program takes, docs/programs.md (P12'')).
"""

from __future__ import annotations

import functools

from formulation.physics import schedule_orders

V_FAMILIES = ("zbv", "dualpipev")
# ZBV: the bubble of two stages (x) and what each further stage adds (y), chunk units, as (F, B, W) coefficients
X_ZBV = ((0, 2, -2), (1, 0, 0), (2, -1, -1), (1, 1, -2), (0, 1, 0), (2, 0, -3))
Y_ZBV = ((0, 2, -2), (0, 1, 0), (2, -1, 0), (2, 0, -2))
# DualPipeV: (pp - 1) L - d F per form (L, d)
L_DPV = (((1, 1, -1), 0), ((2, 0, -2), 0), ((0, 2, -1), 1))


def min_micro_batches(pp: int) -> int:
    """torch's DualPipeV needs m >= 2 pp (its stages); the ZBV form holds from there on (torch pads ZBV's order to
    2 pp - 1 micro-batches, docs/schedules.md), so both are searched with m >= 2 pp."""
    return 2 * pp


def rows(family: str, pp: int) -> list[tuple[tuple[int, int, int], tuple[int, int, int]]]:
    """(alpha D, gamma D) of every row, D = 2 (pp - 1): integer (F, B, W) coefficients of the critical stage and
    of each other stage."""
    if family == "zbv":  # (with pp = 2 the y forms drop out: one row per x)
        pairs = [(tuple((pp - 1) * c for c in x), tuple((pp - 2) * c for c in y)) for x in X_ZBV for y in Y_ZBV]
        return list(dict.fromkeys(pairs))
    return [(((1 - pp) * d, 0, 0), tuple((pp - 1) * c for c in form)) for form, d in L_DPV]


def model_rows(family: str, pp: int) -> list[tuple[tuple[int, int, int], tuple[int, int, int]]]:
    """The rows the evaluator and the exact program use: `rows` less those no larger than another row whenever
    B >= F on every stage, which the evaluator's stages always have (the backward is twice the forward's compute,
    W <= F, and its communication comes on top): ZBV's x = f, 2f - b - w, f + b - 2w, 2f - 3w and y = 2f - b,
    2f - 2w, DualPipeV's 2F - 2W. What is left weighs no stage time negatively (what the program needs). ZBV's
    rows here spread x over the other stages as (S1) spreads its shares: m t_k + sum_{j != k} (x_j + (pp - 2)
    y_j) / D, the same with stages alike and closer to the simulation with stages unlike (docs/schedules.md)."""
    keep = ((0, 2, -2), (0, 1, 0))
    if family == "zbv":  # each other stage j adds (x_j + (pp - 2) y_j) / D, the critical stage m t_k alone
        return list(dict.fromkeys(((0, 0, 0), tuple(a + (pp - 2) * c for a, c in zip(x, y)))
                                  for x in keep for y in keep))
    return [row for row, (form, _) in zip(rows(family, pp), L_DPV) if form != (2, 0, -2)]


def scale(pp: int) -> int:
    """D = 2 (pp - 1): the rows' common denominator."""
    return 2 * (pp - 1)


def pipeline_time(family: str, times, forward, weight, num_micro_batches: int, exact: bool = False
                  ) -> tuple[float, int]:
    """(S3) The schedule without sends: the largest row over critical stages k and forms (`model_rows`, or every
    form with `exact`); B = t - F - W. Returns the time and the critical stage."""
    pp, D = len(times), scale(len(times))
    stages = [(f, t - f - w, w) for t, f, w in zip(times, forward, weight)]
    sums = [sum(s[c] for s in stages) for c in range(3)]
    table = rows(family, pp) if exact else model_rows(family, pp)
    best, critical = float("-inf"), 0
    for k, own in enumerate(stages):
        others = [sums[c] - own[c] for c in range(3)]
        extra = max(sum(a[c] * own[c] + g[c] * others[c] for c in range(3)) for a, g in table)
        value = num_micro_batches * times[k] + extra / D
        if value > best:
            best, critical = value, k
    return best, critical


def bubble_alike(family: str, pp: int, forward: float, backward_input: float, weight: float) -> float:
    """The bubble with every stage alike (the maxima above), from the rows: what the simulation shows exactly."""
    t = forward + backward_input + weight
    return pipeline_time(family, [t] * pp, [forward] * pp, [weight] * pp, 0, exact=True)[0]


def order(family: str, rank: int, pp: int, m: int) -> list:
    """torch's op order of `rank` (formulation/physics/schedule_orders.py)."""
    make = schedule_orders.zbv if family == "zbv" else schedule_orders.dualpipev
    return make(rank, pp, m)


@functools.lru_cache(maxsize=4096)
def in_flight_chunks(family: str, rank: int, pp: int, m: int) -> int:
    """(S4) Chunks whose activations `rank` holds at its peak along torch's order: a chunk from its forward until
    its weight gradient (W, or DualPipeV's whole backward) has run."""
    return schedule_orders.peak_held(order(family, rank, pp, m))


def output_stage(schedule: str, pp: int) -> int:
    """The rank holding the last chunk (final norm, output layer and loss): 0 in a V, else the last."""
    return 0 if schedule in V_FAMILIES else pp - 1
