"""The composition program: pipeline stages on islands of identical GPUs (docs/mixed-gpu-types.md (H1)-(H8)).

For one configuration (tp, pp, cp, dp, vpp, micro-batch, recompute, zero_stage) on a cluster cut into islands
(formulation/programs/islands.py), the program decides which island hosts each pipeline stage and how many layers it
holds. Every stage is S = tp cp dp GPUs of one island (a slot), so every data-parallel replica has the same
stage structure, as Megatron-LM requires; the world is pp S GPUs and the rest stay idle. Each island's stages
form one contiguous run of the pipeline (the pipeline visits an island once, as Tangram composes per-island
slices) and take the island's slots in pipeline order.

Inside an island every slot sees the same links, so a stage's time, exposed dp sync, optimizer step and memory
depend only on (island, position in the pipeline, layer count): they are tabulated with the evaluator's own
`stage_estimate`, and the program's objective equals `evaluate()` of the decoded placement. A model with dense
and MoE layers (docs/moe.md (E1)) is tabulated per layer mix instead of count, its one-hots w[i, k, mix] linked to
the arcs of the stages' ranges (docs/programs.md (P2b)), and the middle-stage symmetry (H5') is not used (stages of one
run then differ in their layers' kinds too).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from formulation.physics import cost, layer_kinds
from formulation.physics.memory import stage_memory
from formulation.evaluate import stage_estimate
from formulation.stage_links import stage_links
from formulation.programs.islands import Island, island_slots, stages_per_node
from formulation.programs.layer_mix import mix_partition
from formulation.programs.mip import Program
from formulation.placement import Placement
from formulation.space import Config, layer_capacity, placement_for


@dataclass
class IslandTable:
    """What hosting a stage on island k costs, for one configuration."""

    island: Island
    slots: list[tuple[int, ...]]
    per_node: int  # consecutive slots sharing a node
    gpu_type: object
    caps: list[int]  # most layers stage i can hold here (-1: not even none)
    time: dict[tuple[int, int], float] = field(default_factory=dict)  # (role, q) -> fwd + bwd per micro-batch
    exposed: dict[tuple[int, int], float] = field(default_factory=dict)  # (role, q) -> exposed dp sync
    optimizer: dict[tuple[int, int], float] = field(default_factory=dict)
    p2p_next_slot: float = 0.0  # to the next slot in the same node
    p2p_next_node: float = 0.0  # to the first slot of the next node of the island
    figures: tuple | None = None  # the search's per-island bound figures, cached (solvers/search/mixed.py)


def role(i: int, pp: int) -> int:
    """Stages 0 and pp - 1 carry the embedding and the output layer; the middle ones are alike (index 1)."""
    return i if i in (0, pp - 1) else 1


def _template(config: Config, slot) -> Placement:
    return placement_for(config, (1,) * config.pp, tuple(slot) * config.pp)


def boundary_time(instance, config: Config, src, dst) -> float:
    """(C7) one send between two stages on slots `src` and `dst`, exactly as the evaluator takes it: the
    slowest pair of ranks with the same (dp, cp, tp) coordinate."""
    job, cluster = instance.training, instance.cluster
    sp = job.sequence_parallel_size(config.tp)
    message = cost.activation_message_bytes(instance.model, job, _template(config, src)) / sp
    return max(cost.p2p_time(message, cluster.bandwidth(int(x), int(y)),
                             cluster.gpu_domain[x] == cluster.gpu_domain[y], cluster) for x, y in zip(src, dst))


def island_tables(instance, config: Config, islands: list[Island], layer_counts: bool = True) -> list[IslandTable]:
    """Per island: its slots for this configuration, the stages' layer capacities, and (layer_counts) the
    time, exposed dp sync and optimizer step of a stage of each role for every layer count."""
    cluster = instance.cluster
    S = config.tp * config.cp * config.dp
    out = []
    for isl in islands:
        slots = island_slots(isl, cluster, S, config.tp)
        gpu_type = cluster.gpu_types[isl.gpu_type]
        if not slots:
            out.append(IslandTable(isl, [], 1, gpu_type, [-1] * config.pp))
            continue
        tpl = _template(config, slots[0])
        caps = [layer_capacity(instance, tpl, i, gpu_type) for i in range(config.pp)]
        out.append(IslandTable(isl, slots, stages_per_node(isl, S), gpu_type, caps))
    if layer_counts:
        tabulate_stages(instance, config, out)
    return out


def tabulate_stages(instance, config: Config, tables: list[IslandTable]) -> list[IslandTable]:
    """Fill in what the program needs beyond the capacities (once per table): each role's time, exposed dp
    sync and optimizer step for every layer count, and the sends between the island's consecutive slots."""
    for table in tables:
        slots = table.slots
        if not slots or max(table.caps) < config.vpp or table.time:
            continue
        tpl = _template(config, slots[0])
        for r in sorted({role(i, config.pp) for i in range(config.pp)}):
            links = stage_links(instance, tpl, r)
            for q in _units(instance.model, config, r):
                est = stage_estimate(instance, tpl, r, getattr(q, "total", q), links,
                                     q if layer_kinds.is_mixed(instance.model) else None)
                table.time[(r, q)] = est.time_per_micro_batch_s
                table.exposed[(r, q)] = est.dp_exposed_s
                table.optimizer[(r, q)] = est.optimizer_s
        if len(slots) > 1 and table.per_node > 1:
            table.p2p_next_slot = boundary_time(instance, config, slots[0], slots[1])
        if len(slots) > table.per_node:
            table.p2p_next_node = boundary_time(instance, config, slots[table.per_node - 1], slots[table.per_node])
    return tables


def _units(model, config: Config, r: int) -> list:
    """What a stage of role r is tabulated by: every layer count, or (dense and MoE layers) every mix a stage of
    that role can hold."""
    if not layer_kinds.is_mixed(model):
        return list(range(config.vpp, model.num_layers + 1, config.vpp))
    stages = [i for i in range(config.pp) if role(i, config.pp) == r]
    return sorted({mix for i in stages for mix in layer_kinds.possible_mixes(model, config.pp, config.vpp, i)})


def _stage_options(instance, config: Config, tb: IslandTable, i: int) -> list:
    """The counts (or mixes) stage i can hold on island table `tb` within its memory."""
    L, v, P = instance.model.num_layers, config.vpp, config.pp
    if not layer_kinds.is_mixed(instance.model):
        return list(range(v, min(tb.caps[i], L - v * (P - 1)) + 1, v))
    tpl = _template(config, tb.slots[0])
    return [mix for mix in sorted(layer_kinds.possible_mixes(instance.model, P, v, i))
            if stage_memory(instance, tpl, i, mix.total, tb.gpu_type, dense_layers=mix.dense).fits]


@dataclass
class Composition:
    """A composition program and what its decoder needs."""

    program: Program
    config: Config
    tables: list[IslandTable]
    w: dict[tuple[int, int, object], int]  # (stage, island, layers or LayerMix) -> binary

    def decode(self, values) -> Placement:
        """Stages on island k take its slots in pipeline order."""
        c = self.config
        chosen = [max(((values[v], k, q) for (i, k, q), v in self.w.items() if i == stage))[1:]
                  for stage in range(c.pp)]
        used = [0] * len(self.tables)
        gpus: list[int] = []
        for k, _ in chosen:
            gpus += self.tables[k].slots[used[k]]
            used[k] += 1
        return placement_for(c, [getattr(q, "total", q) for _, q in chosen], gpus)


def build_composition(instance, config: Config, tables: list[IslandTable],
                      stages_on: dict[str, int] | None = None, cutoff_s: float | None = None) -> Composition:
    """(H1)-(H8) for one configuration; `stages_on` fixes how many stages the islands of each GPU type host
    together (the cost objective enumerates it: the price depends on nothing else); `cutoff_s` admits only
    iteration times up to it (then "infeasible" means: nothing here is that fast). Raises ValueError when no
    stage fits anywhere."""
    prog, c, L = Program(config=config), config, instance.model.num_layers
    job = instance.training
    t = prog.time_unit_s
    K, P, v = len(tables), c.pp, c.vpp
    m = job.global_batch_size // (c.micro_batch_size * c.dp)
    comp = Composition(prog, config, tables, {})
    w = comp.w
    # (H1) one (island, layer count) per stage, within the stage's memory on that island
    for i in range(P):
        options = []
        for k, tb in enumerate(tables):
            if not tb.slots or (stages_on is not None and stages_on.get(tb.island.gpu_type, 0) == 0):
                continue
            for q in _stage_options(instance, c, tb, i):
                w[(i, k, q)] = prog.var(f"w[{i},{k},{q}]", "binary")
                options.append(w[(i, k, q)])
        if not options:
            raise ValueError(f"stage {i} fits on no island with {v} layer(s)")
        prog.add(dict.fromkeys(options, 1), "==", 1, "H1 one island and layer count per stage")
    mixed = layer_kinds.is_mixed(instance.model)
    if mixed:  # (P2b) the stage's mix, whichever island hosts it, is its range's
        allowed = {i: sorted({q for (s, _, q) in w if s == i}) for i in range(P)}
        lam = mix_partition(prog, instance.model, P, v, allowed)
        for (i, mix), var in lam.items():
            prog.add({var: 1, **{x: -1 for (s, _, q), x in w.items() if s == i and q == mix}}, "==", 0,
                     "P2b mix on some island")
    else:  # (H2) all layers placed
        prog.add({var: q for (_, _, q), var in w.items()}, "==", L, "H2 all layers placed")

    by_stage_island: dict[tuple[int, int], dict[int, float]] = {}
    for (s, kk, _), var in w.items():
        by_stage_island.setdefault((s, kk), {})[var] = 1

    def on(i: int, k: int) -> dict[int, float]:
        return by_stage_island.get((i, k), {})

    # (H3) island capacity (slots), and the fixed stage counts per GPU type
    for k, tb in enumerate(tables):
        terms = {var: 1 for (_, kk, _), var in w.items() if kk == k}
        if terms:
            prog.add(terms, "<=", len(tb.slots), "H3 island capacity")
    for gpu_type, count in (stages_on or {}).items():
        terms = {var: 1 for (_, kk, _), var in w.items() if tables[kk].island.gpu_type == gpu_type}
        if count and not terms:
            raise ValueError(f"no stage fits on {gpu_type}")
        if terms:
            prog.add(terms, "==", count, "H3 stages on a GPU type (fixed)")
    # (H4) each island's stages are one contiguous run: at most one start
    start = {}
    for k in range(K):
        if not any(kk == k for (_, kk, _) in w):
            continue
        for i in range(P):
            start[(i, k)] = prog.var(f"start[{i},{k}]", "binary")
            terms = {start[(i, k)]: 1, **{var: -1 for var in on(i, k)}}
            if i > 0:
                for var in on(i - 1, k):
                    terms[var] = terms.get(var, 0) + 1
            prog.add(terms, ">=", 0, "H4 run start")
        prog.add({start[(i, k)]: 1 for i in range(P)}, "<=", 1, "H4 one run per island")
    # (H5) stage times, slowest stage, exposed dp sync, optimizer step, per-iteration overhead
    tau, delta, opt, over = (prog.var(n) for n in ("tau", "delta", "opt", "overhead"))
    stage_time = []
    for i in range(P):
        r = role(i, P)
        time = {var: -tables[k].time[(r, q)] / t for (s, k, q), var in w.items() if s == i}
        stage_time.append(prog.var(f"t[{i}]"))
        prog.add({stage_time[i]: 1, **time}, ">=", 0, "H5 stage time")
        prog.add({tau: 1, stage_time[i]: -1}, ">=", 0, "H5 slowest stage")
        prog.add({delta: 1, **{var: -tables[k].exposed[(r, q)] / t for (s, k, q), var in w.items() if s == i}},
                 ">=", 0, "H5 slowest exposed dp sync")
        prog.add({opt: 1, **{var: -tables[k].optimizer[(r, q)] / t for (s, k, q), var in w.items() if s == i}},
                 ">=", 0, "H5 slowest optimizer step")
        prog.add({over: 1, **{var: -tables[k].gpu_type.iteration_overhead_s / t
                              for (s, k, q), var in w.items() if s == i}}, ">=", 0, "H5 iteration overhead")
    # (H5') middle stages of one run on one island differ only in memory, which allows fewer layers on earlier
    # stages (more micro-batches in flight): their layer counts can be taken non-decreasing (symmetry)
    for i in range(1, P - 2 if not mixed else 1):
        for k in range(K):
            now, nxt = on(i, k), on(i + 1, k)
            if now and nxt:
                terms = {**{var: q for (s, kk, q), var in w.items() if s == i},
                         **{var: -q for (s, kk, q), var in w.items() if s == i + 1}}
                for var in now:
                    terms[var] = terms.get(var, 0) + L
                for var in nxt:
                    terms[var] = terms.get(var, 0) + L
                prog.add(terms, "<=", 2 * L, "H5 symmetry: non-decreasing layers in a run")
    chain = _chain(instance, prog, config, tables, on, start, m)
    # (H8) objective x vpp: vpp m tau + sum_i t_i - tau + vpp (chain + delta + opt + overhead)
    prog.objective = {tau: v * m - 1, delta: v, opt: v, over: v, **dict.fromkeys(stage_time, 1)}
    for var, weight in chain.items():
        prog.objective[var] = v * weight
    prog.objective_divisor = v
    if cutoff_s is not None:  # only plans faster than the incumbent are of interest: fewer nodes to explore
        prog.add(dict(prog.objective), "<=", cutoff_s * v / t, "H8 cutoff")
    prog.tighten_upper_bounds()
    return comp


def _chain(instance, prog: Program, c: Config, tables, on, start, m: int) -> dict[int, float]:
    """(H6) boundary j between stages on different islands k, k': c_j >= P(k, k') (a[j, k] + a[j+1, k'] - 1).
    (H7) on one island, slot positions inside a node: y[j, k, r] one-hot where stage j is on k, a run starts at
    position 0, the next stage on k takes the next position (mod stages per node); the boundary is an
    intra-node send unless it leaves the node's last position. Weights as (C10)."""
    P, v = c.pp, c.vpp
    if P == 1:
        return {}
    K = len(tables)
    usable = [k for k in range(K) if any(kk == k for (_, kk) in start)]
    rounds = math.ceil(m / P) if v == 1 else 1
    cross = {(a, b): boundary_time(instance, c, tables[a].slots[0], tables[b].slots[0])
             for a in usable for b in usable if a != b}
    pos = {}
    for k in usable:
        r = tables[k].per_node
        if r == 1:
            continue
        for j in range(P):
            pos[(j, k)] = [prog.var(f"y[{j},{k},{x}]", "binary") for x in range(r)]
            prog.add({**dict.fromkeys(pos[(j, k)], 1), **{var: -1 for var in on(j, k)}}, "==", 0,
                     "H7 position one-hot")
            prog.add({pos[(j, k)][0]: 1, start[(j, k)]: -1}, ">=", 0, "H7 a run starts at position 0")
        for j in range(P - 1):
            for x in range(r):
                prog.add({pos[(j + 1, k)][(x + 1) % r]: 1, pos[(j, k)][x]: -1, **{var: -1 for var in on(j + 1, k)}},
                         ">=", -1, "H7 next position")
    weights = {}
    boundaries = [(j, j + 1) for j in range(P - 1)] + ([(P - 1, 0)] if v > 1 else [])
    for a, z in boundaries:
        var = prog.var(f"c[{a}->{z}]")
        for (k, k2), time in cross.items():
            x = time / prog.time_unit_s
            prog.add({var: 1, **{u: -x for u in on(a, k)}, **{u: -x for u in on(z, k2)}}, ">=", -x, "H6 cross-island send")
        for k in usable:
            tb = tables[k]
            both = {**{u: 1 for u in on(a, k)}, **{u: 1 for u in on(z, k)}}
            if z == a + 1:
                if tb.per_node == 1:
                    same = [(tb.p2p_next_node, both)]
                else:  # inside the node unless stage a sits on the node's last position
                    same = [(tb.p2p_next_slot, both),
                            (tb.p2p_next_node, {pos[(a, k)][-1]: 1, **{u: 1 for u in on(z, k)}})]
            else:  # wrap: all stages on k (one run); inside one node iff pp <= stages per node
                same = [(tb.p2p_next_slot if P <= tb.per_node else tb.p2p_next_node, both)]
            for time, terms in same:
                x = time / prog.time_unit_s
                if x > 0:
                    prog.add({var: 1, **{u: -x for u in terms}}, ">=", -x, "H7 same-island send")
        weights[var] = rounds * 2 * (v if z == a + 1 else v - 1)
    return weights
