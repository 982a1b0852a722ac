"""The mixed-type planner against a brute force over every placement (issue 46).

Seeded clusters of two or three GPU types and at most 8 GPUs (uneven nodes, one-way node links, tight memory,
MoE models, zero 3 among the choices). The brute force below uses only the instance loader, `check_placement`
and the evaluator: every world size, every tp up to the smallest node (the planner's space, formulation/space.py),
cp, pp, dp, ep, micro-batch, vpp, recompute, zero stage, every layer split and every map of ranks to GPUs up to
swaps that leave every directed link and GPU type unchanged. The plan must equal its minimum, a claimed optimum
must be it, and the bound (and B5) must not exceed it."""

from __future__ import annotations

import itertools
import random

import pytest

from formulation.errors import InputError
from formulation.evaluate import evaluate
from formulation.inputs.instance import instance_from_dict
from formulation.placement import Config, Placement, check_placement
from solvers import solve
from solvers.bounds.every_placement import every_placement_bound

TYPES = ["h100-sxm-80gb", "a100-sxm-40gb", "a100-sxm-80gb", "v100-sxm-32gb", "h200-sxm-141gb", "h100-pcie-80gb"]
SHAPES = [(2, 2), (1, 3), (3, 1), (2, 4), (4, 2), (2, 1, 1), (1, 2, 1), (2, 2, 2), (3, 3), (1, 1, 1, 1),
          (4, 4), (2, 2, 4), (4, 2, 2), (2, 2, 2, 2), (1, 3, 4), (4, 4)]  # up to 8 GPUs
# the quick suite's seeds, a second or two each (MoE, one-way links, composed plans 4-6 % above the minimum)
QUICK = (1, 8, 14, 15)


def cluster_dict(seed: int) -> dict:
    """Seed -> an instance of two or three GPU types on at most 8 GPUs."""
    rng = random.Random(1000 + seed)
    shape = rng.choice(SHAPES)
    kinds = 3 if len(shape) >= 3 and rng.random() < 0.7 else 2
    names = rng.sample(TYPES, kinds)
    on = [names[i] if i < kinds else rng.choice(names) for i in range(len(shape))]
    rng.shuffle(on)
    if len(set(on)) == 1:
        on[0] = names[1] if on[1] == names[0] else names[0]
    types = {t: {} for t in set(on)}
    if rng.random() < 0.5:  # tight memory: which stage fits where matters
        types = {t: {"memory_gib": round(rng.uniform(3.5, 9.0), 1), "runtime_overhead_gib": 1.0} for t in types}
    nodes = [{"name": f"n{i}", "gpu_type": t, "gpus": g} for i, (g, t) in enumerate(zip(shape, on))]
    net = {"intra_node_gb_per_s": rng.choice([100.0, 300.0]), "inter_node_gb_per_s": rng.choice([6.0, 25.0, 48.0])}
    if seed % 3 == 1:  # one-way node links
        k = len(shape)
        mat = [[0.0] * k for _ in range(k)]
        for i, j in itertools.combinations(range(k), 2):
            a = round(rng.uniform(4.0, 50.0), 1)
            mat[i][j], mat[j][i] = (a, round(rng.uniform(1.0, a), 1)) if rng.random() < 0.5 else (a, a)
        net["node_matrix_gb_per_s"] = mat
    world = sum(shape)
    moe = seed % 4 == 2
    hidden = rng.choice([512, 1024, 2048])
    model = {"name": "tiny", "num_hidden_layers": rng.choice([2, 3, 4] if world <= 6 else [2, 3]),
             "hidden_size": hidden, "intermediate_size": 3 * hidden, "num_attention_heads": 8,
             "num_key_value_heads": rng.choice([2, 4, 8]), "vocab_size": rng.choice([4096, 32000]),
             "hidden_act": "silu"}
    training = {"global_batch_size": rng.choice([4, 6, 8]), "seq_length": rng.choice([1024, 2048, 4096]),
                "precision": "bf16", "max_micro_batch_size": rng.choice([1, 2]) if world <= 6 else 1,
                "recompute": rng.sample(["none", "selective", "full"], 1 if world > 6 else 2),
                "zero_stage": [3, rng.choice([0, 1])] if seed % 2 == 0 else [rng.choice([0, 1])],
                "context_parallel_sizes": [1], "virtual_pipeline_sizes": [1]}
    if moe:
        model.update({"num_local_experts": rng.choice([2, 4]), "num_experts_per_tok": 2,
                      "intermediate_size": 2 * hidden})
        training.update(zero_stage=[rng.choice([0, 1])], expert_tensor_parallel_sizes=[1])
    return {"name": f"mixed_bf{seed}", "model": model, "training": training,
            "cluster": {"gpu_types": types, "nodes": nodes, "network": net}}


def swap_classes(cluster) -> list[list[int]]:
    """GPUs that can be swapped pairwise without changing any GPU's type or node or any directed bandwidth."""
    n = cluster.num_gpus
    node = [int(cluster.gpu_node[g]) for g in range(n)]
    bw = [[cluster.bandwidth(a, b) if a != b else 0.0 for b in range(n)] for a in range(n)]

    def swappable(a: int, b: int) -> bool:
        if node[a] != node[b]:
            return False
        p = list(range(n))
        p[a], p[b] = b, a
        return all(bw[x][y] == bw[p[x]][p[y]] for x in range(n) for y in range(n))

    classes: list[list[int]] = []
    for g in range(n):
        home = next((c for c in classes if all(swappable(m, g) for m in c)), None)
        if home is None:
            classes.append([g])
        else:
            home.append(g)
    return classes


def maps(classes: list[list[int]], world: int):
    """Every injective rank -> GPU map up to swaps inside a class (a class's GPUs are used in its order)."""
    if world == 0:
        yield ()
        return
    for k, members in enumerate(classes):
        if members:  # rank 0 on class k's first GPU, the other ranks on what is left
            rest = classes[:k] + [members[1:]] + classes[k + 1:]
            for tail in maps(rest, world - 1):
                yield (members[0],) + tail


def splits(total: int, parts: int):
    for cut in itertools.combinations(range(1, total), parts - 1):
        edges = (0,) + cut + (total,)
        yield tuple(b - a for a, b in zip(edges, edges[1:]))


def fitting_times(instance):
    """(configuration, the evaluator's iteration time) of every placement of the brute force that fits: every world
    size, tp up to the smallest node, pp, dp, ep, micro-batch, recompute, zero stage (vpp 1, cp 1), every layer
    split and every map of ranks to GPUs up to swaps that keep every link (`swap_classes`)."""
    model, job, cluster = instance.model, instance.training, instance.cluster
    max_tp = min(n.num_gpus for n in cluster.nodes)
    classes = swap_classes(cluster)
    for world in range(1, cluster.num_gpus + 1):
        every_map = list(maps(classes, world))
        for tp, pp in itertools.product(range(1, max_tp + 1), range(1, model.num_layers + 1)):
            if world % (tp * pp):
                continue
            dp = world // (tp * pp)
            experts = [1] if model.moe is None else [e for e in range(1, tp * dp + 1) if (tp * dp) % e == 0]
            for mbs, rec, zero, ep, split in itertools.product(range(1, job.max_micro_batch_size + 1), job.recompute,
                                                               job.zero_stage, experts, splits(model.num_layers, pp)):
                config = Config(tp=tp, pp=pp, cp=1, dp=dp, vpp=1, micro_batch_size=mbs, recompute=rec,
                                zero_stage=zero, ep=ep, etp=1)
                try:
                    check_placement(instance, Placement.of(config, split, range(world)), "<brute force>")
                except InputError:
                    continue
                for gpus in every_map:
                    est = evaluate(instance, Placement.of(config, split, gpus), check=False)
                    if est.fits:
                        yield config, est.iteration_time_s


def true_minimum(instance) -> float:
    return min((time_s for _, time_s in fitting_times(instance)), default=float("inf"))


@pytest.mark.parametrize("seed", [pytest.param(s, marks=() if s in QUICK else pytest.mark.slow) for s in range(32)])
def test_plan_is_the_brute_force_minimum(tmp_path, seed):
    instance = instance_from_dict(cluster_dict(seed), f"mixed_bf{seed}", tmp_path)
    assert len(instance.cluster.gpu_types) >= 2 and instance.cluster.num_gpus <= 8
    minimum = true_minimum(instance)
    if minimum == float("inf"):
        pytest.skip("nothing fits on this cluster")
    result = solve(instance)
    tolerance = minimum * 1e-9
    assert result.estimate.fits
    assert result.estimate.iteration_time_s <= minimum + tolerance  # the plan is the minimum
    assert result.solver.bound_s <= minimum + tolerance
    if result.solver.status == "optimal":
        assert result.estimate.iteration_time_s <= minimum + tolerance
    assert every_placement_bound(instance, lambda config, time_s: time_s, float("inf")) <= minimum + tolerance
