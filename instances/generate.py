"""Deterministic generator of the shipped instance files: `python instances/generate.py` rewrites them.

Each builder returns the instance as a dict; the network figures are public measurements (nccl-tests on DGX
H100: ~450 GB/s NVLink per direction, NDR 400G InfiniBand ~48 GB/s per NIC) with seeded measurement noise.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from solvers.outputs.files import write_json_atomic

try:  # run as a script (python instances/generate.py) or imported as instances.generate
    from rack_instances import BUILDERS as RACK_BUILDERS
except ImportError:
    from instances.rack_instances import BUILDERS as RACK_BUILDERS

HERE = Path(__file__).resolve().parent


def _dgx_h100(name: str, description: str, model: str, training: dict, nodes: list[dict], network: dict) -> dict:
    """An instance on DGX H100 nodes: NVLink ~450 GB/s per direction, one NDR 400G NIC per GPU (~48 GB/s);
    `network` adds the measured deviations."""
    return {
        "name": name, "description": description, "model": {"preset": model},
        "training": {"precision": "bf16", "memory_limit_fraction": 0.8, **training},
        "cluster": {
            "gpu_types": {"h100-sxm-80gb": {"preset": "h100-sxm-80gb"}},
            "nodes": nodes,
            "network": {"intra_node_gb_per_s": 450.0, "inter_node_gb_per_s": 48.0, "intra_node_latency_us": 5.0,
                        "inter_node_latency_us": 15.0, **network},
        },
    }


def h100_128(seed: int = 128) -> dict:
    """16 DGX H100 nodes (8 GPUs, one NDR 400G NIC per GPU) in two leaf groups of 8 nodes.

    Within a leaf group node pairs measure ~48 GB/s per NIC; across groups traffic crosses a 2:1
    oversubscribed spine (~30 GB/s). Node h100-05 has a degraded NIC (half bandwidth) and two node
    pairs run at 60% (a congested link). Measurement noise: +-3%, seeded.
    """
    rng = random.Random(seed)
    names = [f"h100-{i:02d}" for i in range(16)]
    group = [i // 8 for i in range(16)]
    matrix = [[0.0] * 16 for _ in range(16)]
    degraded_pairs = {(2, 11), (6, 7)}
    for i in range(16):
        for j in range(i + 1, 16):
            bw = 48.0 if group[i] == group[j] else 30.0
            if (i, j) in degraded_pairs:
                bw *= 0.6
            bw = round(bw * rng.uniform(0.97, 1.03), 1)
            matrix[i][j] = matrix[j][i] = bw
    return _dgx_h100(
        "h100_128",
        "Llama-3 70B, sequence 8192, global batch 512 sequences (4M tokens per step, the batch a team "
        "continuing Llama-3-70B pretraining on 128 H100s would run: 16 sequences per data-parallel "
        "replica at dp=32) on 16 DGX H100 nodes in two leaf groups of 8 with a 2:1 oversubscribed spine "
        "between them, one node with a half-speed NIC (h100-05) and two congested node pairs at 60%.",
        "llama3-70b",
        {"global_batch_size": 512, "seq_length": 8192, "recompute": ["none", "selective", "full"],
         "zero_stage": [0, 1], "max_micro_batch_size": 4, "context_parallel_sizes": [1, 2],
         "virtual_pipeline_sizes": [1, 2, 4, 5]},
        [{"name": n, "gpu_type": "h100-sxm-80gb", "gpus": 8} for n in names],
        {"nodes": [{"node": "h100-05", "inter_node_gb_per_s": 24.0}], "node_matrix_gb_per_s": matrix})


def _dgx_nodes(count: int, prefix: str = "h100") -> list[dict]:
    return [{"count": count, "prefix": prefix, "gpu_type": "h100-sxm-80gb", "gpus": 8}]


def _degraded(rng: random.Random, count: int, nodes: int, prefix: str, pairs: int) -> tuple[list, list]:
    """A few half-speed NICs and congested node pairs at 60 %, seeded."""
    width = max(2, len(str(nodes - 1)))  # as the loader names `count` nodes
    names = [f"{prefix}{i:0{width}d}" for i in range(nodes)]
    slow = sorted(rng.sample(range(nodes), count))
    nics = [{"node": names[i], "inter_node_gb_per_s": 24.0} for i in slow]
    congested = []
    while len(congested) < pairs:
        a, b = sorted(rng.sample(range(nodes), 2))
        if all({a, b} != set(p) for p in congested):
            congested.append((a, b))
    return nics, [{"nodes": [names[a], names[b]], "gb_per_s": 0.6 * 40.0} for a, b in congested]


def _fat_tree(name: str, description: str, model: str, nodes: int, seed: int, slow_nics: int, congested: int,
              **training) -> dict:
    """DGX H100 nodes on a rail-optimised fat tree, leaf groups of 32 nodes (256 GPUs, one scalable unit) with
    ~48 GB/s per NIC inside and a spine at ~40 GB/s between groups; a few half-speed NICs and congested pairs.
    Batches of 2,048 sequences of 8,192 tokens (16M tokens per step, as in the Llama 3 pretraining runs)."""
    nics, pairs = _degraded(random.Random(seed), slow_nics, nodes, "h100-", congested)
    return _dgx_h100(
        name, description, model,
        {"global_batch_size": 2048, "seq_length": 8192, "recompute": ["none", "selective", "full"], **training},
        _dgx_nodes(nodes, "h100-"),
        {"leaf_groups": {"nodes_per_group": 32, "cross_group_gb_per_s": 40.0}, "nodes": nics, "node_pairs": pairs})


def h100_1024(seed: int = 1024) -> dict:
    """128 nodes, two half-speed NICs and three congested node pairs at 60 % of the spine figure."""
    return _fat_tree(
        "h100_1024",
        "Llama-3 70B, sequence 8192, global batch 2048 sequences (16M tokens per step, the batch size of the "
        "Llama 3 pretraining runs) on 128 DGX H100 nodes: a rail-optimised fat tree with leaf groups of 32 "
        "nodes and a spine at ~40 GB/s per NIC between groups, two half-speed NICs, three congested pairs.",
        "llama3-70b", 128, seed, 2, 3, zero_stage=[0, 1], max_micro_batch_size=2, context_parallel_sizes=[1, 2],
        virtual_pipeline_sizes=[1, 2, 4, 5])


def h100_16384(seed: int = 16384) -> dict:
    """2,048 nodes, the scale of the Llama 3 405B run: eight half-speed NICs and eight congested node pairs."""
    return _fat_tree(
        "h100_16384",
        "Llama-3.1 405B, sequence 8192, global batch 2048 sequences (16M tokens per step, as in the Llama 3 "
        "paper's 405B run on 16K H100s) on 2,048 DGX H100 nodes: leaf groups of 32 nodes, spine at ~40 GB/s "
        "per NIC, eight half-speed NICs and eight congested node pairs.",
        "llama3.1-405b", 2048, seed, 8, 8, zero_stage=[1], max_micro_batch_size=1, context_parallel_sizes=[1, 2],
        virtual_pipeline_sizes=[1, 2, 4, 7])


def mixtral_8x7b_h100_64(seed: int = 64) -> dict:
    """8 DGX H100 nodes on one leaf (~48 GB/s per NIC, +-3 % noise), one half-speed NIC: Mixtral-8x7B, whose
    expert all-to-all decides whether an expert-parallel group stays inside a node."""
    rng = random.Random(seed)
    matrix = [[0.0] * 8 for _ in range(8)]
    for i in range(8):
        for j in range(i + 1, 8):
            matrix[i][j] = matrix[j][i] = round(48.0 * rng.uniform(0.97, 1.03), 1)
    return _dgx_h100(
        "mixtral_8x7b_h100_64",
        "Mixtral-8x7B (8 experts, top-2), sequence 4096, global batch 512 sequences (2M tokens per step) on 8 DGX "
        "H100 nodes of one leaf, node h100-03 with a half-speed NIC; expert parallelism is planned with the map.",
        "mixtral-8x7b",
        {"global_batch_size": 512, "seq_length": 4096, "recompute": ["none", "selective", "full"],
         "zero_stage": [0, 1], "max_micro_batch_size": 2, "context_parallel_sizes": [1],
         "virtual_pipeline_sizes": [1, 2, 4]},
        [{"name": f"h100-{i:02d}", "gpu_type": "h100-sxm-80gb", "gpus": 8} for i in range(8)],
        {"nodes": [{"node": "h100-03", "inter_node_gb_per_s": 24.0}], "node_matrix_gb_per_s": matrix})


def deepseek_v3_h100_1024(seed: int = 1024) -> dict:
    """128 nodes on the fat tree of h100_1024 (same seed: the same slow NICs and congested pairs), DeepSeek-V3."""
    return _fat_tree(
        "deepseek_v3_h100_1024",
        "DeepSeek-V3 (671B, 37B active; 256 routed experts top-8, one shared, MLA, first three layers dense), "
        "sequence 4096, global batch 2048 sequences (8M tokens per step) on 128 DGX H100 nodes: the fat tree of "
        "h100_1024 (leaf groups of 32 nodes, spine ~40 GB/s per NIC, two half-speed NICs, three congested pairs).",
        "deepseek-v3", 128, seed, 2, 3, global_batch_size=2048, seq_length=4096, recompute=["selective", "full"],
        zero_stage=[1], max_micro_batch_size=1, context_parallel_sizes=[1], virtual_pipeline_sizes=[1, 2])


def _pairwise_matrix(rng: random.Random, nodes: int) -> list[list[float]]:
    """Every node pair its own measured bandwidth, uniform in 15-25 GB/s per NIC."""
    matrix = [[0.0] * nodes for _ in range(nodes)]
    for i in range(nodes):
        for j in range(i + 1, nodes):
            matrix[i][j] = matrix[j][i] = round(rng.uniform(15.0, 25.0), 1)
    return matrix


def measured_matrix(nodes: int, seed: int = 7) -> dict:
    """The hard case Pipette profiles: every node pair its own measured bandwidth, uniform in 15-25 GB/s per
    NIC (seeded), 8 GPUs per node at NVLink speed. No two nodes are interchangeable."""
    matrix = _pairwise_matrix(random.Random(seed * 1000 + nodes), nodes)
    return _dgx_h100(
        f"measured_{nodes}",
        f"Llama-3 70B, sequence 4096, global batch {16 * nodes} sequences on {nodes} nodes of 8 H100s whose "
        "inter-node bandwidth was measured pair by pair (uniform 15-25 GB/s per NIC, seeded): the "
        "measured-matrix family of the annealing benchmark, where no two nodes are interchangeable and the "
        "model needs pipeline stages whose data-parallel groups span some of the nodes, not all.",
        "llama3-70b",
        {"global_batch_size": 16 * nodes, "seq_length": 4096, "recompute": ["none", "selective"], "zero_stage": [1],
         "max_micro_batch_size": 2, "context_parallel_sizes": [1], "virtual_pipeline_sizes": [1, 2]},
        _dgx_nodes(nodes, "m"),
        {"inter_node_gb_per_s": 25.0, "node_matrix_gb_per_s": matrix})


def small_matrix(nodes: int, gpus: int, seed: int = 11) -> dict:
    """A small cluster the exact program proves: `nodes` x `gpus` H100s, every node pair its own measured
    bandwidth (uniform 15-25 GB/s per NIC, seeded), Llama-3 8B."""
    matrix = _pairwise_matrix(random.Random(seed * 100 + nodes * 10 + gpus), nodes)
    return _dgx_h100(
        f"small_{nodes}x{gpus}",
        f"Llama-3 8B, sequence 4096, global batch 32 sequences on {nodes} nodes of {gpus} H100s with measured, "
        "all-different node-pair bandwidth: small enough for the exact program to prove its optimum.",
        "llama3-8b",
        {"global_batch_size": 32, "seq_length": 4096, "recompute": ["none", "full"], "zero_stage": [1],
         "max_micro_batch_size": 2, "context_parallel_sizes": [1], "virtual_pipeline_sizes": [1, 2]},
        [{"count": nodes, "prefix": "s", "gpu_type": "h100-sxm-80gb", "gpus": gpus}],
        {"inter_node_gb_per_s": 25.0, "node_matrix_gb_per_s": matrix})


def irregular(nodes: int, gpus: int, seed: int) -> dict:
    """The irregular family of `solve bench --family irregular` (32-64 GPUs): A100-40GB nodes in two leaf blocks
    (node pairs ~38-50 GB/s per NIC inside a block, ~18-30 across, every pair its own figure), a third of the
    nodes with a slow NIC (7-12 GB/s), one congested node pair (2-5 GB/s), one node with slower NVLink
    (100-150 GB/s) and one slow NVLink GPU pair (60-90 GB/s) on another; a 3B GPT-style model. Seeded."""
    rng = random.Random(seed * 1000 + nodes * 10 + gpus)
    names = [f"r{i:02d}" for i in range(nodes)]
    block = [2 * i // nodes for i in range(nodes)]
    matrix = [[0.0] * nodes for _ in range(nodes)]
    for i in range(nodes):
        for j in range(i + 1, nodes):
            low, high = (38.0, 50.0) if block[i] == block[j] else (18.0, 30.0)
            matrix[i][j] = matrix[j][i] = round(rng.uniform(low, high), 3)
    slow = rng.sample(range(nodes), max(1, nodes // 3))
    per_node = [{"node": names[i], "inter_node_gb_per_s": round(rng.uniform(7.0, 12.0), 3)} for i in sorted(slow)]
    nvlink, pair_node = rng.sample(range(nodes), 2)
    per_node.append({"node": names[nvlink], "intra_node_gb_per_s": round(rng.uniform(100.0, 150.0), 3)})
    a, b = rng.sample(range(nodes), 2)
    return {
        "name": f"irregular_{nodes}x{gpus}_s{seed}",
        "description": f"{nodes} nodes x {gpus} A100-40GB GPUs, seed {seed}: two leaf blocks, every node pair its "
                       f"own bandwidth, slow NICs on {len(slow)} nodes, a congested pair, a slower NVLink node "
                       f"and a slow NVLink GPU pair (the irregular benchmark family)",
        "model": {"num_hidden_layers": 28, "hidden_size": 3072, "intermediate_size": 12288,
                  "num_attention_heads": 24, "num_key_value_heads": 24, "vocab_size": 50257, "hidden_act": "gelu",
                  "tie_word_embeddings": True},
        "training": {"global_batch_size": 4 * nodes * gpus, "seq_length": 4096,
                     "recompute": ["none", "selective", "full"], "zero_stage": [0, 1], "max_micro_batch_size": 4,
                     "context_parallel_sizes": [1, 2], "virtual_pipeline_sizes": [1, 2]},
        "cluster": {
            "gpu_types": {"a100": {"preset": "a100-sxm-40gb"}},
            "nodes": [{"name": n, "gpu_type": "a100", "gpus": gpus} for n in names],
            "network": {"intra_node_gb_per_s": 300.0, "inter_node_gb_per_s": 50.0, "node_matrix_gb_per_s": matrix,
                        "nodes": per_node,
                        "node_pairs": [{"nodes": [names[a], names[b]], "gb_per_s": round(rng.uniform(2.0, 5.0), 3)}],
                        "gpu_pairs": [{"gpus": [f"{names[pair_node]}:0", f"{names[pair_node]}:1"],
                                       "gb_per_s": round(rng.uniform(60.0, 90.0), 3)}]},
        },
    }


# the irregular benchmark family: 32 and 64 GPUs, three seeds each (instances/irregular/)
IRREGULAR_FAMILY = [(nodes, gpus, seed) for nodes, gpus in ((4, 8), (8, 8)) for seed in (1, 2, 3)]


def _mixed(name: str, description: str, model: str, training: dict, pods: list[tuple[str, str, int]],
           spine_gb_per_s: float) -> dict:
    """Pods of one GPU type each (name prefix, catalog type, node count), 8 GPUs a node, bought in different
    years: DGX H100/H200 with NVLink 4 (~450 GB/s) and one NDR 400G NIC per GPU (~48 GB/s), DGX A100 with
    NVLink 3 (~230 GB/s all-reduce busbw) and one HDR 200G NIC per GPU (~24 GB/s). Each pod sits under its
    own leaf switches; pods meet at a spine of `spine_gb_per_s` per NIC. Prices per GPU-hour are typical
    2026 cloud list prices (for `--objective cost`)."""
    fabric = {"h100-sxm-80gb": (450.0, 48.0, 2.5), "h200-sxm-141gb": (450.0, 48.0, 3.4),
              "a100-sxm-80gb": (230.0, 24.0, 1.3)}
    nodes, per_node, names = [], [], []
    for prefix, gpu_type, count in pods:
        for i in range(count):
            node = f"{prefix}-{i:02d}"
            names.append((node, prefix))
            nodes.append({"name": node, "gpu_type": gpu_type, "gpus": 8})
            intra, nic, _ = fabric[gpu_type]
            per_node.append({"node": node, "intra_node_gb_per_s": intra, "inter_node_gb_per_s": nic})
    matrix = [[0.0 if a == b else (fabric_nic if pa == pb else spine_gb_per_s)
               for b, (nb, pb) in enumerate(names)
               for fabric_nic in [min(per_node[a]["inter_node_gb_per_s"], per_node[b]["inter_node_gb_per_s"])]]
              for a, (na, pa) in enumerate(names)]
    types = {t: {"preset": t, "price_per_hour": fabric[t][2]} for t in sorted({t for _, t, _ in pods})}
    return {
        "name": name, "description": description, "model": {"preset": model},
        "training": {"precision": "bf16", "memory_limit_fraction": 0.8, **training},
        "cluster": {"gpu_types": types, "nodes": nodes,
                    "network": {"intra_node_gb_per_s": 450.0, "inter_node_gb_per_s": 48.0,
                                "intra_node_latency_us": 5.0, "inter_node_latency_us": 15.0,
                                "nodes": per_node, "node_matrix_gb_per_s": matrix}},
    }


def a100_h100_64() -> dict:
    """4 DGX H100 + 4 DGX A100-80GB nodes: two purchases of different GPU generations."""
    return _mixed(
        "a100_h100_64",
        "Llama-3 70B, sequence 4096, global batch 256 sequences (1M tokens per step) on 4 DGX H100 nodes and 4 "
        "DGX A100-80GB nodes bought years apart: NDR 400G (~48 GB/s per NIC) in the H100 pod, HDR 200G (~24 "
        "GB/s) in the A100 pod, a spine at ~24 GB/s between them. Mixed islands, uneven stages.",
        "llama3-70b",
        {"global_batch_size": 256, "seq_length": 4096, "recompute": ["none", "selective", "full"],
         "zero_stage": [0, 1], "max_micro_batch_size": 2, "context_parallel_sizes": [1],
         "virtual_pipeline_sizes": [1, 2]},
        [("h100", "h100-sxm-80gb", 4), ("a100", "a100-sxm-80gb", 4)], 24.0)


def mixtral_8x7b_a100_h100_64() -> dict:
    """The two purchases of a100_h100_64 (4 DGX H100 + 4 DGX A100-80GB) training Mixtral-8x7B: expert
    parallelism on mixed GPU types, where an expert-parallel group that spans the pods crosses the spine."""
    return _mixed(
        "mixtral_8x7b_a100_h100_64",
        "Mixtral-8x7B (8 experts, top-2), sequence 4096, global batch 256 sequences (1M tokens per step) on 4 DGX "
        "H100 nodes and 4 DGX A100-80GB nodes: NDR 400G (~48 GB/s per NIC) in the H100 pod, HDR 200G (~24 GB/s) "
        "in the A100 pod, a spine at ~24 GB/s between them. Expert groups and stages on mixed GPU types.",
        "mixtral-8x7b",
        {"global_batch_size": 256, "seq_length": 4096, "recompute": ["none", "selective", "full"],
         "zero_stage": [1], "max_micro_batch_size": 2, "context_parallel_sizes": [1],
         "virtual_pipeline_sizes": [1, 2]},
        [("h100", "h100-sxm-80gb", 4), ("a100", "a100-sxm-80gb", 4)], 24.0)


def mixed_256() -> dict:
    """32 nodes of three types: 8 DGX H200, 8 DGX H100, 16 DGX A100-80GB."""
    return _mixed(
        "mixed_256",
        "Llama-3 70B, sequence 8192, global batch 512 sequences (4M tokens per step) on 32 nodes of three "
        "purchases: 8 DGX H200 (141 GB), 8 DGX H100, 16 DGX A100-80GB, each pod under its own leaf switches "
        "and a spine at ~40 GB/s per NIC between pods (A100 pairs are capped by their HDR NICs).",
        "llama3-70b",
        {"global_batch_size": 512, "seq_length": 8192, "recompute": ["selective", "full"],
         "zero_stage": [1], "max_micro_batch_size": 1, "context_parallel_sizes": [1],
         "virtual_pipeline_sizes": [1]},
        [("h200", "h200-sxm-141gb", 8), ("h100", "h100-sxm-80gb", 8), ("a100", "a100-sxm-80gb", 16)], 40.0)


BUILDERS = {"small_4x2": lambda: small_matrix(4, 2), "small_2x4": lambda: small_matrix(2, 4),"h100_128": h100_128, "h100_1024": h100_1024, "h100_16384": h100_16384,
            "measured_4": lambda: measured_matrix(4), "measured_16": lambda: measured_matrix(16), "measured_32": lambda: measured_matrix(32),
            "measured_64": lambda: measured_matrix(64),
            "a100_h100_64": a100_h100_64, "mixed_256": mixed_256, "mixtral_8x7b_h100_64": mixtral_8x7b_h100_64,
            "mixtral_8x7b_a100_h100_64": mixtral_8x7b_a100_h100_64, "deepseek_v3_h100_1024": deepseek_v3_h100_1024, **RACK_BUILDERS}


def write(name: str, data: dict, out_dir: Path) -> Path:
    return write_json_atomic(out_dir / f"{name}.json", data, indent=1)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("names", nargs="*", default=sorted(BUILDERS), help="instances to write (default: all)")
    parser.add_argument("--out-dir", type=Path, default=HERE)
    parser.add_argument("--irregular", action="store_true", help="write the irregular family into instances/irregular/")
    args = parser.parse_args(argv)
    if args.irregular:
        for nodes, gpus, seed in IRREGULAR_FAMILY:
            data = irregular(nodes, gpus, seed)
            print(write(data["name"], data, args.out_dir / "irregular"))
        return
    for name in args.names:
        print(write(name, BUILDERS[name](), args.out_dir))


if __name__ == "__main__":
    main()
