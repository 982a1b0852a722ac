"""(P9'') The exact program's once-per-step sync of torchtitan's pipeline stages (docs/model.md (C12)).

With pp > 1 and FSDP, torchtitan's stages gather their parameters in the step's first forward and reduce their
gradients once, after their last backward (formulation/physics/sharding.py `grad_sync_once_per_step`), so the
per-layer time u_i of (P7) carries neither the forward gather nor the reduce-scatter; the evaluator's stage adds
l_i x (the first forward's gather beyond the layer's forward compute + the reduce) to its exposed dp sync
instead (`LayerTime.step`), which the objective's delta >= E_i takes as it takes (P9)'s.
"""

from __future__ import annotations


def once_per_step_sync(b, i: int, k, ag: int, reduce: int, s_max: float) -> int:
    """E_i >= l_i s_i with s_i >= max(0, AG_i - f) + RS_i (AG_i, RS_i: the slowest shard group's all-gather and
    reduce-scatter of a layer, RS_i with replicas plus the slowest replicate group's all-reduce; f the layer's
    forward compute, `k` its constants): s_i >= RS_i and s_i >= AG_i + RS_i - f, then McCormick on the one-hot
    layer count, E_i >= q s_i - q S (1 - lambda[i, q]), S a valid upper bound of s_i (the program's time unit)."""
    prog = b.prog
    s = prog.var(f"S[{i}]")
    prog.add({s: 1, reduce: -1}, ">=", 0, "P9'' once-per-step sync per layer")
    prog.add({s: 1, ag: -1, reduce: -1}, ">=", -b.t(k.f_compute), "P9'' once-per-step sync per layer")
    exposed = prog.var(f"ES[{i}]")
    for (stage, q), lam in prog.layers.items():
        if stage == i:
            n = getattr(q, "total", q)
            prog.add({exposed: 1, s: -n, lam: -n * s_max}, ">=", -n * s_max, "P9'' once-per-step sync McCormick")
    return exposed


def with_step_sync(prog, i: int, dp: int | None, step: int | None) -> int | None:
    """(P9) and (P9'') of stage i together, as the evaluator adds them (its dp sync + l_i x LayerTime.step): today
    a stage has one or the other (the once-per-step sync is torchtitan's zero 3, which has no (P9) part); should
    both ever meet, E_i >= E_dp + E_step."""
    if dp is None or step is None:
        return step if dp is None else dp
    both = prog.var(f"EB[{i}]")
    prog.add({both: 1, dp: -1, step: -1}, ">=", 0, "P9 + P9'' exposed sync")
    return both
