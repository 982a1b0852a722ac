"""The search driver: a proof over the whole configuration space.

Every configuration gets a cheap lower bound valid for all of its partitions and GPU maps (`lower_bound`)
and, when its Megatron-style default placement fits, an upper bound (the evaluator's score of that
placement). Configurations are then solved exactly in order of lower bound; the search stops as soon as
no remaining lower bound can beat the incumbent (or the K-th best, with --top K). The reported bound is the
smallest lower bound of anything not proven, so the gap is honest at any moment, including a time limit.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from formulation import cost
from formulation.cost import GroupLinks
from formulation.errors import InfeasibleError
from formulation.evaluate import Estimate, evaluate
from formulation.placement import default_split, even_split
from formulation.program import build_program
from formulation.space import Config, configurations, memory_feasible, partition_fits, placement_for
from formulation.stage import dp_sync_parts, layer_time, stage_constants

from . import backends
from .partition import best_partition

INF = float("inf")


@dataclass
class Candidate:
    config: Config
    lower_bound_s: float
    default_s: float | None = None  # evaluator's time of the default placement, if it fits
    proven_s: float | None = None  # exact optimum of this configuration, once solved
    bound_s: float | None = None  # best bound of this configuration after solving (= proven_s if optimal)
    placement: object = None
    estimate: Estimate | None = None
    status: str = "unsolved"


@dataclass
class SearchResult:
    ranked: list[Candidate]  # best first (solved or default), at most `top`
    bound_s: float
    status: str
    wall_time_s: float
    candidates: int = 0  # configurations with a partition that fits
    examined: int = 0
    solved: int = 0
    pruned: int = 0
    infeasible: int = 0
    method: str = ""
    best_default: Candidate | None = None  # the Megatron-style default placement that is fastest


def _cluster_extremes(cluster) -> tuple[float, float]:
    """Fastest intra-node and inter-node GPU-pair bandwidth anywhere in the cluster (for lower bounds)."""
    intra = max((float(m[~_eye(m.shape[0])].max()) for m in cluster.intra_gb_per_s if m.shape[0] > 1), default=INF)
    n = len(cluster.nodes)
    inter = INF
    if n > 1:
        B = cluster.inter_gb_per_s
        inter = float(max(B[i, j] for i in range(n) for j in range(n) if i != j))
        if cluster.gpu_pair_gb_per_s:
            inter = max(inter, max(cluster.gpu_pair_gb_per_s.values()))
    return intra, inter


def _eye(n):
    import numpy as np
    return np.eye(n, dtype=bool)


def _best_group_time(fn, size: int, intra: float, inter: float, max_nodes: int, per_node_cap: int) -> float:
    """The smallest time any placement of a group of `size` can have: every shape, best links."""
    if size <= 1:
        return 0.0
    best = INF
    for N in range(1, min(size, max_nodes) + 1):
        for k in ([size] if N == 1 else range(1, size // N + 1)):
            if k > per_node_cap:
                continue
            best = min(best, fn(GroupLinks(size, intra, inter, N, k)))
    return best


def lower_bound(instance, config: Config) -> float:
    """A time no partition and no GPU map of `config` can beat (README, "Search", bound (B1)).

    Per layer: the stage composition of formulation/stage.py with every group at its best shape over
    the fastest links of the cluster (it is non-decreasing in each group time). Pipeline:
    m M + (S - M) / vpp with S = sum of stage times and M >= max(S / pp, ceil(L / pp) u_min, u_min + 3 out),
    since the expression grows with M. Chain: every boundary at the fastest p2p pair. Optimizer: the
    stage with the most layers. DP sync: 0.
    """
    model, job, cluster = instance.model, instance.training, instance.cluster
    p = placement_for(config, even_split(model.num_layers, config.pp), range(cluster.num_gpus))
    gpu_type = min(cluster.gpu_types.values(), key=lambda g: cost.layer_compute(model, job, p, g).forward)
    intra, inter = _cluster_extremes(cluster)
    max_nodes = len(cluster.nodes)
    cap = max(n.num_gpus for n in cluster.nodes)
    last = stage_constants(instance, p, config.pp - 1, gpu_type)
    first = stage_constants(instance, p, 0, gpu_type)
    w_bytes, g_bytes, _ = job.bytes_per_param_state
    tp = _best_group_time(lambda lk: cost.tp_layer_comm(model, job, p, lk, cluster), config.tp, intra, inter,
                          max_nodes, cap)
    cp = 0.0
    if config.cp > 1:
        best_bw = max(intra, inter) if intra != INF else inter
        cp = cost.cp_layer_comm(model, job, p, best_bw, config.cp <= cap, cluster)
    ag = rs = 0.0
    if config.zero_stage >= 3:
        n = config.dp * config.cp
        ag = _best_group_time(lambda lk: cost.collective_time("all_gather", first.layer_params * w_bytes, lk,
                                                              cluster), n, intra, inter, max_nodes, cap)
        rs = _best_group_time(lambda lk: cost.collective_time("reduce_scatter", first.layer_params * g_bytes, lk,
                                                              cluster), n, intra, inter, max_nodes, cap)
    lt = layer_time(first, job.tp_comm_overlap, tp, cp, ag, rs)
    u = lt.forward + lt.backward
    L, P, v = model.num_layers, config.pp, config.vpp
    m = job.global_batch_size // (config.micro_batch_size * config.dp)
    extra = 3 * last.output_fwd
    total = L * u + extra
    caps = partition_fits(instance, config, max(cluster.gpu_types.values(), key=lambda g: g.memory_gib))[1]
    slowest = _least_slowest_stage(u, [0.0] * (P - 1) + [extra], caps, L, v)
    pipe = m * slowest + (total - slowest) / v
    chain = 0.0
    if P > 1:
        sp = config.tp if (job.sequence_parallel and config.tp > 1) else 1
        message = cost.activation_message_bytes(model, job, p) / sp
        fastest = max(intra, inter) if intra != INF else inter
        c_min = cost.p2p_time(message, fastest, intra != INF and intra >= inter, cluster)
        rounds = math.ceil(m / P) if v == 1 else 1
        chain = rounds * 2 * (v * (P - 1) + (v - 1)) * c_min
    dp_sync = _dp_sync_lower_bound(instance, config, p, gpu_type, caps, intra, inter, max_nodes, cap)
    from formulation.memory import memory_coefficients
    heavy = math.ceil(L / P)
    optimizer = min(cost.optimizer_step_time(
        (memory_coefficients(instance, p, i).optimizer[0] + memory_coefficients(instance, p, i).optimizer[1] * heavy)
        / job.bytes_per_param_state[2], gpu_type) for i in range(P))
    return pipe + chain + dp_sync + optimizer + gpu_type.iteration_overhead_s


def _dp_sync_lower_bound(instance, config, p, gpu_type, caps, intra, inter, max_nodes, per_node_cap) -> float:
    """(B1, dp) delta >= E_i for every stage i, and E_i >= its smallest exposure over the layer counts memory
    allows, each part at the best shape over the fastest links (exposure grows with the part's time)."""
    cluster = instance.cluster
    n = config.dp * config.cp
    if n == 1 or config.zero_stage >= 3:
        return 0.0
    best = 0.0
    for i in range(config.pp):
        k = stage_constants(instance, p, i, gpu_type)
        exposures = []
        for q in range(config.vpp, max(caps[i], 0) + 1, config.vpp):
            total = 0.0
            for kind, message, overlapped, window in dp_sync_parts(instance, p, k, q):
                time_ = _best_group_time(lambda lk: cost.collective_time(kind, message, lk, cluster), n, intra, inter,
                                         max_nodes, per_node_cap)
                total += max(0.0, time_ - window) if overlapped else time_
            exposures.append(total)
        if exposures:
            best = max(best, min(exposures))
    return best


def _least_slowest_stage(u: float, extras: list[float], caps: list[int], layers: int, step: int) -> float:
    """The smallest possible max_i (l_i u + extra_i) over partitions with l_i <= cap_i (memory), l_i a positive
    multiple of `step`, sum l_i = layers: the smallest candidate level at which the stages hold every layer."""
    levels = sorted({q * u + e for e in extras for q in range(step, layers + 1, step)})
    for level in levels:
        room = 0
        for e, cap in zip(extras, caps):
            fit = min(cap, int((level - e) / u + 1e-9)) // step * step if u > 0 else cap // step * step
            if fit < step:
                break
            room += fit
        else:
            if room >= layers:
                return level
    return levels[-1]


def _fits_somehow(instance, config: Config) -> bool:
    """Some layer partition fits in memory on the GPU type with the most memory."""
    gpu_type = max(instance.cluster.gpu_types.values(), key=lambda g: g.memory_gib)
    return partition_fits(instance, config, gpu_type)[0]


# The exact program grows with (ranks x uniform GPU classes); beyond this it is not solved within minutes by
# either backend today (h100_128: 2,048 -> 275k rows, no feasible solution in 60 s). Larger clusters get
# the bound-only search: the best default placement with the proven global lower bound. Decomposition for
# large clusters (node-level maps, issue 4) lifts this.
MAX_EXACT_SIZE = 256
# Without the exact program and without --time-limit, time spent re-partitioning default maps
# (solvers/partition.py), most promising configurations first.
BOUND_ONLY_BUDGET_S = 8.0


def exact_is_tractable(instance) -> bool:
    return instance.cluster.num_gpus * len(instance.cluster.uniform_classes()) <= MAX_EXACT_SIZE


def search(instance, solver: str = "cbc", time_limit_s: float | None = None, threads: int = 1, seed: int = 0,
           top: int = 1, progress=None, exact: bool = True) -> SearchResult:
    start = time.perf_counter()
    deadline = start + time_limit_s if time_limit_s else INF
    backend = backends.get(solver)
    world = instance.cluster.num_gpus
    candidates: list[Candidate] = []
    infeasible = 0
    shortfall = None
    for config in configurations(instance):
        if not _fits_somehow(instance, config):
            infeasible += 1
            even = placement_for(config, even_split(instance.model.num_layers, config.pp), range(world))
            _, excess, stage = memory_feasible(instance, even)
            if shortfall is None or excess < shortfall[0]:
                shortfall = (excess, f"{config.describe()}, whose stage {stage} exceeds its memory limit by "
                                     f"{excess:.1f} GiB with an even split (and no other split fits)")
            continue
        cand = Candidate(config, lower_bound(instance, config))
        split = default_split(instance.model.num_layers, config.pp, config.vpp)
        default = placement_for(config, split, range(world)) if split else None
        if default is not None and memory_feasible(instance, default)[0]:
            est = evaluate(instance, default, check=False)
            if est.fits:
                cand.default_s, cand.placement, cand.estimate = est.iteration_time_s, default, est
        candidates.append(cand)
    if not candidates:
        if shortfall is None:
            raise InfeasibleError("no configuration matches the cluster and batch: global_batch_size must be "
                                  "divisible by some data-parallel size dp (and tp, pp, cp must divide the GPU count)")
        raise InfeasibleError(f"no configuration fits in memory; the closest is {shortfall[1]}")
    candidates.sort(key=lambda c: (c.lower_bound_s, c.config))
    result = SearchResult(ranked=[], bound_s=0.0, status="feasible", wall_time_s=0.0,
                          method=solver if exact else "bound-only", infeasible=infeasible,
                          candidates=len(candidates))

    def kth_best() -> float:
        values = sorted(c.proven_s if c.proven_s is not None else c.default_s
                        for c in candidates if (c.proven_s or c.default_s) is not None)
        return values[top - 1] if len(values) >= top else INF

    timed_out = False
    if not exact:  # improve the defaults' partitions, most promising first, while the budget lasts
        refine_until = deadline if time_limit_s else start + BOUND_ONLY_BUDGET_S
        for cand in candidates:
            if cand.lower_bound_s >= kth_best() * (1 - 1e-9):
                break
            if time.perf_counter() >= refine_until:
                timed_out = time.perf_counter() >= deadline
                break
            result.examined += 1
            template = placement_for(cand.config, even_split(instance.model.num_layers, cand.config.pp), range(world))
            better = best_partition(instance, template)
            if better is not None:
                est = evaluate(instance, better)
                if est.fits and (cand.default_s is None or est.iteration_time_s < cand.default_s):
                    cand.default_s, cand.placement, cand.estimate = est.iteration_time_s, better, est
    for cand in candidates if exact else []:
        if cand.lower_bound_s >= kth_best() * (1 - 1e-9):
            break
        if time.perf_counter() >= deadline:
            timed_out = True
            break
        result.examined += 1
        try:
            program = build_program(instance, cand.config)
        except ValueError:
            cand.status, cand.bound_s = "infeasible", INF
            continue
        remaining = None if deadline == INF else max(0.1, deadline - time.perf_counter())
        out = backend.solve(program, time_limit_s=remaining, threads=threads, seed=seed)
        cand.status = out.status
        if out.values is not None:
            placement = program.decode(out.values)
            est = evaluate(instance, placement)
            if est.fits and (cand.default_s is None or est.iteration_time_s <= cand.default_s):
                cand.placement, cand.estimate = placement, est
            cand.program_objective_s = out.objective_s
        if out.status == "optimal":
            cand.proven_s = cand.bound_s = cand.estimate.iteration_time_s if cand.estimate else INF
            result.solved += 1
        elif out.status == "infeasible":
            cand.bound_s = INF
        else:
            cand.bound_s = max(cand.lower_bound_s, out.bound_s or 0.0)
            timed_out = True
        if progress:
            progress(result.examined, len(candidates), kth_best(), _global_bound(candidates))
    scored = [c for c in candidates if c.estimate is not None]
    scored.sort(key=lambda c: (c.estimate.iteration_time_s, c.config))
    result.ranked = scored[:top]
    defaults = [c for c in candidates if c.default_s is not None]
    result.best_default = min(defaults, key=lambda c: (c.default_s, c.config)) if defaults else None
    result.pruned = sum(1 for c in candidates if c.status == "unsolved" and c.lower_bound_s >= kth_best() * (1 - 1e-9))
    result.bound_s = min(_global_bound(candidates), result.ranked[0].estimate.iteration_time_s) if scored else 0.0
    best = result.ranked[0].estimate.iteration_time_s if scored else INF
    gap = (best - result.bound_s) / best if scored else None
    result.status = "optimal" if gap is not None and gap <= 1e-6 else ("timeout" if timed_out else "feasible")
    result.wall_time_s = time.perf_counter() - start
    return result


def _global_bound(candidates: list[Candidate]) -> float:
    """Smallest time anything not yet proven could still achieve."""
    bounds = []
    for c in candidates:
        if c.proven_s is not None:
            bounds.append(c.proven_s)
        elif c.bound_s is not None:
            bounds.append(c.bound_s)
        else:
            bounds.append(c.lower_bound_s)
    return min(bounds)
