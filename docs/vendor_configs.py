"""The planner against the configurations the vendors published: for each published run of NVIDIA's tuned
Megatron-stack sources, plan the same model, job and cluster and compare the planner's configuration with the one
the vendor ran.

    python docs/vendor_configs.py                  # about 10 minutes on 2 cores (10 s per run)
    python docs/vendor_configs.py --time-limit 30  # a longer search per run
    python docs/vendor_configs.py --family "NVIDIA DGX Cloud benchmarking"

Only the vendor's configuration was measured, so this does not say which plan is faster. It says how far the
planner departs from what the people who tuned these runs chose, by how much it expects to gain, and whether that
gain is larger than its own prediction interval (the intervals overlap: a tie, as the planner reports it). The
job keeps the run's model, batch, sequence, precision, stack and flags; the planner may choose tp, pp, dp, cp (1, 2,
4 or the published size), vpp (1-12 or the published one), micro-batch (up to 4 or the published one) and
recompute, under its default memory limit (memory_limit_fraction 0.8; the published runs used up to all of it).
Times are the evaluator's with the packaged calibration (fitted on every source): what a user gets.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics

from formulation.evaluate import evaluate
from solvers.strategy import solve
from solvers.validation.crossval import reference_runs, source_family

VENDOR_FAMILIES = ("NVIDIA DGX Cloud benchmarking", "NeMo performance summary", "NeMo long-sequence performance",
                   "Megatron-LM Llama examples", "Megatron-LM README 2024")
PARTS = ("compute_s", "bubble_s", "tp_comm_s", "cp_comm_s", "pp_comm_s", "dp_comm_s")


def planning_instance(run):
    """The run's instance with the planner's choices opened around the published configuration."""
    p, job = run.placement, run.instance.training
    wide = dataclasses.replace(job, recompute=("none", "selective", "full"),
                               max_micro_batch_size=max(4, p.micro_batch_size),
                               context_parallel_sizes=tuple(sorted({1, 2, 4, p.cp})),
                               virtual_pipeline_sizes=tuple(sorted({1, 2, 3, 4, 5, 6, 8, 10, 12, p.vpp})),
                               memory_limit_fraction=0.8)
    return dataclasses.replace(run.instance, training=wide)


def largest_saving(published, planned) -> str:
    """The part of the iteration (evaluator's breakdown) the planner's configuration shortens most."""
    pub, plan = published.breakdown, planned.breakdown
    part = max(PARTS, key=lambda k: pub[k] - plan[k])
    return f"{part[:-2]} -{pub[part] - plan[part]:.2f} s"


def compare(run, time_limit: float) -> dict:
    instance = planning_instance(run)
    published = evaluate(instance, run.placement, check=False)
    plan = solve(instance, time_limit=time_limit, method="bound-only", seed=0)
    planned = plan.estimate
    lo_pub, _ = published.iteration_time_interval_s
    _, hi_plan = planned.iteration_time_interval_s
    return {"row": run.row, "model": run.name, "gpus": instance.cluster.num_gpus,
            "precision": instance.training.precision, "published": run.placement.describe(),
            "measured_s": run.measured_iter_s, "published_s": published.iteration_time_s,
            "published_fits": published.fits, "planned": plan.placement.describe(), "planned_s": planned.iteration_time_s,
            "same": run.placement.config_key() == plan.placement.config_key(),
            "gain": published.iteration_time_s / planned.iteration_time_s - 1, "tie": hi_plan >= lo_pub,
            "saving": largest_saving(published, planned)}


def print_table(results: list[dict]) -> None:
    print("| row | model | GPUs | prec | published | measured | predicted | planner's | predicted | gain | tie | "
          "largest saving |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        fits = "" if r["published_fits"] else " (over the limit)"
        print(f"| {r['row']} | {r['model']} | {r['gpus']} | {r['precision']} | {r['published']}{fits} | "
              f"{r['measured_s']:.3f} s | {r['published_s']:.3f} s | {'same' if r['same'] else r['planned']} | "
              f"{r['planned_s']:.3f} s | {100 * r['gain']:+.1f}% | {'yes' if r['tie'] else 'no'} | {r['saving']} |")
    gains = [r["gain"] for r in results]
    print(f"\n{len(results)} runs: the planner chose the published sizes for {sum(r['same'] for r in results)}; "
          f"median predicted gain {100 * statistics.median(gains):+.1f}%, {sum(g > 0.05 for g in gains)} above 5%; "
          f"{sum(not r['tie'] for r in results)} outside the interval (not a tie); "
          f"{sum(not r['published_fits'] for r in results)} published configurations over the default memory limit.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=10.0, help="seconds of search per run")
    parser.add_argument("--family", action="append", help="source families (default: NVIDIA's tuned sources)")
    args = parser.parse_args()
    families = tuple(args.family or VENDOR_FAMILIES)
    runs = [r for r in reference_runs() if r.measured_iter_s and not r.skipped_reason
            and source_family(r.source) in families]
    results = []
    for i, run in enumerate(runs, 1):
        results.append(compare(run, args.time_limit))
        print(f"\r{i}/{len(runs)} runs planned", end="", flush=True)
    print()
    print_table(results)


if __name__ == "__main__":
    main()
