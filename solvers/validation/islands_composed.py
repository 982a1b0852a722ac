"""The islands approach of the literature, for `solve bench --mixed`: each island planned by a planner that knows
one GPU type, the slices composed into one pipeline (after Tangram), scored by the same evaluator.

Every island hosts stages on all of its slots (formulation/programs/islands.py), one configuration for all
(Megatron-LM's rule: one tp and dp per pipeline); the model's layers are shared out between the islands in
proportion to their peak compute (GPUs x peak TFLOP/s: the one figure a type-blind planner has of an island), and
each island splits its share evenly over its stages, as a one-type planner does (Megatron's default split). The
islands follow each other in the order `find_islands` gives. The best such plan over every configuration is
returned: what composing per-island plans reaches without a program that weighs the types against each other."""

from __future__ import annotations

from formulation.errors import InfeasibleError
from formulation.evaluate import evaluate
from formulation.programs.islands import find_islands, island_slots
from formulation.space import memory_feasible, placement_for, schedules


def islands_composed(instance):
    """(placement, estimate) of the fastest fitting composed plan; InfeasibleError if none fits."""
    cluster, model, job = instance.cluster, instance.model, instance.training
    islands = find_islands(cluster)
    power = [isl.num_gpus * cluster.gpu_types[isl.gpu_type].peak_tflops for isl in islands]
    node_max = max(isl.gpus_per_node for isl in islands)
    best = None
    for tp in range(1, min(node_max, job.max_tensor_parallel_size or node_max) + 1):
        for cp in job.context_parallel_sizes:
            for dp in range(1, max(isl.num_gpus for isl in islands) // (tp * cp) + 1):
                slots = [island_slots(isl, cluster, tp * cp * dp, tp) for isl in islands]
                used = [(k, s) for k, s in enumerate(slots) if s]
                pp = sum(len(s) for _, s in used)
                if not used or pp > model.num_layers or len(used) > model.num_layers:
                    continue
                split = _split(model.num_layers, [power[k] for k, _ in used], [len(s) for _, s in used])
                if split is None:
                    continue
                gpus = [g for _, s in used for slot in s for g in slot]
                for config in schedules(instance, tp, pp, cp, dp):
                    if config.vpp != 1:
                        continue
                    placement = placement_for(config, split, gpus)
                    if not memory_feasible(instance, placement)[0]:
                        continue
                    estimate = evaluate(instance, placement, check=False)
                    if estimate.fits and (best is None or estimate.iteration_time_s < best[1].iteration_time_s):
                        best = (placement, estimate)
    if best is None:
        raise InfeasibleError("no composition of per-island plans fits")
    return best


def _split(layers: int, power: list[float], stages: list[int]) -> tuple[int, ...] | None:
    """Layers per stage: each island's share in proportion to its power (largest remainders, at least one layer
    per stage), split evenly over its stages (the first ones one more). None if some stage would get none."""
    exact = [layers * p / sum(power) for p in power]
    share = [max(n, int(x)) for x, n in zip(exact, stages)]
    while sum(share) < layers:
        k = max(range(len(share)), key=lambda i: exact[i] - share[i])
        share[k] += 1
    while sum(share) > layers:
        k = max((i for i in range(len(share)) if share[i] > stages[i]), key=lambda i: share[i] - exact[i],
                default=None)
        if k is None:
            return None
        share[k] -= 1
    out = []
    for total, n in zip(share, stages):
        out += [total // n + (1 if i < total % n else 0) for i in range(n)]
    return tuple(out)
