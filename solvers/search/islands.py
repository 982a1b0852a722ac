"""`solve()` for clusters of several GPU types (and for the cost / GPU-count objectives): the composition search
of solvers/search/mixed.py, wrapped into a PlanResult whose report says, per island, what it hosts and why any of
its GPUs stay idle."""

from __future__ import annotations

import time

from formulation.programs.composition import island_tables
from formulation.programs.islands import find_islands
from formulation.physics.memory import stage_memory

from solvers.bounds.every_placement import INF, configuration_floors, every_placement_bound
from solvers.search.reorder import reorder_search
from solvers.result import PlanResult, SolverReport
from solvers.search.mixed import compose_search
from solvers.search.objectives import OBJECTIVES
from solvers.search.driver import NoPlanInTime, closing_status
from solvers.search.exhaustive import enumerate_placements
from solvers.search.fastest_first import fastest_first

UNITS = {name: objective.unit for name, objective in OBJECTIVES.items()}


def island_report(instance, placement, islands, objective: str = "time") -> list[dict]:
    """Per island: its GPUs, the stages it hosts, its idle GPUs and the reason they are idle."""
    cluster = instance.cluster
    S = placement.tp * placement.cp * placement.dp
    tables = island_tables(instance, placement.config, islands, layer_counts=False)
    stage_of_gpu = {int(g): i for i in range(placement.pp) for g in placement.stage_gpus(i)}
    out = []
    for isl, tb in zip(islands, tables):
        gpus = isl.gpus(cluster)
        stages = sorted({stage_of_gpu[g] for g in gpus if g in stage_of_gpu})
        idle = sum(1 for g in gpus if g not in stage_of_gpu)
        if idle == 0:
            why = ""
        elif not tb.slots:
            why = (f"a stage is tp x cp x dp = {S} GPUs, which does not tile its nodes of {isl.gpus_per_node} GPUs "
                   f"(or tp {placement.tp} does not divide them)")
        elif max(tb.caps) < placement.vpp:
            roomiest = max(range(placement.pp), key=tb.caps.__getitem__)  # the stage closest to fitting
            need = stage_memory(instance, placement, roomiest, placement.vpp, cluster.gpu_types[isl.gpu_type])
            why = (f"its GPUs cannot hold any stage of this configuration: {need.total_gib:.1f} GiB needed with "
                   f"{placement.vpp} layer(s) against {need.limit_gib:.1f} GiB allowed")
        elif idle < S:
            why = f"{idle} GPUs left over, fewer than one stage's {S}"
        else:
            why = OBJECTIVES[objective].idle_reason
        out.append({"island": isl.describe(cluster), "gpu_type": isl.gpu_type, "gpus": isl.num_gpus,
                    "stages": stages, "layers": sum(placement.layers_per_stage[i] for i in stages),
                    "idle_gpus": idle, "why_idle": why})
    return out


def solve_composed(instance, solver: str = "auto", time_limit: float | None = None, threads: int = 1, seed: int = 0,
                   top: int = 1, progress=None, objective: str = "time",
                   required_tokens_per_s: float | None = None) -> PlanResult:
    from solvers import backends

    start = time.perf_counter()
    goal = OBJECTIVES.get(objective)  # an unknown name is refused by compose_search
    backend = solver if solver in ("cbc", "cpsat") else backends.automatic()
    try:
        found = compose_search(instance, solver=backend, objective=objective,
                               required_tokens_per_s=required_tokens_per_s, time_limit_s=time_limit, threads=threads,
                               seed=seed, top=top, progress=progress)
    except NoPlanInTime as exc:
        default = _type_blind_default(instance) if goal.value_is_time else None
        if default is None:
            raise
        return _default_in_time(instance, default, f"islands-{backend}", str(exc), start, seed)
    best = found.ranked[0]
    default = _type_blind_default(instance)
    floors = configuration_floors(instance)  # B5 and the searches outside compositions go in work-floor order
    deadline = start + time_limit if time_limit else INF
    outside = _plan_outside(instance, goal, best.value, default, deadline, floors)
    plan_value = outside[0][1].iteration_time_s if outside else best.value
    # a small cluster: every placement enumerated in bound order (stages on part of a node, over two islands, an
    # island visited twice), which proves the plan optimal over every placement when it completes
    enumerated = enumerate_placements(instance, plan_value, deadline, floors) if goal.value_is_time else None
    if enumerated is not None and enumerated.best is not None:
        outside = enumerated.best, "a placement found by enumerating every placement of this small cluster"
        plan_value = enumerated.best[1].iteration_time_s
    # (B5): the composition search is exact over compositions only; the bound, and so the status, must hold for
    # every placement (its own bound covers the compositions, B5 every configuration of any world size)
    proven = enumerated is not None and enumerated.complete
    if proven:
        raw_bound = plan_value
    else:
        raw_bound = _every_placement_bound(instance, goal, plan_value, required_tokens_per_s, start, time_limit,
                                           floors, bounded := {})
        if (reordered := _reordered(instance, goal, plan_value, deadline, bounded)) is not None:  # B5 holds for it
            outside, plan_value = (reordered, "a pipeline visiting an island twice"), reordered[1].iteration_time_s
        raw_bound = min(plan_value, max(raw_bound, enumerated.bound if enumerated is not None else 0.0))
    gap_fraction, status = closing_status(plan_value, raw_bound, None if proven else found.stopped)
    value, bound = goal.reported(best.value, raw_bound, best.placement)
    islands = island_report(instance, outside[0][0] if outside else best.placement, found.islands, objective)
    report = SolverReport(method=f"islands-{backend}", status=status, objective_s=best.estimate.iteration_time_s,
                          bound_s=raw_bound if goal.value_is_time else None,
                          gap=max(0.0, (value - bound) / value) if value else 0.0,
                          wall_time_s=time.perf_counter() - start, seed=seed,
                          note=_search_note(found, islands, goal, required_tokens_per_s, raw_bound, enumerated),
                          objective=objective, objective_value=value, bound_value=bound, islands=islands)
    if outside:
        (placement, estimate), what = outside
        report.note += f"; {what} ({estimate.iteration_time_s:.4f} s) beats every island composition, so it is the plan"
        report.objective_s = report.objective_value = estimate.iteration_time_s
        report.gap = gap_fraction
        return PlanResult(placement=placement, estimate=estimate, solver=report, examined=found.solved,
                          fitting=1, default=default, history=found.history)
    return PlanResult(placement=best.placement, estimate=best.estimate, solver=report,
                      alternatives=[(o.placement, o.estimate) for o in found.ranked[1:]],
                      examined=found.solved, fitting=len(found.ranked), history=found.history, default=default)


def _plan_outside(instance, goal, composed: float, type_blind, deadline: float, floors: list):
    """A plan outside the compositions that beats the composed one (time only): ((placement, estimate), what it
    is), the type-blind Megatron default or a default layout on the fastest GPUs; else None."""
    if not goal.value_is_time:
        return None
    out = None
    if type_blind is not None and type_blind[1].iteration_time_s < composed:
        out, composed = (type_blind, "the type-blind Megatron default"), type_blind[1].iteration_time_s
    faster = fastest_first(instance, composed, deadline, floors)
    return (faster, "a default layout on the cluster's fastest GPUs") if faster is not None else out


def _reordered(instance, goal, plan_value: float, deadline: float, bounded: dict):
    """In what is left of the time, a pipeline that visits an island more than once (reorder_search, time only):
    over the configurations B5 bounded, in the order of their bound (those it did not bound cannot beat the plan)."""
    if not goal.value_is_time:
        return None
    return reorder_search(instance, plan_value, deadline, sorted((b, k, c) for k, (c, b) in enumerate(bounded.items())))


def _search_note(found, islands: list, goal, required_tokens_per_s, raw_bound: float, enumerated=None) -> str:
    idle = sum(r["idle_gpus"] for r in islands)
    names = "; ".join(f"{r['island']}: stages {r['stages'] or 'none'}" for r in islands)
    note = (f"{len(found.islands)} islands ({names}); {found.candidates} configurations"
            f"{' x stage counts per GPU type' if goal.per_type_programs else ''} bounded, "
            f"{found.solved} composition programs solved to optimality, "
            f"{found.refuted} shown by their program to be no better than the incumbent, "
            f"{found.pruned} pruned by bound, {found.infeasible} do not fit; "
            f"{idle} GPU(s) idle{goal.note(required_tokens_per_s)}")
    if found.stopped:
        note += f"; stopped by the {found.stopped}"
    if found.errors:
        note += f"; {len(found.errors)} program(s) failed: {found.errors[0]}"
    note += f"; the composition search is exact over island compositions (bound {found.bound:.6g})"
    if enumerated is not None and enumerated.complete:
        return note + (f"; every placement enumerated in bound order ({enumerated.configurations} configurations "
                       f"whole, {enumerated.evaluations} evaluations): the plan is optimal over every placement")
    if enumerated is not None and enumerated.evaluations:
        note += (f"; {enumerated.configurations} configurations enumerated whole ({enumerated.evaluations} "
                 f"evaluations) before the enumeration's budget ran out")
    return note + f", the bound over every placement is {raw_bound:.6g} (B5)"


def _every_placement_bound(instance, goal, plan_value: float, required_tokens_per_s, start: float,
                           time_limit: float | None, floors: list, record: dict | None = None) -> float:
    """(B5) in the objective's unit, at most `plan_value`, within what is left of the time limit."""
    max_time = goal.max_time(instance, required_tokens_per_s)
    cheapest = min(g.price_per_hour for g in instance.cluster.gpu_types.values()) / 3600.0

    def value(config, time_s: float) -> float:
        if not goal.reaches(time_s, max_time):
            return INF  # no plan of this configuration is fast enough to count
        world = config.tp * config.cp * config.dp * config.pp
        return goal.of_time(time_s, instance, world, world * cheapest, max_time)

    return every_placement_bound(instance, value, plan_value, start + time_limit if time_limit else INF, floors,
                                 refine=goal.value_is_time, record=record)


def _default_in_time(instance, default, method: str, why: str, start: float, seed: int) -> PlanResult:
    """A budget that ended before any composition program still answers: the best Megatron-style default
    (0.1 s on mixed_256), status timeout, with no bound."""
    placement, estimate = default
    report = SolverReport(method=method, status="timeout", objective_s=estimate.iteration_time_s, bound_s=None,
                          gap=None, wall_time_s=time.perf_counter() - start, seed=seed,
                          note=f"{why}; the type-blind Megatron default (stages across GPU types) is the plan, "
                               f"with no bound", objective="time", objective_value=estimate.iteration_time_s,
                          bound_value=None,
                          islands=island_report(instance, placement, find_islands(instance.cluster), "time"))
    return PlanResult(placement=placement, estimate=estimate, solver=report, examined=0, fitting=1, default=default)


def _type_blind_default(instance):
    """The Megatron-style default over all GPUs (even split, ranks node by node, stages at their slowest GPU's
    pace): what the plan is compared with. None when no default placement fits."""
    from formulation.errors import InfeasibleError

    from solvers.search.baseline import best_default
    try:
        ranked = best_default(instance).best[0]
    except InfeasibleError:
        return None
    return ranked.placement, ranked.estimate
