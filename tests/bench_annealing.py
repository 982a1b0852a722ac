"""The annealer's speed: seconds per scored move against one evaluate() of a placement (the incremental scorer's
point), printed: `python tests/bench_annealing.py`. A benchmark, not a test: its figures depend on the load."""

from __future__ import annotations

import time

import numpy as np

from conftest import H100_128, build_instance
from formulation import evaluate, load_instance
from formulation.space import Config
from solvers.local.annealing import anneal, start_scorer
from solvers.local.moves import Moves
from test_annealing import cluster_1024_dict


def per_move_cost(instance, config: Config, moves: int = 2000, evals: int = 5) -> tuple[float, float]:
    """(seconds per scored move on a random walk accepting 30% of proposals, seconds per evaluate() of a
    placement of that walk, cold: any cluster-level memo of group links is emptied first)."""
    sc = start_scorer(instance, config)
    gen, rng = Moves(sc, np.random.default_rng(0)), np.random.default_rng(1)
    done, start, seen = 0, time.perf_counter(), []
    while done < moves:
        out = gen.propose()
        if out is None:
            continue
        done += 1
        if out[1] is not None and rng.random() < 0.3:
            gen.commit(*out)
        else:
            sc.reject()
        if done % (moves // evals) == 0:
            seen.append((sc.placement(), sc.total))
    per_move = (time.perf_counter() - start) / moves
    memo = getattr(instance.cluster, "_links_cache", None)
    if isinstance(memo, dict):
        memo.clear()
    start = time.perf_counter()
    for placement, total in seen:
        assert evaluate(instance, placement, check=False).iteration_time_s == total
    return per_move, (time.perf_counter() - start) / len(seen)


if __name__ == "__main__":
    for name, inst in (("h100_128", load_instance(H100_128)), ("1024 GPUs", build_instance(cluster_1024_dict()))):
        n = inst.cluster.num_gpus
        for tp, pp, cp, vpp, rc in ((8, 4, 1, 1, "selective"), (4, 4, 2, 5, "none"), (2, 8, 1, 1, "full"),
                                    (8, 8, 1, 1, "none")):
            config = Config(tp, pp, cp, n // (tp * pp * cp), vpp, 1, rc, 1)
            move, full = per_move_cost(inst, config)
            result = anneal(inst, config, seed=0, max_moves=5000)
            run = (result.wall_time_s - 0) / max(result.moves, 1)
            print(f"{name:9s} {config.describe():62s} move {move * 1e6:5.0f} us (anneal {run * 1e6:5.0f} us), "
                  f"evaluate {full * 1e3:6.2f} ms: x{full / move:4.0f} (x{full / run:4.0f})")
