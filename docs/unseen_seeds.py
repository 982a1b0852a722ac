"""`solve` against brute force on seeds of the tests' instance generators that the tests never use: agreement, and
how long each backend takes (docs/programs.md, the `auto` backend's table).

    python docs/unseen_seeds.py exact 1000 1127 cpsat cbc auto     # tests/test_exact.py's generator
    python docs/unseen_seeds.py oneway 100 140 cpsat cbc auto      # tests/test_oneway_uneven.py's (bounds too)

Each seed: the brute-force minimum over every configuration, partition and map, then `solve` with each backend
named (a time limit of 60 s, one-way 120 s). A line per run (status, plan, brute force, bound, wall time);
MISMATCH where a plan claimed optimal is not the minimum, a plan beats it, or a bound exceeds it. Then per backend
the sum and maximum of the wall times and how many searches ended without a proof. About 15 minutes per 40 seeds
and backend on 2 cores, most of it brute force.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from formulation import instance_from_dict  # noqa: E402
from formulation.errors import InfeasibleError  # noqa: E402
from solvers import solve  # noqa: E402


def cases(family: str, seed: int):
    """(instance, brute-force minimum, time limit) of one seed; one-way seeds also check the bounds."""
    if family == "exact":
        from test_exact import brute_force, small_instance
        data, node_level = small_instance(seed)
        instance = instance_from_dict(data)
        return instance, brute_force(instance, data, node_level), 60.0
    from test_oneway_uneven import bounds_below_brute_force, optima
    instance, best = optima(seed, False)
    bounds_below_brute_force(instance, best)  # raises if a bound exceeds its configuration's minimum
    return instance, min(best.values()), 120.0


def main(family: str, first: int, last: int, names: list[str]) -> int:
    walls: dict = {name: [] for name in names}
    unproven = dict.fromkeys(names, 0)
    mismatches = 0
    for seed in range(first, last):
        instance, expected, limit = cases(family, seed)
        for name in names:
            started = time.perf_counter()
            try:
                result = solve(instance, solver=name, time_limit=limit)
                got, status, bound = result.estimate.iteration_time_s, result.solver.status, result.solver.bound_s
            except InfeasibleError:
                got, status, bound = math.inf, "infeasible", math.inf
            wall = time.perf_counter() - started
            walls[name].append(wall)
            unproven[name] += status not in ("optimal", "infeasible")
            if expected == math.inf:
                ok = got == math.inf
            else:
                ok = (got >= expected * (1 - 1e-9) and bound <= expected * (1 + 1e-9)
                      and (status != "optimal" or got <= expected * (1 + 1e-6)))
            mismatches += not ok
            print(f"{seed} {name} {'OK' if ok else 'MISMATCH'} {status} plan {got:.9g} brute force {expected:.9g} "
                  f"bound {bound:.9g} {wall:.1f} s", flush=True)
    for name in names:
        print(f"{name}: {len(walls[name])} searches, sum {sum(walls[name]):.0f} s, slowest {max(walls[name]):.1f} s, "
              f"{unproven[name]} without a proof")
    print(f"{mismatches} mismatches")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:] or ["auto"]))
