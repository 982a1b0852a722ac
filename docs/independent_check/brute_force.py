"""Independent brute force over placements, using only load_instance, evaluate, Placement, check_placement."""
from __future__ import annotations

import sys
import time

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))  # the repository root
from formulation.inputs.instance import load_instance  # noqa
from formulation.evaluate import evaluate  # noqa
from formulation.placement import Placement, check_placement  # noqa
from formulation.errors import InputError  # noqa


def divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def compositions(total, parts, step):
    if parts == 1:
        if total >= step and total % step == 0:
            yield (total,)
        return
    for first in range(step, total - step * (parts - 1) + 1, step):
        for rest in compositions(total - first, parts - 1, step):
            yield (first,) + rest


def gpu_classes(inst):
    """Partition GPUs into classes whose members are pairwise swappable (every transposition inside a class
    is an automorphism of type, node-membership, and the directed bandwidth matrix) -> class label per GPU."""
    c = inst.cluster
    n = c.num_gpus
    node = [int(c.gpu_node[g]) for g in range(n)]
    typ = [c.nodes[node[g]].gpu_type for g in range(n)]
    bw = [[c.bandwidth(a, b) if a != b else 0.0 for b in range(n)] for a in range(n)]

    def swappable(a, b):
        if typ[a] != typ[b] or node[a] != node[b]:
            return False
        perm = list(range(n))
        perm[a], perm[b] = b, a
        for x in range(n):
            for y in range(n):
                if x == y:
                    continue
                if bw[x][y] != bw[perm[x]][perm[y]]:
                    return False
        return True

    label = [-1] * n
    k = 0
    for g in range(n):
        if label[g] >= 0:
            continue
        label[g] = k
        members = [g]
        for h in range(g + 1, n):
            if label[h] < 0 and all(swappable(m, h) for m in members):
                # also need all transpositions with members -> checked pairwise
                label[h] = k
                members.append(h)
        k += 1
    return label


def maps_for(label, world):
    """All rank->GPU maps of `world` ranks up to within-class permutation (GPUs of a class taken in order)."""
    classes = {}
    for g, l in enumerate(label):
        classes.setdefault(l, []).append(g)
    keys = sorted(classes)
    avail = {k: len(classes[k]) for k in keys}
    out = []

    def rec(prefix, used):
        if len(prefix) == world:
            out.append(tuple(prefix))
            return
        for k in keys:
            if used[k] < avail[k]:
                prefix.append(classes[k][used[k]])
                used[k] += 1
                rec(prefix, used)
                used[k] -= 1
                prefix.pop()

    rec([], {k: 0 for k in keys})
    return out


def tool_max_tp(inst):
    c, job = inst.cluster, inst.training
    g = min(n.num_gpus for n in c.nodes)
    return min(g, job.max_tensor_parallel_size or g)


def brute(inst, worlds=None, verbose=False, time_cap=600):
    model, job, c = inst.model, inst.training, inst.cluster
    label = gpu_classes(inst)
    n = c.num_gpus
    worlds = worlds or [n]
    moe = model.moe
    res = {}  # key -> (time, placement)  keys: 'all', 'tooltp' (tp<=tool max), per world
    t0 = time.time()
    count = 0
    maxtp = tool_max_tp(inst)
    for world in worlds:
        maps = maps_for(label, world)
        for tp in divisors(world):
            for cp in job.context_parallel_sizes:
                if world % (tp * cp):
                    continue
                for pp in divisors(world // (tp * cp)):
                    if pp > model.num_layers:
                        continue
                    dp = world // (tp * cp * pp)
                    eps = [(1, 1)]
                    if moe is not None:
                        eps = [(e, u) for u in job.expert_tensor_parallel_sizes for e in divisors(tp * cp * dp)
                               if (not job.expert_parallel_sizes or e in job.expert_parallel_sizes)]
                    for mbs in range(1, job.max_micro_batch_size + 1):
                        for vpp in job.virtual_pipeline_sizes:
                            for rec in job.recompute:
                                for z in job.zero_stage:
                                    for ep, etp in eps:
                                        for split in compositions(model.num_layers, pp, vpp):
                                            probe = Placement(tp=tp, pp=pp, cp=cp, dp=dp, vpp=vpp,
                                                              micro_batch_size=mbs, recompute=rec, zero_stage=z,
                                                              ep=ep, etp=etp, layers_per_stage=split,
                                                              gpus=tuple(range(world)))
                                            try:
                                                check_placement(inst, probe, "bf")
                                            except InputError:
                                                continue
                                            for gpus in maps:
                                                p = Placement(tp=tp, pp=pp, cp=cp, dp=dp, vpp=vpp,
                                                              micro_batch_size=mbs, recompute=rec, zero_stage=z,
                                                              ep=ep, etp=etp, layers_per_stage=split, gpus=gpus)
                                                est = evaluate(inst, p, check=False)
                                                count += 1
                                                if not est.fits:
                                                    continue
                                                t = est.iteration_time_s
                                                keys = ["all", f"w{world}"]
                                                nodes_of = [int(inst.cluster.gpu_node[g]) for g in gpus]
                                                if all(len({nodes_of[r] for r in range(k, k + tp)}) == 1 for k in range(0, world, tp)):
                                                    keys.append("tpin")
                                                if tp <= maxtp:
                                                    keys.append("tooltp")
                                                    keys.append(f"tooltp_w{world}")
                                                for key in keys:
                                                    if key not in res or t < res[key][0]:
                                                        res[key] = (t, p)
                                            if time.time() - t0 > time_cap:
                                                raise TimeoutError(f"brute force over {time_cap}s ({count} evals)")
    return res, count


def placement_json(inst, p):
    d = p.to_dict(inst.cluster)
    return d


if __name__ == "__main__":
    inst = load_instance(sys.argv[1])
    worlds = None
    if len(sys.argv) > 2:
        worlds = [int(x) for x in sys.argv[2].split(",")]
    t = time.time()
    res, count = brute(inst, worlds)
    print(count, "evals", round(time.time() - t, 1), "s")
    for k, (v, p) in sorted(res.items()):
        print(k, v, p.summary(), p.gpus)
