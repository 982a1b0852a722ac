"""The collective model against published nccl-tests points (formulation/data/nccl_tests_published.json), by node
count and message size (seconds)."""

from __future__ import annotations

import json

from registry import figure

from formulation import instance_from_dict
from formulation.data import DATA_DIR
from formulation.physics import collectives, cost
from formulation.physics.cost import GroupLinks


def model_point(point: dict, nccl_algorithms: bool = True) -> tuple[float, float, str]:
    """(time us, bus bandwidth GB/s, NCCL's choice) the model gives one published all_reduce_perf point."""
    nodes, k = point["nodes"], point["gpus_per_node"]
    cluster = instance_from_dict({
        "name": "nccl-point", "model": {"preset": "llama3-8b"},
        "training": {"global_batch_size": 256, "seq_length": 4096},
        "cluster": {"gpu_types": {"g": {"preset": point["gpu"]}},
                    "nodes": {"count": nodes, "gpus": k, "gpu_type": "g"},
                    "network": {"intra_node_gb_per_s": point["intra_gb_per_s"],
                                "inter_node_gb_per_s": point["inter_gb_per_s"],
                                "inter_node_fabric": point["fabric"]}}}).cluster
    n = nodes * k
    links = GroupLinks(n, point["intra_gb_per_s"], point["inter_gb_per_s"] if nodes > 1 else float("inf"), nodes, k)
    saved = cost.PHYSICS_TERMS["nccl_algorithms"]
    cost.PHYSICS_TERMS["nccl_algorithms"] = nccl_algorithms
    try:
        t = cost.collective_time("all_reduce", point["size_bytes"], links, cluster)
    finally:
        cost.PHYSICS_TERMS["nccl_algorithms"] = saved
    factor = cost.COLLECTIVE_FACTOR["all_reduce"](n)
    algorithm, protocol = collectives.chosen_option("all_reduce", point["size_bytes"], links, cluster, factor,
                                                    cost.collective_efficiency(cluster))
    return t * 1e6, factor * point["size_bytes"] / t / 1e9, f"{algorithm} {protocol}"


def _size(b: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if b >= scale:
            return f"{b / scale:g} {unit}"
    return f"{b} B"


@figure("nccl-published-points", doc="docs/collectives.md",
        command="python docs/figures/render.py nccl-published-points")
def nccl_points_table() -> str:
    points = json.loads((DATA_DIR / "nccl_tests_published.json").read_text())["points"]
    lines = ["| source | system | fabric | nodes | size | published | model (NCCL's choice) | error | one-ring model |",
             "|---|---|---|---|---|---|---|---|---|"]
    for p in points:
        t, bw, choice = model_point(p)
        t_old, bw_old, _ = model_point(p, nccl_algorithms=False)
        if "time_us" in p:
            published, model, old, err = f"{p['time_us']:g} us", f"{t:.1f} us", f"{t_old:.0f} us", t / p["time_us"] - 1
        else:
            published, model, old = (f"{p['busbw_gb_per_s']:g} GB/s", f"{bw:.1f} GB/s", f"{bw_old:.1f} GB/s")
            err = bw / p["busbw_gb_per_s"] - 1
        lines.append(f"| {p['source']} | {p['system']} | {p['fabric']} | {p['nodes']} | {_size(p['size_bytes'])} | "
                     f"{published} | {model} ({choice}) | {100 * err:+.1f} % | {old} |")
    return "\n".join(lines)
