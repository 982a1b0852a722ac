"""Search over configurations for clusters of several GPU types: stages composed on islands.

Every configuration (tp, pp, cp, dp, vpp, micro-batch, recompute, zero_stage) whose stage size S = tp cp dp
fits some island is a candidate, also when pp S is less than the cluster (idle GPUs). Each gets a cheap lower
bound (H9) valid for every composition; candidates are solved exactly with the composition program
(formulation/programs/composition.py) in order of bound until none can beat the incumbent, so the returned plan is
optimal over the whole space of island compositions, with the gap stated when a time limit stops it. The loop is
the bound-and-prune driver that the one-type search runs too (solvers/search/driver.py); this module supplies
the islands' configurations, their bounds, and the solving of one composition program.

Objectives: "time" (iteration time), "cost" (GPU price per trained token: the used GPUs' price per hour x
iteration time / tokens; the stage count per GPU type is enumerated so that the price is a constant of each
program), "gpus" (the fewest GPUs whose plan reaches `required_tokens_per_s`, then the fastest of those).
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field
from functools import partial

from formulation.programs.composition import Composition, build_composition, island_tables, role, tabulate_stages
from formulation.errors import InfeasibleError
from formulation.evaluate import evaluate
from formulation.stage_links import stage_links
from formulation.programs.islands import Island, find_islands, island_slots
from formulation.physics.memory import memory_coefficients
from formulation.physics import cost, layer_kinds
from formulation.space import Config, placement_for, schedules

from solvers import backends
from solvers.search.driver import (INF, Item, NoPlanInTime, Tally, bound_and_prune, closing_status, global_bound,
                                   interruptible, time_left)
from solvers.search.objectives import OBJECTIVES, Objective


@dataclass
class Option(Item):
    """One program of the search: a configuration, and where the objective prices GPU types (cost) the stages
    each type hosts. Its `value` is the objective's value of the plan found."""

    stages_on: dict | None = None  # cost objective: GPU type -> stages it hosts


@dataclass
class ComposeResult(Tally):
    """`ranked`: options, best first; `infeasible`: configurations whose stages fit nowhere (or no composition
    fits); `bound` in the objective's unit."""

    bound: float = 0.0
    objective: str = "time"
    islands: list[Island] = field(default_factory=list)
    refuted: int = 0  # programs that proved nothing in them beats the incumbent (cutoff)


def configurations(instance, islands: list[Island]):
    """Every configuration Megatron-LM can run whose stage fits in some island, for any pp up to the slots; the
    1F1B family only (the composition program encodes (C9); docs/schedules.md)."""
    model, job, cluster = instance.model, instance.training, instance.cluster
    largest = max(isl.num_gpus for isl in islands)
    node_max = max(isl.gpus_per_node for isl in islands)
    max_tp = min(node_max, job.max_tensor_parallel_size or node_max)
    for tp in range(1, max_tp + 1):
        if model.num_attention_heads % tp or model.num_kv_heads % tp:
            continue
        for cp in job.context_parallel_sizes:
            if job.seq_length % cp:
                continue
            for dp in range(1, largest // (tp * cp) + 1):
                S = tp * cp * dp
                if job.global_batch_size % dp:
                    continue
                slots = sum(len(island_slots(isl, cluster, S, tp)) for isl in islands)
                for pp in range(1, min(slots, model.num_layers) + 1):
                    yield from (c for c in schedules(instance, tp, pp, cp, dp) if c.schedule == "1f1b")


def time_lower_bound(instance, config: Config, tables, usable: list[int], counts: dict | None = None) -> float:
    """(H9) valid for every composition on the islands `usable`: with u_k the per-layer time of a middle
    stage and out_k the output layer on island k, sum_i t_i >= L min u + min out and the slowest stage holds
    at least ceil(L / pp) layers; the schedule m tau + (sum - tau) / vpp grows in both; the stage with the
    most layers pays at least the cheapest optimizer step for them; overhead at its least."""
    L, P, v = instance.model.num_layers, config.pp, config.vpp
    m = instance.training.global_batch_size // (config.micro_batch_size * config.dp)
    most = math.ceil(L / P)
    figures = [_island_figures(instance, config, tables[k]) for k in usable]
    per_layer = [f[0] for f in figures]
    total = L * min(per_layer) + min(f[1] for f in figures)
    if counts is None:  # one group: any pp stages of the usable islands
        groups = [(P, list(range(len(usable))))]
    else:  # per GPU type exactly its count of stages
        groups = [(n, [j for j, k in enumerate(usable) if tables[k].island.gpu_type == t]) for t, n in counts.items()]
    tau = max(total / P, most * min(per_layer), _balanced_stage([tables[k] for k in usable], groups, per_layer, L))
    total = max(total, tau)
    return m * tau + (total - tau) / v + min(f[2] for f in figures) + min(f[3] for f in figures)


def _island_figures(instance, config: Config, tb) -> tuple[float, float, float, float]:
    """Island k's least per-layer time over the stage roles, output layer, cheapest optimizer step of a stage
    with ceil(L / pp) layers, and per-iteration overhead (cached on the table: the cost objective asks for
    them once per stage count vector)."""
    if getattr(tb, "figures", None) is None:
        P, most = config.pp, math.ceil(instance.model.num_layers / config.pp)
        tpl = placement_for(config, (1,) * P, tuple(tb.slots[0]) * P)
        links = {r: stage_links(instance, tpl, r) for r in {role(i, P) for i in range(P)}}
        opt = []
        mixed = layer_kinds.is_mixed(instance.model)  # (E1) the lighter of the two layer kinds, per layer
        for r in links:
            fixed, per = memory_coefficients(instance, tpl, r).optimizer
            if mixed:
                per = min(per, memory_coefficients(instance, tpl, r, "dense").optimizer[1])
            opt.append(cost.optimizer_step_time((fixed + per * most) / instance.training.bytes_per_param_state[2],
                                                tb.gpu_type))
        kinds = [lk.layer for lk in links.values()] + [lk.dense_layer for lk in links.values() if mixed]
        tb.figures = (min(lt.forward + lt.backward for lt in kinds),
                      3 * links[P - 1].constants.output_fwd, min(opt), tb.gpu_type.iteration_overhead_s)
    return tb.figures


def _balanced_stage(tables, groups: list[tuple[int, list[int]]], per_layer: list[float], L: int) -> float:
    """The least slowest-stage time of any composition, with layers taken as divisible: at time tau a stage on
    island k holds at most min(cap_k, tau / u_k) layers and island k hosts at most its slots; each group of
    islands hosts (at most) its number of stages, and the best stages must hold all L layers. Monotone in
    tau: bisection."""
    caps = [max(tb.caps) for tb in tables]

    def holds(tau: float) -> float:
        total = 0.0
        for limit, members in groups:
            per_stage = sorted(((min(caps[j], tau / per_layer[j]), len(tables[j].slots)) for j in members),
                               reverse=True)
            left = limit
            for amount, count in per_stage:
                take = min(left, count)
                total, left = total + take * amount, left - take
        return total

    lo, hi = 0.0, L * max(per_layer)
    if holds(hi) < L:
        return hi
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if holds(mid) >= L else (mid, hi)
    return lo


def compose_search(instance, solver: str = "cpsat", objective: str = "time", required_tokens_per_s: float | None = None,
                   time_limit_s: float | None = None, threads: int = 1, seed: int = 0, top: int = 1,
                   islands: list[Island] | None = None, progress=None) -> ComposeResult:
    """Bound and prune over every configuration's island composition (see the module docstring)."""
    start = time.perf_counter()
    deadline = start + time_limit_s if time_limit_s else INF
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r}; expected one of {', '.join(OBJECTIVES)}")
    goal = OBJECTIVES[objective]
    max_time = goal.max_time(instance, required_tokens_per_s)  # refuses gpus without a throughput
    islands = islands if islands is not None else find_islands(instance.cluster)
    result = ComposeResult(objective=objective, islands=islands)
    options: list[Option] = []
    shortfall = None
    tables_of: dict[Config, list] = {}
    complete = True
    for config in configurations(instance, islands):
        if time.perf_counter() >= deadline:
            complete, result.stopped = False, "time limit"
            if not options:
                raise NoPlanInTime(f"no plan within the time limit of {time_limit_s:g} s: the configurations "
                                   f"were still being bounded; allow more time")
            break
        tables = island_tables(instance, config, islands, layer_counts=False)
        L, P, v = instance.model.num_layers, config.pp, config.vpp
        best_caps = [max(tb.caps[i] for tb in tables) for i in range(P)]
        if min(best_caps) < v or sum(min(c, L) for c in best_caps) < L:
            result.infeasible += 1
            excess, why = _shortfall(instance, config, tables, best_caps)
            if shortfall is None or excess < shortfall[0]:
                shortfall = (excess, why)
            continue
        tables_of[config] = tables
        options += _options(instance, config, tables, goal, max_time)
    result.candidates = len(options)
    if not options:
        if tables_of and goal.unreachable(required_tokens_per_s):
            raise InfeasibleError(goal.unreachable(required_tokens_per_s))
        raise InfeasibleError(f"no configuration fits in memory on any island; the closest is {shortfall[1]}"
                              if shortfall else "no configuration matches the cluster and batch: a stage of "
                              "tp x cp x dp GPUs must tile the nodes of some island and dp divide global_batch_size")
    solve_one = partial(_solve_option, instance, tables_of, result, backends.get(solver), goal, max_time, deadline,
                        threads, seed)
    with interruptible(result):
        result.pruned = bound_and_prune(options, solve_one, result, top, deadline, progress)
    _close(options, result, complete, top, time_limit_s, goal.no_plan(required_tokens_per_s))
    result.wall_time_s = time.perf_counter() - start
    return result


def _close(options: list[Option], result: ComposeResult, complete: bool, top: int, time_limit_s: float | None,
           nothing: str) -> None:
    """The ranked plans, the bound (configurations never enumerated have none: then 0) and the status; `nothing`
    is the message when no program gave a plan."""
    found = sorted((o for o in options if o.estimate is not None), key=lambda o: (o.value, o.estimate.iteration_time_s))
    if not found:
        if result.stopped == "interrupted":
            raise KeyboardInterrupt
        if result.stopped:
            raise NoPlanInTime(f"no plan within the time limit of {time_limit_s:g} s: {result.solved} composition "
                               f"programs solved, none with a plan yet; allow more time")
        raise InfeasibleError(nothing)
    result.ranked = found[:top]
    best = found[0].value
    result.bound = min(global_bound(options), best) if complete else 0.0
    _, result.status = closing_status(best, result.bound, result.stopped)


def _options(instance, config: Config, tables, objective: Objective, max_time: float) -> list[Option]:
    """The programs of one configuration, each with its lower bound in the objective's unit: one if its time
    bound can reach the required throughput (for gpus: GPUs first, then time), or one per vector of stage counts
    per GPU type where the objective needs the price to be a constant of each program (cost)."""
    P, v = config.pp, config.vpp
    usable = [k for k, tb in enumerate(tables) if tb.slots and max(tb.caps) >= v]
    lb_time = time_lower_bound(instance, config, tables, usable)
    world = config.tp * config.cp * config.dp * P
    if not objective.per_type_programs:
        if not objective.reaches(lb_time, max_time):
            return []  # too slow for the required throughput whatever the composition
        return [Option(config, objective.of_time(lb_time, instance, world, None, max_time))]
    types = sorted({tables[k].island.gpu_type for k in usable})
    room = [sum(len(tables[k].slots) for k in usable if tables[k].island.gpu_type == t) for t in types]
    options = []
    for counts in itertools.product(*[range(min(c, P) + 1) for c in room]):
        if sum(counts) != P:
            continue
        on = {t: n for t, n in zip(types, counts) if n}
        used = [k for k in usable if tables[k].island.gpu_type in on]
        lb = time_lower_bound(instance, config, tables, used, on)
        options.append(Option(config, objective.of_time(lb, instance, world, _rate(instance, config, on), max_time),
                              stages_on=on))
    return options


def _shortfall(instance, config: Config, tables, best_caps: list[int]) -> tuple[float, str]:
    """How far a configuration is from fitting: the stage that holds the fewest layers anywhere, with the
    fewest layers it must hold (vpp, or its share of what the others cannot hold), on the island where that
    needs the least memory over its limit (GiB, description)."""
    from formulation.physics.memory import stage_memory

    L, P, v = instance.model.num_layers, config.pp, config.vpp
    worst = min(range(P), key=lambda i: best_caps[i])
    need = max(v, L - sum(max(0, min(c, L)) for j, c in enumerate(best_caps) if j != worst))
    options = []
    for tb in tables:
        if tb.slots:
            mem = stage_memory(instance, placement_for(config, (1,) * P, tuple(tb.slots[0]) * P), worst, need,
                               tb.gpu_type)
            options.append((mem.total_gib - mem.limit_gib, mem, tb))
    if not options:
        return float("inf"), f"{config.describe()}: its stage of {config.tp * config.cp * config.dp} GPUs tiles no island"
    excess, mem, tb = min(options, key=lambda o: o[0])
    return excess, (f"{config.describe()}, whose stage {worst} needs {mem.total_gib:.1f} GiB per GPU with {need} "
                    f"layer(s) on {tb.island.gpu_type} against {mem.limit_gib:.1f} GiB allowed")


def _rate(instance, config: Config, stages_on: dict) -> float:
    """Price per second of the GPUs used when GPU type t hosts stages_on[t] stages."""
    S = config.tp * config.cp * config.dp
    return sum(n * S * instance.cluster.gpu_types[t].price_per_hour for t, n in stages_on.items()) / 3600.0


def _solve_option(instance, tables_of, result: ComposeResult, backend, objective: Objective, max_time: float,
                  deadline: float, threads: int, seed: int, option: Option, kth: float) -> None:
    """The composition program of one option, with the time cutoff that its value must beat `kth` (or, for a
    required throughput, that cutoff itself); its plan scored by the evaluator, and what the outcome proves."""
    config = option.config
    tables = tabulate_stages(instance, config, tables_of[config])  # adds the layer-count tables, once
    rate = _rate(instance, config, option.stages_on) if option.stages_on else None
    cutoff = objective.time_cutoff(kth, instance, rate, max_time)
    try:
        comp: Composition = build_composition(instance, config, tables, option.stages_on, cutoff)
    except ValueError:
        option.status, option.bound = "infeasible", INF
        result.infeasible += 1
        return
    out = backend.solve(comp.program, time_limit_s=time_left(deadline), threads=threads, seed=seed)
    option.status = out.status
    if out.values is not None and not _keep_plan(instance, comp, out, option, objective, max_time, result):
        return
    if out.status == "optimal":
        option.bound = option.value if option.value is not None else INF
        result.solved += 1
    elif out.status == "infeasible":  # nothing as good as the cutoff
        option.bound = objective.refuted_bound(kth, cutoff)
        result.refuted += cutoff is not None
    else:
        option.bound = objective.bound_after(option.lower_bound, out.bound_s)
        if out.status == "error":
            result.errors.append(f"{config.describe()}: {out.message}")


def _keep_plan(instance, comp: Composition, out, option: Option, objective: Objective, max_time: float,
               result: ComposeResult) -> bool:
    """Score the program's answer with the evaluator and keep it if it fits and is fast enough. False when the
    program's optimum is rejected under a required cutoff: then nothing in the option reaches it."""
    placement = comp.decode(out.values)
    est = evaluate(instance, placement)
    if est.fits and objective.reaches(est.iteration_time_s, max_time, slack=1e-12):
        option.placement, option.estimate = placement, est
        option.value = objective.value(instance, placement, est, max_time)
        result.improved(option.value)
    elif objective.required_cutoff and out.status == "optimal":
        option.status, option.bound = "infeasible", INF  # its fastest plan is too slow
        return False
    return True
