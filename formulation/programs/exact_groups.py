"""The exact program's communication groups (docs/programs.md (P4)-(P6)): which GPU classes and nodes a group
of ranks spans, at which bandwidth levels, and its time as linear terms selected by that shape. `b` is the
program builder of `formulation/programs/exact.py` (its program, levels, classes and time scaling)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from formulation.physics import cost
from formulation.physics.cost import GroupLinks

INF = float("inf")


@dataclass
class Group:
    """A communication group of ranks and its decision variables."""

    ranks: list[int]
    member: dict[int, int] = field(default_factory=dict)  # class -> o variable (class hosts a member)
    shape: dict[tuple[int, int], int] = field(default_factory=dict)  # (nodes N, per-node k) -> sigma
    level_intra: dict[int, int] = field(default_factory=dict)  # bandwidth level -> zeta (an intra pair at it)
    level_inter: dict[int, int] = field(default_factory=dict)


def group_variables(b, ranks, family: str) -> Group:
    """(P4) membership o[g, u] >= x[r, u]; node counts as one-hot w[g, n, q]; shape sigma[g, N, k]: the group
    spans N nodes with at least k members on each, and exactly k on one. (P5) zeta[g, level] >= o + o - 1 for
    every class pair at that bandwidth level (intra-node and inter-node separately; a class with two
    members is a pair of its own)."""
    prog, ranks = b.prog, [int(r) for r in ranks]
    g = Group(ranks)
    n = len(ranks)
    for u in range(len(prog.classes)):
        g.member[u] = prog.var(f"o[{family}{ranks[0]},{u}]", "binary")
        for r in ranks:
            prog.add({g.member[u]: 1, prog.assign[(r, u)]: -1}, ">=", 0, f"P4 {family} membership")
    nodes = sorted(set(b.class_node))
    counts = {}
    for node in nodes:
        cap = min(n, sum(len(prog.classes[u]) for u in range(len(prog.classes)) if b.class_node[u] == node))
        w = {q: prog.var(f"w[{family}{ranks[0]},{node},{q}]", "binary") for q in range(cap + 1)}
        prog.add(dict.fromkeys(w.values(), 1), "==", 1, f"P4 {family} node count one-hot")
        terms = {w[q]: q for q in w}
        for u in range(len(prog.classes)):
            if b.class_node[u] == node:
                for r in ranks:
                    terms[prog.assign[(r, u)]] = terms.get(prog.assign[(r, u)], 0) - 1
        prog.add(terms, "==", 0, f"P4 {family} node count")
        counts[node] = w
    shapes = [(1, n)] + [(N, k) for N in range(2, min(n, len(nodes)) + 1) for k in range(1, n // N + 1)]
    for N, k in shapes:
        g.shape[(N, k)] = prog.var(f"sigma[{family}{ranks[0]},{N},{k}]", "binary")
    prog.add(dict.fromkeys(g.shape.values(), 1), "==", 1, f"P4 {family} one shape")
    terms = {g.shape[s]: s[0] for s in shapes}
    for node in nodes:
        terms[counts[node][0]] = terms.get(counts[node][0], 0) + 1
    prog.add(terms, "==", len(nodes), f"P4 {family} nodes spanned")  # N = sum_n (1 - w[n, 0])
    for node in nodes:
        for q, wv in counts[node].items():
            if q >= 1:  # k <= every non-zero count
                prog.add({**{g.shape[s]: s[1] for s in shapes}, wv: n}, "<=", q + n, f"P4 {family} k is a min")
    for k in {s[1] for s in shapes}:  # k is attained on some node
        terms = {g.shape[s]: 1 for s in shapes if s[1] == k}
        for node in nodes:
            if k in counts[node]:
                terms[counts[node][k]] = terms.get(counts[node][k], 0) - 1
        prog.add(terms, "<=", 0, f"P4 {family} k attained")
    for u, v in itertools.combinations_with_replacement(range(len(prog.classes)), 2):
        if u == v and len(prog.classes[u]) < 2:
            continue
        level = b.levels.index(b._bw(u, v))
        table = g.level_intra if b.class_node[u] == b.class_node[v] else g.level_inter
        if level not in table:
            table[level] = prog.var(f"zeta[{family}{ranks[0]},{level}]", "binary")
        if u == v:  # two members in one class: (cap - 1) zeta >= x-count - 1
            cap = min(n, len(prog.classes[u]))
            prog.add({table[level]: cap - 1, **{prog.assign[(r, u)]: -1 for r in ranks}}, ">=", -1,
                     f"P5 {family} pair level")
        else:
            prog.add({table[level]: 1, g.member[u]: -1, g.member[v]: -1}, ">=", -1, f"P5 {family} pair level")
    return g


def group_time(b, g: Group, fn, family: str, concurrent: bool | None = None) -> int:
    """(P6) Time of one group as latency part + the two levels' parts, each selected by shape and level:
    X_I >= A(s, b_k) (sigma_s + zeta_I[k] - 1), X_E likewise, D >= D(s) sigma_s; fn(links) is the cost
    model's time of a group with given links. `concurrent` (default: the ring collectives' (C5),
    cost.levels_concurrent; the all-to-all of (E7) always): the two levels run at once, max(intra, inter) +
    latency, so one variable X >= both parts; otherwise they add up, X_I + X_E + latency."""
    if concurrent is None:
        concurrent = cost.levels_concurrent()
    prog = b.prog
    n = len(g.ranks)
    x_i = prog.var(f"XI[{family}{g.ranks[0]}]")
    x_e = x_i if concurrent else prog.var(f"XE[{family}{g.ranks[0]}]")
    total = prog.var(f"T[{family}{g.ranks[0]}]")
    latency = {}
    for (N, k), sigma in g.shape.items():
        base = fn(GroupLinks(n, INF, INF, N, k))
        latency[sigma] = b.t(base)
        for level, zeta in g.level_intra.items():
            coef = b.t(fn(GroupLinks(n, b.levels[level], INF, N, k)) - base)
            if coef > 0:
                prog.add({x_i: 1, sigma: -coef, zeta: -coef}, ">=", -coef, f"P6 {family} intra part")
        for level, zeta in g.level_inter.items():
            coef = b.t(fn(GroupLinks(n, INF, b.levels[level], N, k)) - base)
            if coef > 0:
                prog.add({x_e: 1, sigma: -coef, zeta: -coef}, ">=", -coef, f"P6 {family} inter part")
    parts = {x_i: -1} if concurrent else {x_i: -1, x_e: -1}
    prog.add({total: 1, **parts, **{s: -v for s, v in latency.items()}}, ">=", 0, f"P6 {family} time")
    return total


def cp_time(b, g: Group, i: int) -> int:
    """(P6') Ring attention: (cp - 1)(alpha + block / bw) at the slowest pair of any level; alpha is the
    inter-node latency when the ring spans nodes."""
    prog, inst, tpl = b.prog, b.inst, b.template
    one = cost.cp_layer_comm(inst.model, inst.training, tpl, INF, True, b.cluster)
    spans = cost.cp_layer_comm(inst.model, inst.training, tpl, INF, False, b.cluster)
    x = prog.var(f"XC[cp{g.ranks[0]}]")
    total = prog.var(f"T[cp{g.ranks[0]}]")
    for table in (g.level_intra, g.level_inter):
        for level, zeta in table.items():
            coef = b.t(cost.cp_layer_comm(inst.model, inst.training, tpl, b.levels[level], True, b.cluster) - one)
            prog.add({x: 1, zeta: -coef}, ">=", 0, "P6 cp ring")
    single = g.shape[(1, len(g.ranks))]
    prog.add({total: 1, x: -1, single: b.t(spans - one)}, ">=", b.t(spans), "P6 cp time")
    return total


def sync_time(b, i: int, groups: list, kind: str, messages: dict, name: str, family: str, label: str) -> int | None:
    """(P9), (P15) The slowest of `groups`' `kind` collective after stage i's backward, whose message grows with
    the stage's layer count or mix q (`messages[q]`, bytes): each group's parts are selected by (shape, level,
    layer count) together, X >= A(s, b_k, q) (sigma_s + zeta_k + lambda[i, q] - 2). None if no message is sent.
    The expert-data-parallel groups' sync (P15) and the replicate groups' all-reduce (P9') use it; `label` names
    the constraint family."""
    prog, cluster = b.prog, b.cluster
    qs = list(messages)
    if not groups or not any(messages.values()):
        return None
    # a mix of dense layers only (P2b) syncs no experts: its latency is then selected with lambda too
    silent = [prog.layers[(i, q)] for q in qs if messages[q] == 0]
    carrying = {prog.layers[(i, q)]: 1 for q in qs if messages[q] > 0}
    slowest = prog.var(f"{family.upper()}[{i},{name}]")
    for g in groups:
        n = len(g.ranks)
        x_i, x_e, lat = (prog.var(f"{nm}[{family}{g.ranks[0]},{name}]") for nm in ("XI", "XE", "D"))
        x_e = x_i if cost.levels_concurrent() else x_e  # (C5) the levels at once: one part >= each
        for q in qs:
            lam = prog.layers[(i, q)]
            for (N, kk), sigma in g.shape.items():
                base = cost.collective_time(kind, messages[q], GroupLinks(n, INF, INF, N, kk), cluster)
                if silent and base > 0:  # lat >= base (sigma + sum of the counts that send - 1)
                    prog.add({lat: 1, sigma: -b.t(base), **{v: -b.t(base) for v in carrying}}, ">=", -b.t(base),
                             f"{label} {family} latency")
                else:  # NCCL's choice (and so the latency) depends on the message: selected with lambda too
                    prog.add({lat: 1, sigma: -b.t(base), lam: -b.t(base)}, ">=", -b.t(base), f"{label} {family} latency")
                for table, x, intra in ((g.level_intra, x_i, True), (g.level_inter, x_e, False)):
                    for level, zeta in table.items():
                        bw = b.levels[level]
                        links = GroupLinks(n, bw, INF, N, kk) if intra else GroupLinks(n, INF, bw, N, kk)
                        coef = b.t(cost.collective_time(kind, messages[q], links, cluster) - base)
                        if coef > 0:
                            prog.add({x: 1, sigma: -coef, zeta: -coef, lam: -coef}, ">=", -2 * coef,
                                     f"{label} {family} part")
        parts = {x_i: -1} if x_e == x_i else {x_i: -1, x_e: -1}
        prog.add({slowest: 1, **parts, lat: -1}, ">=", 0, f"{label} slowest {family} group")
    return slowest
