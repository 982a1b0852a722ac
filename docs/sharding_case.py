"""Where HSDP beats both FSDP and ZeRO-1 in the model (docs/model.md (C11)-(C12)), found by a search.

Each cluster below is a grid point: a dense Llama model, A100 80GB or H100 nodes of 8 GPUs on NVLink, an inter-node
network per GPU, sequences per GPU per step, one sequence length. For each sharding family the fastest fitting
Megatron-style default placement (ranks filled node by node) over tp, pp in {1, 2, 4, 8}, micro-batch 1, 2, 4, every
recompute, both reshard choices (zero 3) and, for the families with replicas, every replica count, scored by
formulation.evaluate on one stack (megatron) so that only the sharding differs:

- ZeRO-1: Megatron's distributed optimizer over dp x cp (with instances: dp_replicate > 1);
- FSDP: zero 3 over the whole dp group (dp_replicate 1);
- HSDP: zero 3 over dp_shard ranks, replicated over dp_replicate > 1.

`--search` prints every grid point with the families' best times and HSDP's margin over the best other family;
without it, the case (the grid point of the largest margin, fixed below) with each family's winner and the terms
that decide it.

    PYTHONPATH=. python docs/sharding_case.py [--search]
"""

from __future__ import annotations

import dataclasses
import itertools
import sys

from formulation import evaluate, instance_from_dict
from formulation.placement import default_placement
from formulation.space import divisors

FAMILIES = {"ZeRO-1": (1, "one"), "ZeRO-1 with optimizer instances": (1, "replicas"), "FSDP": (3, "one"),
            "HSDP": (3, "replicas")}
GPUS = {"a100": ("a100-sxm-80gb", 300), "h100": ("h100-sxm-80gb", 450)}
# the grid: model preset, GPU, nodes of 8, inter-node GB/s per GPU, sequences per GPU per step, sequence length
GRID = {"model": ("llama3-8b",), "gpu": ("h100",), "nodes": (16, 64, 128), "inter_gb_per_s": (12.5, 25.0, 50.0),
        "per_gpu": (1,), "seq": (4096,)}
CASE = {"model": "llama3-8b", "gpu": "h100", "nodes": 128, "inter_gb_per_s": 25.0, "per_gpu": 1, "seq": 4096}


def instance(model: str, gpu: str, nodes: int, inter_gb_per_s: float, per_gpu: int, seq: int):
    preset, nvlink = GPUS[gpu]
    return instance_from_dict({
        "name": f"{model}-{gpu}-{nodes * 8}", "model": {"preset": model},
        "training": {"global_batch_size": per_gpu * nodes * 8, "seq_length": seq, "precision": "bf16",
                     "software_stack": "megatron", "zero_stage": [1, 3], "max_micro_batch_size": 4},
        "cluster": {"gpu_types": {gpu: {"preset": preset}},
                    "nodes": [{"count": nodes, "prefix": f"{gpu}-", "gpu_type": gpu, "gpus": 8}],
                    "network": {"intra_node_gb_per_s": nvlink, "inter_node_gb_per_s": inter_gb_per_s}}})


def placements(inst, zero: int, replicas: str):
    world = inst.cluster.num_gpus
    for tp, pp, mbs in itertools.product((1, 2, 4, 8), (1, 2, 4, 8), (1, 2, 4)):
        dp = world // (tp * pp)
        if inst.training.global_batch_size % (mbs * dp) or inst.model.num_layers < pp:
            continue
        rs = [1] if replicas == "one" else [r for r in divisors(dp) if 1 < r < dp or (zero == 1 and r == dp)]
        for recompute, r, reshard in itertools.product(("none", "selective", "full"), rs,
                                                       (True, False) if zero == 3 else (True,)):
            p = default_placement(inst, tp=tp, pp=pp, micro_batch_size=mbs, recompute=recompute, zero_stage=zero)
            yield dataclasses.replace(p, dp_replicate=r, reshard_after_forward=reshard)


def best(inst, zero: int, replicas: str):
    """The family's fastest fitting placement (estimate, placement), or None."""
    fitting = ((e, p) for p in placements(inst, zero, replicas) if (e := evaluate(inst, p, check=False)).fits)
    return min(fitting, key=lambda pair: pair[0].iteration_time_s, default=None)


def winners(inst) -> dict:
    return {name: best(inst, *family) for name, family in FAMILIES.items()}


def margin(found: dict) -> float:
    """HSDP's time under the best other family's, as a share of that (> 0: HSDP wins; -inf: HSDP fits nothing)."""
    others = [w[0].iteration_time_s for name, w in found.items() if name != "HSDP" and w]
    if found["HSDP"] is None:
        return float("-inf")
    return 1 - found["HSDP"][0].iteration_time_s / min(others) if others else 1.0


def line(name: str, est, p) -> str:
    s = max(est.stages, key=lambda stage: stage.time_per_micro_batch_s)
    return (f"{name:32s} {est.iteration_time_s:7.3f} s  peak {est.peak_memory_gib:5.1f} GiB  m={est.num_micro_batches:3d}"
            f"  bubble {est.breakdown['bubble_s']:6.3f} s  tp {est.breakdown['tp_comm_s']:6.3f} s  ZeRO-3 exposed "
            f"{est.breakdown['dp_comm_s'] - max(x.dp_exposed_s for x in est.stages):6.3f} s  dp sync exposed "
            f"{max(x.dp_exposed_s for x in est.stages):6.3f} s  per micro-batch {s.time_per_micro_batch_s:6.3f} s  "
            f"{p.sizes()} mbs={p.micro_batch_size} {p.recompute} reshard={p.reshard_after_forward}")


def search() -> None:
    keys = list(GRID)
    for values in itertools.product(*GRID.values()):
        point = dict(zip(keys, values))
        found = winners(instance(**point))
        times = "  ".join(f"{name} {w[0].iteration_time_s:7.3f}" if w else f"{name} -" for name, w in found.items())
        print(f"{point}  {times}  HSDP margin {margin(found):+.1%}", flush=True)


def main() -> None:
    if "--search" in sys.argv:
        search()
        return
    found = winners(instance(**CASE))
    print(CASE)
    for name, (est, p) in sorted(((n, w) for n, w in found.items() if w), key=lambda kv: kv[1][0].iteration_time_s):
        print(line(name, est, p))
    print(f"HSDP margin over the best other family: {margin(found):+.1%}")


if __name__ == "__main__":
    main()
