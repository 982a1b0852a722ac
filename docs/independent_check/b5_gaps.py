"""The gap of (B5) to the brute-force minimum on 110 random mixed clusters (docs/mixed-gpu-types.md).

    python docs/independent_check/b5_gaps.py [ROOT]    # ROOT: a checkout whose B5 to measure (default: this one)

The clusters: instances.py's mixed kinds (mixed, mixed_tight, moe_mixed; 26 seeds each) and the 32 of
tests/test_mixed_brute_force.py; the minimum: brute_force.py over placements whose tp fits the smallest node.
To compare two versions of the bound, export a commit (`git archive COMMIT | tar -x -C DIR`) and pass DIR."""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else HERE.parents[1]
sys.path[:0] = [str(ROOT), str(HERE), str(HERE.parents[1] / "tests")]

from brute_force import brute  # noqa: E402
from instances import make  # noqa: E402
from test_mixed_brute_force import cluster_dict  # noqa: E402

from formulation.inputs.instance import instance_from_dict  # noqa: E402
from solvers.bounds.every_placement import every_placement_bound  # noqa: E402


def clusters():
    for kind in ("mixed", "mixed_tight", "moe_mixed"):
        for seed in range(26):
            yield f"{kind}{seed}", make(kind, seed)
    for seed in range(32):
        yield f"mixed_bf{seed}", cluster_dict(seed)


def main() -> int:
    gaps, above = [], 0
    for name, data in clusters():
        instance = instance_from_dict(data, name, Path(tempfile.gettempdir()))
        found, _ = brute(instance, worlds=list(range(1, instance.cluster.num_gpus + 1)))
        if "tooltp" not in found:
            continue
        minimum = found["tooltp"][0]
        bound = every_placement_bound(instance, lambda config, time_s: time_s, float("inf"))
        gaps.append((minimum - bound) / minimum)
        above += bound > minimum * (1 + 1e-9)
        print(f"{name}: B5 {bound:.6f} s, minimum {minimum:.6f} s, gap {100 * gaps[-1]:.2f} %", flush=True)
    gaps.sort()
    print(f"{len(gaps)} clusters, {above} with B5 above the minimum; gap median {100 * statistics.median(gaps):.2f} %, "
          f"mean {100 * statistics.mean(gaps):.2f} %, 90th percentile {100 * gaps[int(0.9 * len(gaps))]:.2f} %, "
          f"met on {sum(g < 1e-6 for g in gaps)}")
    return 1 if above else 0


if __name__ == "__main__":
    sys.exit(main())
