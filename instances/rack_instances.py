"""Rack-scale and AMD instances of 2026 (written by instances/generate.py): GB200 / GB300 NVL72 racks as NVLink
domains of 18 trays of 4 GPUs, MI300X nodes of 8, and a mixed H100 + GB200 cluster.

Figures (per GPU and direction, as the rest of the shipped instances give them):
- NVLink 5: 1.8 TB/s per GPU both ways (https://www.nvidia.com/en-us/data-center/gb200-nvl72/: "130 TB/s" of
  NVLink for 72 GPUs), 900 GB/s each way, inside a tray and across the rack's trays alike (every GPU reaches the
  rack's NVLink switch trays; no link joins two GPUs of a tray directly).
- Scale-out: GB200 compute trays carry one ConnectX-7 400 Gb/s NIC per GPU, GB300 trays one ConnectX-8 800 Gb/s
  SuperNIC per GPU (NVIDIA's GB200 / GB300 NVL72 pages); taken as measured H100 clusters give NDR 400G (~48 GB/s
  per NIC of 50 line rate, instances/generate.py) and twice that for 800G (~96 GB/s).
- MI300X: 7 Infinity Fabric links of 64 GB/s each way to the 7 peers, given as 448 GB/s per GPU
  (docs/instance-format.md's AMD paragraph); one 400 Gb/s NIC per GPU (~48 GB/s), as AMD's MI300X platform
  reference (8 x 400G per node) and the clusters that published MI300X training runs describe it.
"""

from __future__ import annotations

NVLINK5_GB_PER_S = 900.0
CX7_GB_PER_S = 48.0  # 400 Gb/s per GPU, measured share as the H100 instances take it
CX8_GB_PER_S = 96.0  # 800 Gb/s per GPU


def _training(**fields) -> dict:
    return {"precision": "bf16", "memory_limit_fraction": 0.8, **fields}


def nvl72(name: str, description: str, model: str, training: dict, racks: int, gpu_type: str,
          nic_gb_per_s: float) -> dict:
    """`racks` NVL72 racks: 18 trays of 4 GPUs each, one NVLink domain per rack, one NIC per GPU on a
    non-blocking rail-optimised fabric between racks (NVIDIA's DGX SuperPOD reference design)."""
    return {
        "name": name, "description": description, "model": {"preset": model}, "training": _training(**training),
        "cluster": {
            "gpu_types": {gpu_type: {"preset": gpu_type}},
            "nodes": {"count": 18 * racks, "prefix": "tray", "gpu_type": gpu_type, "gpus": 4},
            "nvlink_domains": {"nodes_per_domain": 18, "gb_per_s": NVLINK5_GB_PER_S, "prefix": "rack"},
            "network": {"intra_node_gb_per_s": NVLINK5_GB_PER_S, "inter_node_gb_per_s": nic_gb_per_s,
                        "intra_node_latency_us": 5.0, "inter_node_latency_us": 15.0},
        },
    }


def _llama405b(global_batch_size: int) -> dict:
    """Llama-3.1 405B pretraining at 8k sequences, as NVIDIA's and Meta's recipes run it (bf16, distributed
    optimizer, micro-batch 1)."""
    return {"global_batch_size": global_batch_size, "seq_length": 8192, "recompute": ["none", "selective", "full"],
            "zero_stage": [1], "max_micro_batch_size": 1, "context_parallel_sizes": [1, 2],
            "virtual_pipeline_sizes": [1, 2, 3, 4, 7]}


def _llama405b_on_racks(racks: int, gpu_type: str, nic: str, nic_gb_per_s: float, global_batch_size: int) -> dict:
    """Llama-3.1 405B on `racks` NVL72 racks of `gpu_type`."""
    gpus = 72 * racks
    return nvl72(
        f"{gpu_type}_nvl72_{gpus}",
        f"Llama-3.1 405B, sequence 8192, global batch {global_batch_size} sequences "
        f"({global_batch_size * 8192 / 1e6:.1f}M tokens per step) on {racks} {gpu_type.upper()} NVL72 racks "
        f"({gpus:,} GPUs): each rack one NVLink domain of 18 trays x 4 GPUs at 900 GB/s per GPU, one {nic} per GPU "
        f"(~{nic_gb_per_s:.0f} GB/s) on a non-blocking fabric between racks.",
        "llama3.1-405b", _llama405b(global_batch_size), racks, gpu_type, nic_gb_per_s)


def gb200_nvl72_576() -> dict:
    return _llama405b_on_racks(8, "gb200", "ConnectX-7 400G NIC", CX7_GB_PER_S, 1152)


def gb300_nvl72_4608() -> dict:
    return _llama405b_on_racks(64, "gb300", "ConnectX-8 800G SuperNIC", CX8_GB_PER_S, 2304)


def mi300x_256() -> dict:
    """32 nodes of 8 MI300X (Infinity Fabric inside, 8 x 400G NICs per node), Llama-3 70B."""
    return {
        "name": "mi300x_256",
        "description": "Llama-3 70B, sequence 8192, global batch 512 sequences (4M tokens per step) on 32 nodes of "
                       "8 AMD MI300X: Infinity Fabric 448 GB/s per GPU inside a node (7 links of 64 GB/s), one "
                       "400G NIC per GPU (~48 GB/s) between nodes; Megatron-LM on ROCm.",
        "model": {"preset": "llama3-70b"},
        "training": _training(global_batch_size=512, seq_length=8192, recompute=["none", "selective", "full"],
                              zero_stage=[0, 1], max_micro_batch_size=2, context_parallel_sizes=[1, 2],
                              virtual_pipeline_sizes=[1, 2, 4, 5], software_stack="megatron"),
        "cluster": {
            "gpu_types": {"mi300x": {"preset": "mi300x"}},
            "nodes": {"count": 32, "prefix": "mi300x-", "gpu_type": "mi300x", "gpus": 8},
            "network": {"intra_node_gb_per_s": 448.0, "inter_node_gb_per_s": CX7_GB_PER_S,
                        "intra_node_latency_us": 5.0, "inter_node_latency_us": 15.0},
        },
    }


def h100_gb200_256() -> dict:
    """14 DGX H100 nodes beside 2 GB200 NVL72 racks (256 GPUs), one fabric: the case of a team that adds racks to its
    Hopper pod (Tangram's mixed cluster, with today's parts). The pods meet at a spine of ~24 GB/s per NIC."""
    h100 = [f"h100-{i:02d}" for i in range(14)]
    trays = [f"tray{i:02d}" for i in range(36)]
    names = h100 + trays
    nic = {n: 48.0 for n in names}
    pod = {n: ("h100" if n in h100 else "gb200") for n in names}
    matrix = [[0.0 if a == b else (min(nic[a], nic[b]) if pod[a] == pod[b] else 24.0) for b in names] for a in names]
    return {
        "name": "h100_gb200_256",
        "description": "Llama-3 70B, sequence 8192, global batch 512 sequences on a mixed cluster: 14 DGX H100 nodes "
                       "(NVLink 4, 450 GB/s; NDR 400G per GPU) and 2 GB200 NVL72 racks (NVLink 5 domains of 18 "
                       "trays x 4 GPUs, 900 GB/s; ConnectX-7 400G per GPU); the pods meet at a spine of ~24 GB/s "
                       "per NIC. Prices per GPU-hour: typical 2026 cloud list prices.",
        "model": {"preset": "llama3-70b"},
        "training": _training(global_batch_size=512, seq_length=8192, recompute=["none", "selective", "full"],
                              zero_stage=[1], max_micro_batch_size=1, context_parallel_sizes=[1],
                              virtual_pipeline_sizes=[1, 2]),
        "cluster": {
            "gpu_types": {"gb200": {"preset": "gb200", "price_per_hour": 6.0},
                          "h100-sxm-80gb": {"preset": "h100-sxm-80gb", "price_per_hour": 2.5}},
            "nodes": [{"name": n, "gpu_type": "h100-sxm-80gb", "gpus": 8} for n in h100]
                     + [{"name": t, "gpu_type": "gb200", "gpus": 4} for t in trays],
            "nvlink_domains": [{"name": f"rack{r}", "nodes": trays[18 * r:18 * (r + 1)],
                                "gb_per_s": NVLINK5_GB_PER_S} for r in range(2)],
            "network": {"intra_node_gb_per_s": 450.0, "inter_node_gb_per_s": 48.0,
                        "intra_node_latency_us": 5.0, "inter_node_latency_us": 15.0,
                        "nodes": [{"node": t, "intra_node_gb_per_s": NVLINK5_GB_PER_S} for t in trays],
                        "node_matrix_gb_per_s": matrix},
        },
    }


BUILDERS = {"gb200_nvl72_576": gb200_nvl72_576, "gb300_nvl72_4608": gb300_nvl72_4608, "mi300x_256": mi300x_256,
            "h100_gb200_256": h100_gb200_256}
