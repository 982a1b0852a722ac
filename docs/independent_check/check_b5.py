"""The (B5) bound against an independent brute force on random tiny clusters (docs/mixed-gpu-types.md).

    python docs/independent_check/check_b5.py [SEEDS_PER_KIND]    # default 26: about the 208 of 2026-11-27

instances.py draws the clusters (two or three GPU types, uneven nodes, one-way node matrices, slow links, MoE,
zero 3 with cp and vpp); brute_force.py enumerates every configuration of every world size, every layer split
and every GPU map using only the instance loader and the evaluator. Both were written apart from the planner
(an independent review, 2026-11-27). Prints, per instance, B5 over the brute-force minimum among placements
whose tp fits the smallest node (the planner's space), and fails if any B5 exceeds it."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from brute_force import brute  # noqa: E402
from instances import KINDS, make  # noqa: E402

from formulation.inputs.instance import instance_from_dict  # noqa: E402
from solvers.bounds.every_placement import every_placement_bound  # noqa: E402


def main(seeds: int) -> int:
    ratios, bad = [], 0
    for kind in KINDS:
        for seed in range(seeds):
            instance = instance_from_dict(make(kind, seed), f"{kind}{seed}", Path(tempfile.gettempdir()))
            found, _ = brute(instance, worlds=list(range(1, instance.cluster.num_gpus + 1)))
            if "tooltp" not in found:
                continue  # nothing fits with tp inside the smallest node
            bound = every_placement_bound(instance, lambda config, time_s: time_s, float("inf"))
            ratios.append(bound / found["tooltp"][0])
            bad += ratios[-1] > 1 + 1e-9
            print(f"{kind}{seed}: B5 {bound:.6f} s, minimum {found['tooltp'][0]:.6f} s, ratio {ratios[-1]:.4f}")
    ratios.sort()
    print(f"{len(ratios)} instances, {bad} with B5 above the minimum; median ratio {ratios[len(ratios) // 2]:.4f}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 26))
