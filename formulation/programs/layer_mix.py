"""The partition of a model with dense and MoE layers (docs/programs.md (P2b), docs/moe.md (E1)), shared by the
exact program (formulation/programs/exact.py), the partition program (solvers/local/partition.py) and the
composition program (formulation/programs/composition.py).

A stage's cost and memory depend on its `LayerMix` (dense and MoE layer counts), which depends on where the stage
starts, not only on its length. The program therefore chooses, per stage, one mix lambda[i, mix] (the one-hot
the cost rows select on, as lambda[i, q] does for a model of one kind) and one range: an arc x[i, s, e] from
boundary position s to e (chunk units, formulation/physics/layer_kinds.py (E1a)) of a path through the
positions, stage by stage:

    sum_{s, e} x[0, 0, e] = 1,   x only on ranges stage i can span (stage 0 starts at 0, the last ends at L / vpp)
    sum_s x[i, s, t] = sum_e x[i + 1, t, e]          for every stage i < pp - 1 and position t (flow)
    lambda[i, mix] = sum of x[i, s, e] over the ranges (s, e) that hold `mix`

The arcs form a path from 0 to L / vpp with one arc per stage, so the stages' ranges are contiguous and in order
and each mix is its range's; the path rows are a network matrix, so the LP relaxation of the partition alone is
integral (the usual (stage, start, count) formulation, here only for models whose layers differ in kind).
"""

from __future__ import annotations

from formulation.physics import layer_kinds


def mix_partition(prog, model, pp: int, vpp: int, allowed: dict[int, list]) -> dict[tuple[int, object], int]:
    """(P2b) lambda[i, mix] over `allowed[i]` (the mixes stage i may hold, e.g. those that fit in memory) and the
    arcs of the stages' ranges linking them. Returns {(stage, mix): lambda variable}."""
    lam: dict[tuple[int, object], int] = {}
    into: list[dict[int, dict[int, float]]] = []  # stage -> end position -> {arc: 1}
    for i in range(pp):
        if not allowed[i]:
            raise ValueError(f"stage {i} can hold no layer mix")
        ranges = layer_kinds.possible_mixes(model, pp, vpp, i)
        ends: dict[int, dict[int, float]] = {}
        for mix in allowed[i]:
            lam[(i, mix)] = prog.var(f"lambda[{i},{mix.dense}d{mix.moe}m]", "binary")
            arcs = {}
            for start, end in ranges[mix]:
                arc = prog.var(f"x[{i},{start},{end}]", "binary")
                arcs[arc] = 1
                ends.setdefault(end, {})[arc] = 1
                if i > 0:  # flow: what enters position `start` from stage i - 1 leaves it in stage i
                    into[i - 1].setdefault(start, {})[arc] = -1
            prog.add({lam[(i, mix)]: 1, **{arc: -1 for arc in arcs}}, "==", 0, "P2b mix of the stage's range")
        prog.add({lam[(i, mix)]: 1 for mix in allowed[i]}, "==", 1, "P2b one layer mix per stage")
        into.append(ends)
    for i in range(pp - 1):
        for position, terms in into[i].items():
            prog.add(terms, "==", 0, "P2b contiguous stages")
    return lam
