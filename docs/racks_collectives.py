"""The model's NVL72 all-reduce and all-to-all (docs/racks.md): nccl-tests' bus bandwidth of the cost model's
collective time on gb200_nvl72_576's racks, beside the published CoreWeave nccl-tests rows it is compared with.

Run from the repository root: PYTHONPATH=. python docs/racks_collectives.py
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from formulation import instance_from_dict
from formulation.physics import cost, moe_cost

ROOT = Path(__file__).resolve().parents[1]
GIB = 2 ** 30
# all_reduce_perf out-of-place busbw (GB/s): one GB200 NVL72 rack (github.com/coreweave/nccl-tests/pull/43) and
# 20 racks (github.com/coreweave/nccl-tests/pull/48), by message size in bytes
MEASURED = {72: {GIB // 2: 586.06, GIB: 681.17, 2 * GIB: 757.78, 4 * GIB: 839.16, 8 * GIB: 834.57},
            1440: {GIB // 2: 150.95, GIB: 218.85, 2 * GIB: 286.52, 4 * GIB: 346.38}}
# NVIDIA/nccl issue 1801: 4 and 8 GPUs on each of 3 GB200 racks (InfiniBand between them), ring, 16 GiB
PER_RACK_MEASURED = {4: 196.72, 8: 393.66}


def racks(count: int):
    """gb200_nvl72_576's cluster with `count` racks."""
    data = json.loads((ROOT / "instances" / "gb200_nvl72_576.json").read_text())
    data["cluster"]["nodes"]["count"] = 18 * count
    return instance_from_dict(data).cluster


def busbw(cluster, gpus, size: float) -> tuple[float, float]:
    """(all-reduce, all-to-all) bus bandwidth in GB/s of the model for a group of `gpus` and `size` bytes."""
    links = cost.group_links(cluster, np.asarray(list(gpus)))
    n = links.size
    all_reduce = size / cost.collective_time("all_reduce", size, links, cluster) * 2 * (n - 1) / n / 1e9
    all_to_all = size * (n - 1) / n / moe_cost.all_to_all_time(size, links, cluster) / 1e9
    return all_reduce, all_to_all


def main() -> None:
    cluster = racks(8)
    print("group                      all-reduce busbw  all-to-all busbw  (1 GiB, GB/s)")
    for name, gpus in [("one tray (4)", range(4)), ("two trays of a rack (8)", range(8)), ("a rack (72)", range(72)),
                       ("two racks (144)", range(144)), ("one GPU on each of 8 racks", range(0, 576, 72))]:
        ar, a2a = busbw(cluster, gpus, GIB)
        print(f"{name:26s} {ar:16.1f} {a2a:17.1f}")
    big = racks(20)
    print("\nranks  size GiB  measured  model  model/measured")
    for ranks, rows in MEASURED.items():
        for size, measured in rows.items():
            model = busbw(big, range(ranks), size)[0]
            print(f"{ranks:5d} {size / GIB:9.2f} {measured:9.1f} {model:6.1f} {model / measured:6.2f}")
    three = racks(3)
    print("\nper rack (3 racks)  size GiB  measured  model  model/measured")
    for per_rack, measured in PER_RACK_MEASURED.items():
        model = busbw(three, [72 * r + i for r in range(3) for i in range(per_rack)], 16 * GIB)[0]
        print(f"{per_rack:18d} {16:9.2f} {measured:9.1f} {model:6.1f} {model / measured:6.2f}")


if __name__ == "__main__":
    main()
