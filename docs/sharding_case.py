"""The sharding families side by side in the model (docs/model.md (C11)-(C12)).

Llama-2 13B (2k sequences, 1,024 per step) on 64 A100 40GB in 8 nodes with 200 Gb/s per node (3.125 GB/s per GPU),
megatron stack. For each sharding family, the fastest fitting Megatron-style default placement (ranks filled node by
node) over tp, pp in {1, 2, 4, 8}, micro-batch 1-2, every recompute, and for HSDP every replica count, scored by
formulation.evaluate; then the three families at tp 1, pp 4 (16 data-parallel ranks per stage, two nodes): HSDP
with one node per shard group, FSDP over both nodes, ZeRO-1.

    PYTHONPATH=. python docs/sharding_case.py
"""

from __future__ import annotations

import dataclasses
import itertools

from formulation import evaluate, instance_from_dict
from formulation.placement import default_placement
from formulation.space import divisors

INSTANCE = {
    "name": "llama2-13b-on-64-a100-40gb", "description": "Llama-2 13B on 8 DGX A100 40GB nodes, 200 Gb/s per node",
    "model": {"num_hidden_layers": 40, "hidden_size": 5120, "intermediate_size": 13824, "num_attention_heads": 40,
              "num_key_value_heads": 40, "vocab_size": 32000},
    "training": {"global_batch_size": 1024, "seq_length": 2048, "precision": "bf16", "software_stack": "megatron",
                 "zero_stage": [1, 3], "max_micro_batch_size": 2},
    "cluster": {"gpu_types": {"a100": {"preset": "a100-sxm-40gb"}},
                "nodes": [{"count": 8, "prefix": "a100-", "gpu_type": "a100", "gpus": 8}],
                "network": {"intra_node_gb_per_s": 300, "inter_node_gb_per_s": 3.125}},
}
FAMILIES = {"ZeRO-1": (1, "one"), "ZeRO-1 with optimizer instances": (1, "replicas"), "FSDP": (3, "one"),
            "HSDP": (3, "replicas")}


def placements(instance, zero: int, replicas: str):
    world = instance.cluster.num_gpus
    for tp, pp, mbs, recompute in itertools.product((1, 2, 4, 8), (1, 2, 4, 8), (1, 2), ("none", "selective", "full")):
        dp = world // (tp * pp)
        if instance.training.global_batch_size % (mbs * dp):
            continue
        rs = [1] if replicas == "one" else [r for r in divisors(dp) if 1 < r < dp or (zero == 1 and r == dp)]
        for r in rs:
            p = default_placement(instance, tp=tp, pp=pp, micro_batch_size=mbs, recompute=recompute, zero_stage=zero)
            yield dataclasses.replace(p, dp_replicate=r)


def best(instance, zero: int, replicas: str):
    scored = [(evaluate(instance, p), p) for p in placements(instance, zero, replicas)]
    return min(((e, p) for e, p in scored if e.fits), key=lambda pair: pair[0].iteration_time_s)


def line(name: str, est, p) -> str:
    s = max(est.stages, key=lambda stage: stage.time_per_micro_batch_s)
    return (f"{name:32s} {est.iteration_time_s:7.3f} s  peak {est.peak_memory_gib:5.1f} GiB"
            f"{'' if est.fits else ' (over 32 GiB)'}  per micro-batch {s.time_per_micro_batch_s * 1e3:6.1f} ms "
            f"(tp {s.tp_comm_s * 1e3:4.1f}, ZeRO-3 exposed {s.zero3_comm_s * 1e3:5.1f})  dp sync exposed "
            f"{max(x.dp_exposed_s for x in est.stages):.3f} s  {p.sizes()} mbs={p.micro_batch_size}")


def main() -> None:
    instance = instance_from_dict(INSTANCE)
    winners = {name: best(instance, *family) for name, family in FAMILIES.items()}
    for name, (est, p) in sorted(winners.items(), key=lambda kv: kv[1][0].iteration_time_s):
        print(line(name, est, p))
    hsdp = dataclasses.replace(default_placement(instance, tp=1, pp=4, zero_stage=3), dp_replicate=2)
    print("at tp 1, pp 4:")
    for name, zero, r in (("HSDP", 3, hsdp.dp_replicate), ("FSDP", 3, 1), ("ZeRO-1", 1, 1)):
        p = dataclasses.replace(hsdp, zero_stage=zero, dp_replicate=r)
        print(line(name, evaluate(instance, p), p))


if __name__ == "__main__":
    main()
