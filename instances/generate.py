"""Deterministic generator of the shipped instance files: `python instances/generate.py` rewrites them.

Each builder returns the instance as a dict; the network figures are public measurements (nccl-tests on DGX
H100: ~450 GB/s NVLink per direction, NDR 400G InfiniBand ~48 GB/s per NIC) with seeded measurement noise.
"""

from __future__ import annotations

import argparse
import json
import os
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent


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
    return {
        "name": "h100_128",
        "description": (
            "Llama-3 70B, sequence 8192, global batch 512 sequences (4M tokens per step, the batch a team "
            "continuing Llama-3-70B pretraining on 128 H100s would run: 16 sequences per data-parallel "
            "replica at dp=32) on 16 DGX H100 nodes in two leaf groups of 8 with a 2:1 oversubscribed spine "
            "between them, one node with a half-speed NIC (h100-05) and two congested node pairs at 60%."),
        "model": {"preset": "llama3-70b"},
        "training": {
            "global_batch_size": 512, "seq_length": 8192, "precision": "bf16",
            "recompute": ["none", "selective", "full"], "zero_stage": [0, 1],
            "max_micro_batch_size": 4, "context_parallel_sizes": [1, 2], "virtual_pipeline_sizes": [1, 2, 4, 5],
            "memory_limit_fraction": 0.8,
        },
        "cluster": {
            "gpu_types": {"h100-sxm-80gb": {"preset": "h100-sxm-80gb"}},
            "nodes": [{"name": n, "gpu_type": "h100-sxm-80gb", "gpus": 8} for n in names],
            "network": {
                "intra_node_gb_per_s": 450.0, "inter_node_gb_per_s": 48.0,
                "intra_node_latency_us": 5.0, "inter_node_latency_us": 15.0,
                "nodes": [{"node": "h100-05", "inter_node_gb_per_s": 24.0}],
                "node_matrix_gb_per_s": matrix,
            },
        },
    }


BUILDERS = {"h100_128": h100_128}


def write(name: str, data: dict, out_dir: Path) -> Path:
    """Write atomically (temporary file + rename) so a reader never sees half a file."""
    path = out_dir / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)
    return path


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("names", nargs="*", default=sorted(BUILDERS), help="instances to write (default: all)")
    parser.add_argument("--out-dir", type=Path, default=HERE)
    args = parser.parse_args(argv)
    for name in args.names:
        print(write(name, BUILDERS[name](), args.out_dir))


if __name__ == "__main__":
    main()
