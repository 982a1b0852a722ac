"""Re-planning after failures: the best plan on the GPUs that survive, warm-started from the old plan
(docs/replan.md).

The space is every configuration of every world size w up to the survivors' count, on the first w survivors
in `Survivors.order` (a world of all survivors is what a fresh `solve` of the reduced cluster plans). Two first
candidates come from the old plan, scored by the evaluator: its configuration with failed GPUs replaced by spares
(when there are enough), and its configuration with the largest smaller dp that the batch and the survivors
allow, keeping the replicas that lost no GPU where they were. The best of them is the incumbent that every
configuration's bound must beat. Then, smallest bound first:
- clusters within the exact program's reach: each world size's exact search (solvers/search/uniform.py);
- beyond: each configuration's memory check, its per-layer bound (`unit_bound`) and its default map's score;
  then (B1) where the bound still beats the best plan, the best maps' layers split exactly, and (B2).
Every configuration keeps a valid lower bound at every moment ((B0) until it is reached: it depends on the
configuration only, not on the GPUs chosen), so a time limit leaves an honest bound and gap. A warm start at
most `move_tolerance` slower that moves fewer ranks is preferred to the fastest plan (`fewest_moves`)."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

import numpy as np

from formulation.errors import InfeasibleError
from formulation.evaluate import evaluate
from formulation.inputs.failures import Survivors
from formulation.inputs.job import DATA_PARALLEL_ONLY
from formulation.physics import layer_kinds
from formulation.physics.stage import stage_constants
from formulation.placement import Placement, default_split
from formulation.shards import ranks_moved
from formulation.space import divisors, memory_feasible, partition_fits, placement_for, schedules
from solvers.bounds.configs import cut_bound, lower_bound
from solvers.bounds.parts import stage_parts
from solvers.bounds.work import WorkBound
from solvers.local.partition import best_partition
from solvers.search.driver import (INF, Item, NoPlanInTime, Tally, bound_and_prune, closing_status, global_bound,
                                   interruptible, prunes)
from solvers.search.replan_warm import warm_starts
from solvers.search.uniform import exact_is_tractable, search

# the best configurations whose layers are split exactly for their map at the end (beyond the exact program)
PARTITIONED = 3
# a partition program's table evaluates the map once per layer count (solvers/local/partition.py): it is not
# started unless that many evaluations fit in the time left (h100_16384, pp 15: 112 rows of 0.27 s, 35 s in all)
PARTITION_COST = 1.0
# (B2) takes several times (B1) on the same configuration (h100_1024: 3 s against 0.3 s): the first (B2) is not
# started with less than this many times the last (B1) left
B2_OVER_B1 = 5
# a warm start this much slower (relative) than the best plan found is preferred when it moves fewer ranks
MOVE_TOLERANCE = 0.005
# configurations, smallest (B0) first, whose per-layer bound is computed before any default map is scored
LOOK_AHEAD = 256


@dataclass
class Option(Item):
    """One configuration on the first `world` survivors (or, `warm` set, a plan from the old one)."""

    world: int = 0
    warm: str = ""
    caps: list | None = None


@dataclass
class Replan(Tally):
    """The answer: the plan on the original cluster's GPU indices, its bound, and what it means against the old."""

    placement: Placement | None = None
    estimate: object = None
    bound_s: float = 0.0
    gap: float = 0.0
    method: str = ""
    old_estimate: object = None
    survivors: Survivors | None = None
    warm: list = field(default_factory=list)  # (label, placement, estimate) of the warm starts
    ranks_moved: int = 0
    spares_plan: tuple | None = None  # (placement, estimate): the old configuration on spares, if it survives
    unit: str = "configurations"  # what `examined` and `candidates` count (world sizes within the exact reach)

    @property
    def old_config_survives(self) -> bool:
        return self.spares_plan is not None


def replan(instance, old: Placement, failed, time_limit_s: float | None = None, seed: int = 0,
           solver: str = "cpsat", progress=None, move_tolerance: float = MOVE_TOLERANCE) -> Replan:
    """The best plan on the survivors of `failed` (global GPU indices of `instance`), warm-started from `old`; a
    warm start at most `move_tolerance` (relative) slower that moves fewer ranks is taken instead."""
    start = time.perf_counter()
    deadline = start + time_limit_s if time_limit_s else INF
    surv = Survivors.of(instance, failed)
    result = Replan(survivors=surv, old_estimate=evaluate(instance, old, check=False))
    result.warm = warm_starts(instance, old, surv)
    spares = [w for w in result.warm if w[0] == "spares"]
    result.spares_plan = (spares[0][1], spares[0][2]) if spares else None
    items = [Option(w[1].config, lower_bound=w[2].iteration_time_s, bound=w[2].iteration_time_s,
                    value=w[2].iteration_time_s, placement=w[1], estimate=w[2], world=w[1].world_size, warm=w[0])
             for w in result.warm]
    options = every_option(surv, sharpened_work_bound(surv.all[0], WorkBound(surv.all[0])))
    exact = exact_is_tractable(surv.all[0])
    with interruptible(result):
        if exact:
            _exact_worlds(surv, options, items, result, solver, deadline, seed, progress)
        else:
            _configurations(surv, options, items, result, solver, deadline, progress)
    ranked = sorted((i for i in items + options if i.estimate is not None),
                    key=lambda i: (i.estimate.iteration_time_s, i.warm != "", i.config))
    if not ranked:
        if result.stopped:
            raise NoPlanInTime(f"no plan on the {surv.num_gpus} surviving GPUs within the time limit")
        raise InfeasibleError(f"no configuration fits on the {surv.num_gpus} surviving GPUs")
    best = ranked[0]
    placement = best.placement if best.warm or not exact else _original(best.placement, surv.first(best.world)[1])
    result.ranks_moved, label, result.placement = fewest_moves(
        instance, old, placement, best.estimate.iteration_time_s, result.warm, move_tolerance)
    label = label or best.warm
    result.estimate = evaluate(instance, result.placement)
    time_s = result.estimate.iteration_time_s
    result.bound_s = min(time_s, global_bound(items + options))
    result.gap, result.status = closing_status(time_s, result.bound_s, result.stopped)
    result.method = ("exact per world size" if exact else "bounds and default maps per configuration") + \
        (f", warm start {label}" if label else "")
    result.candidates = len(options)
    result.unit = "world sizes" if exact else "configurations"
    result.wall_time_s = time.perf_counter() - start
    return result


def fewest_moves(instance, old: Placement, placement: Placement, time_s: float, warm: list,
                 tolerance: float) -> tuple[int, str, Placement]:
    """(ranks moved, warm start label or "", plan): `placement` (taking `time_s`), or a warm start at most
    `tolerance` slower that moves fewer ranks: the reshard it saves is real, a difference below the model's
    resolution is not. Ties: the faster, then the searched plan."""
    L = instance.model.num_layers
    choices = [(ranks_moved(old, placement, L), time_s, "", placement)] + [
        (ranks_moved(old, p, L), e.iteration_time_s, label, p) for label, p, e in warm
        if e.iteration_time_s <= time_s * (1 + tolerance)]
    moved, _, label, chosen = min(choices, key=lambda c: c[:3])
    return moved, label, chosen


def every_option(surv: Survivors, work_bound: WorkBound) -> list[Option]:
    """Every configuration of every world size up to the survivors' count, with its (B0). tp stays within the
    smallest node of its world (as `formulation.space.configurations` on that world's cluster)."""
    inst = surv.all[0]
    model, job = inst.model, inst.training
    sizes = np.cumsum([n.num_gpus for n in inst.cluster.nodes])
    fsdp_only = job.software_stack in DATA_PARALLEL_ONLY
    out = []
    for dp in divisors(job.global_batch_size):
        for tp in divisors(int(max(n.num_gpus for n in inst.cluster.nodes))):
            if model.num_attention_heads % tp or model.num_kv_heads % tp or \
                    (job.max_tensor_parallel_size and tp > job.max_tensor_parallel_size) or (fsdp_only and tp > 1):
                continue
            for cp in job.context_parallel_sizes:
                if job.seq_length % cp or (fsdp_only and cp > 1):
                    continue
                for pp in range(1, min(model.num_layers, surv.num_gpus // (tp * cp * dp)) + 1):
                    world = tp * cp * dp * pp
                    if fsdp_only and pp > 1 or tp > _smallest_node(sizes, world):
                        continue
                    out += [Option(c, lower_bound=work_bound(c), world=world) for c in schedules(inst, tp, pp, cp, dp)]
    return out


def _smallest_node(sizes: np.ndarray, world: int) -> int:
    """The fewest GPUs of a node among the first `world` survivors (the last node may be cut)."""
    k = int(np.searchsorted(sizes, world))
    whole = np.diff(np.concatenate([[0], sizes[:k]]))
    cut = world - (int(sizes[k - 1]) if k else 0)
    return int(min([*whole, cut] if cut else whole))


def _exact_worlds(surv, options, items, result, solver, deadline, seed, progress) -> None:
    """Within the exact program's reach: one item per world size (its least (B0)), solved by the exact search of
    its cluster; the item's bound is that search's."""
    worlds: dict[int, Option] = {}
    for o in options:
        w = worlds.get(o.world)
        if w is None or o.lower_bound < w.lower_bound:
            worlds[o.world] = Option(o.config, lower_bound=o.lower_bound, world=o.world)
    options[:] = list(worlds.values())

    def solve_world(item: Option, kth: float) -> None:
        sub, _ = surv.first(item.world)
        left = None if deadline == INF else max(0.05, deadline - time.perf_counter())
        try:
            found = search(sub, solver=solver, time_limit_s=left, seed=seed, exact=True, anneal_moves=0)
        except InfeasibleError:
            item.bound = INF
            return
        except NoPlanInTime:
            result.stopped = "time limit"
            return
        best = found.ranked[0]
        item.config, item.placement, item.estimate = best.config, best.placement, best.estimate
        item.value = best.estimate.iteration_time_s
        item.bound = found.bound_s
        result.solved += found.status == "optimal"
        result.improved(item.value)
        if found.stopped:
            result.stopped = found.stopped

    result.pruned += bound_and_prune(items + options, _skip_warm(solve_world), result, 1, deadline, progress)


def _skip_warm(solve_one):
    def run(item: Option, kth: float) -> None:
        if not item.warm:
            solve_one(item, kth)
    return run


def _configurations(surv, options, items, result, solver, deadline, progress) -> None:
    """Beyond the exact program: configurations smallest bound first (memory, the default map's score on the
    original cluster, whose link caches every world shares), then (B1) and (B2) where the bound could still
    beat the incumbent, then exact layer splits of the best maps."""
    instance, mem = surv.instance, surv.all[0]
    gpu_type = max(mem.cluster.gpu_types.values(), key=lambda g: g.memory_gib)

    def look(o: Option) -> bool:
        """Memory, then the per-layer bound (once): whether the configuration is still open."""
        if o.caps is None and o.bound is None:
            fits, caps = partition_fits(mem, o.config, gpu_type)
            if not fits:
                o.bound = INF
                result.infeasible += 1
                return False
            o.caps = caps
            o.lower_bound = max(o.lower_bound, unit_bound(mem, o.config, caps))
        return o.bound is None

    def first_look(o: Option, kth: float) -> None:
        if not look(o) or prunes(o.lower_bound, kth):
            return
        split = default_split(mem.model.num_layers, o.config.pp, o.config.vpp)
        if split is None:
            return
        default = placement_for(o.config, split, surv.order[:o.world])
        if memory_feasible(mem, default)[0]:
            est = evaluate(instance, default, check=False)
            if est.fits:
                o.value, o.placement, o.estimate = est.iteration_time_s, default, est
                result.improved(o.value)

    everything = items + options
    # what the warm start already beats stays out of the driver's list (its kth scan is linear in the list)
    cutoff = min((i.value for i in items), default=INF)
    open_ = sorted((o for o in options if not prunes(o.lower_bound, cutoff)), key=lambda o: (o.lower_bound, o.config))
    result.pruned += len(options) - len(open_)
    # the per-layer bound of the most promising configurations first (a few milliseconds each), so that the
    # defaults are scored in an order close to their times; the others get it when the driver reaches them
    lite_until = time.perf_counter() + (deadline - time.perf_counter()) / 4
    for o in open_[:LOOK_AHEAD]:
        if time.perf_counter() >= lite_until:
            break
        look(o)
    result.pruned += bound_and_prune(items + open_, _skip_warm(first_look), result, 1, deadline, progress)
    took = _raise(surv, options, everything, result, deadline, lambda o, sub: lower_bound(sub, o.config, o.caps))
    _partition_best(instance, options, result, solver, deadline)
    _raise(surv, options, everything, result, deadline, lambda o, sub: cut_bound(sub, o.config), B2_OVER_B1 * took)


def _partition_best(instance, options, result, solver, deadline) -> None:
    """The best default maps with their layers split exactly for the map (solvers/local/partition.py)."""
    scored = sorted((o for o in options if o.placement is not None), key=lambda o: (o.value, o.config))
    L = instance.model.num_layers
    for o in scored[:PARTITIONED]:
        began = time.perf_counter()
        evaluate(instance, o.placement, check=False)  # once more, its links cached: what each table row costs
        rows = (L - o.config.vpp * (o.config.pp - 1)) // o.config.vpp + 1
        if deadline - time.perf_counter() <= PARTITION_COST * rows * (time.perf_counter() - began):
            result.stopped = "time limit"  # its table of stage times would outlast the limit
            return
        left = deadline - time.perf_counter()
        better = best_partition(instance, o.placement, solver=solver, time_limit_s=min(30.0, left))
        if better is not None:
            est = evaluate(instance, better)
            if est.fits and est.iteration_time_s < o.value:
                o.value, o.placement, o.estimate = est.iteration_time_s, better, est
                result.improved(o.value)


def _raise(surv, options, everything, result, deadline, refine, last: float = 0.0) -> float:
    """A costlier bound for every configuration whose bound still beats the best plan, smallest first; none is
    started that would end after the deadline if it took as long as the last one did (the first: `last`).
    Returns the last one's duration."""
    best = min((i.value for i in everything if i.value is not None), default=INF)
    for o in sorted((o for o in options if o.caps is not None and o.open_bound < best),
                    key=lambda o: (o.open_bound, o.config)):
        began = time.perf_counter()
        if began + last >= deadline:
            result.stopped = "time limit"
            return last
        o.lower_bound = max(o.lower_bound, refine(o, surv.first(o.world)[0]))
        last = time.perf_counter() - began
    return last


def unit_bound(sub, config, caps) -> float:
    """(B1)'s pipeline alone, without its least slowest stage search: every layer at least u, the layer time with
    every group at its best shape over `sub`'s fastest links (solvers/bounds/parts.py), so the slowest stage takes
    at least u max(L / pp, vpp ceil(L / (pp vpp))) = M and all stages u L = S; the schedule's own floor of (M, S)
    (`Parts.schedule`: (C9) m M + (S - M) / vpp, less the weight gradients' 2 W_total / vpp under zero bubble (S1),
    m M alone for a V (S3), whose bubble is not the interleaved one), plus the least overhead. A millisecond where
    (B1) takes a tenth of a second, and within 1 % of it on h100_1024's configurations. A model mixing dense and
    MoE layers: -inf (not used).

    `sub` may hold more GPUs than the configuration's world (the replan passes every survivor): its fastest links,
    its spans (the N-th largest of the nodes' (N-1)-th fastest links) and its node count are at least those of any
    subset, so u is at most the subset's, and the bound holds for a world on any of its GPUs."""
    if layer_kinds.is_mixed(sub.model):
        return -INF
    b = stage_parts(sub, config, caps=caps)
    L, P, v = sub.model.num_layers, config.pp, config.vpp
    heaviest = max(L / P, v * -(-L // (P * v)))
    overhead = min(g.iteration_overhead_s for g in sub.cluster.gpu_types.values())
    return (b.schedule(b.u * heaviest, b.u * L) + overhead) * (1 - 1e-9)


def sharpened_work_bound(instance, work_bound: WorkBound):
    """(B0) with the slowest stage holding at least vpp ceil(L / (pp vpp)) layers (stages hold whole chunks), each
    at least the least per-layer compute over GPU types: (m - 1/vpp) max(W / pp, that) + W / vpp + overhead. For a
    model of one layer kind; a model mixing dense and MoE layers keeps (B0)."""
    model = instance.model
    if layer_kinds.is_mixed(model):
        return work_bound
    per_layer: dict[tuple, float] = {}

    def bound(config) -> float:
        key = (config.tp, config.cp, config.micro_batch_size, config.recompute, config.ep, config.etp)
        if key not in per_layer:
            p = placement_for(config, (1,) * config.pp, range(config.tp * config.pp * config.cp * config.dp))
            per_layer[key] = min(k.f_compute + k.b_compute for k in
                                 (stage_constants(instance, p, 0, g) for g in instance.cluster.gpu_types.values()))
        L, P, v = model.num_layers, config.pp, config.vpp
        m = instance.training.global_batch_size // (config.micro_batch_size * config.dp)
        heaviest = v * -(-L // (P * v)) * per_layer[key]
        extra = (m - 1 / v) * max(0.0, heaviest - work_bound.work(config) / P)
        return work_bound(config) + extra * (1 - 1e-9)
    return bound


def _original(placement: Placement, to_original: np.ndarray) -> Placement:
    """A plan on a survivors' cluster as a plan on the original cluster's GPU indices."""
    return dataclasses.replace(placement, gpus=tuple(int(to_original[g]) for g in placement.gpus))
