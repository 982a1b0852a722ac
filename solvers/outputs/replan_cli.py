"""`solve replan`: the best plan on the GPUs that survive a failure, against the old plan (docs/replan.md).

    solve replan --instance X.json --plan plan.json --failed node-a,node-b:3 [--time-limit S] [--output NEW.json]
    solve replan --precompute --instance X.json --plan plan.json --out DIR [--time-limit S]

--precompute answers every single-node failure: one plan file per node and index.json. Nodes that the cluster
cannot tell apart (Cluster.interchangeable_nodes: same GPUs, same links to every other node) get the answer of
the first of their class with the two nodes' GPUs swapped, scored again by the evaluator; their ranks moved are
counted against the old plan for that node."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

from formulation import InfeasibleError, InputError, evaluate, load_instance
from formulation.inputs.failures import Survivors, parse_failed
from formulation.placement_file import load_placement
from formulation.shards import ranks_moved
from solvers import backends
from solvers.outputs.arguments import (EXIT_BAD_INPUT, EXIT_OK, OneLineParser, fail, planning_failure, seconds, seed,
                                       write_plan_file)
from solvers.outputs.files import write_json_atomic
from solvers.result import PlanResult, SolverReport
from solvers.search.driver import NoPlanInTime
from solvers.search.replan import MOVE_TOLERANCE, fewest_moves, replan
from solvers.search.replan_warm import warm_starts


def _parser() -> OneLineParser:
    parser = OneLineParser(prog="solve replan", description="The best plan on the GPUs that survive a failure, "
                           "warm-started from the old plan; the global batch is kept (docs/replan.md)")
    parser.add_argument("--instance", required=True, help="the instance the old plan was made for")
    parser.add_argument("--plan", required=True, help="the old plan file (solve --output) or a placement file")
    parser.add_argument("--failed", help="failed nodes and GPUs: node-a,node-b:3 (a whole node or tray, or GPU 3 of "
                                         "node-b)")
    parser.add_argument("--keep-global-batch", action="store_true", default=True,
                        help="keep training.global_batch_size (always: the default and the only mode; to change "
                             "the batch, edit the instance and re-plan)")
    parser.add_argument("--time-limit", type=seconds, default=None, metavar="S", help="wall-clock limit in seconds "
                        "(per failure with --precompute)")
    parser.add_argument("--move-tolerance", type=fraction, default=MOVE_TOLERANCE, metavar="F",
                        help=f"prefer the old configuration on spares (or with a smaller dp) when it is at most this "
                             f"fraction slower than the best plan and moves fewer ranks (default {MOVE_TOLERANCE:g})")
    parser.add_argument("--seed", type=seed, default=0, help="random seed (deterministic per seed without a limit)")
    parser.add_argument("--output", metavar="NEW.json", help="write the new plan file")
    parser.add_argument("--json", action="store_true", help="print the new plan file's JSON")
    parser.add_argument("--precompute", action="store_true", help="answer every single-node failure into --out")
    parser.add_argument("--out", metavar="DIR", help="with --precompute: the directory of the table")
    parser.add_argument("--quiet", action="store_true", help="no progress output")
    return parser


def fraction(text: str) -> float:
    """A finite number >= 0 (argparse type)."""
    value = float(text)
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a non-negative fraction, got {text!r}")
    return value


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if args.precompute and not args.out:
        return fail(EXIT_BAD_INPUT, "--out: expected the table's directory with --precompute")
    if not args.precompute and not args.failed:
        return fail(EXIT_BAD_INPUT, "--failed: expected the failed nodes and GPUs (node-a,node-b:3)")
    if args.out and Path(args.out).exists() and not Path(args.out).is_dir():
        return fail(EXIT_BAD_INPUT, f"--out: {args.out} exists and is not a directory")
    if args.output and Path(args.output).is_dir():
        return fail(EXIT_BAD_INPUT, f"--output: {args.output} is a directory; expected the plan file's path")
    try:
        instance = load_instance(args.instance)
        old = load_placement(args.plan, instance)
        if args.precompute:
            _one_gpu_type(instance, (), "--precompute", "every node")
            return _precompute(instance, old, args)
        failed = parse_failed(args.failed, instance.cluster)
        _one_gpu_type(instance, failed, "--failed", args.failed)
        found = replan(instance, old, failed, time_limit_s=args.time_limit, seed=args.seed,
                       solver=_partition_backend(), move_tolerance=args.move_tolerance)
    except (InputError, InfeasibleError, NoPlanInTime) as exc:
        return planning_failure(exc)
    plan = replan_document(instance, found, args.seed, old)
    if args.output and (code := write_plan_file(args.output, plan)) is not None:
        return code
    print(json.dumps(plan, indent=2) if args.json else summary(instance, found))
    return EXIT_OK


def _one_gpu_type(instance, failed, flag: str, flag_value: str) -> None:
    """The re-plan's bounds are those of one GPU type's search (several types compose islands: docs/mixed-gpu-types.md)."""
    dead = set(failed)
    cluster = instance.cluster
    types = {cluster.nodes[cluster.gpu_node[g]].gpu_type for g in range(cluster.num_gpus) if g not in dead}
    if len(types) > 1:
        raise InputError(flag, flag_value, f"the survivors hold {len(types)} GPU types ({', '.join(sorted(types))}): "
                                                 "solve replan plans clusters of one GPU type; plan the survivors with "
                                                 "solve on an instance without the failed nodes")


def _partition_backend() -> str:
    """CP-SAT for the small programs (partition splits, exact programs), or the backend installed."""
    chosen = backends.automatic()
    return "cpsat" if chosen == backends.PORTFOLIO else chosen


def replan_document(instance, found, seed: int, old) -> dict:
    """The new plan file: a plan file (`solve --evaluate` reads it) with a `replan` section."""
    time_s = found.estimate.iteration_time_s
    report = SolverReport(method=f"replan: {found.method}", status=found.status, objective_s=time_s,
                          bound_s=found.bound_s, gap=max(0.0, found.gap), wall_time_s=found.wall_time_s, seed=seed,
                          note=f"{found.examined} {found.unit} examined of {found.candidates} (every world size up "
                               f"to the {found.survivors.num_gpus} survivors), {found.pruned} pruned by bound, "
                               f"{found.infeasible} do not fit" + (f"; stopped by the {found.stopped}"
                                                                    if found.stopped else ""))
    plan = PlanResult(placement=found.placement, estimate=found.estimate, solver=report).to_dict(instance.cluster)
    old_s = found.old_estimate.iteration_time_s
    cluster = instance.cluster
    plan["replan"] = {
        "failed": [cluster.gpu_name(g) for g in found.survivors.failed],
        "surviving_gpus": found.survivors.num_gpus,
        "gpus_used": found.placement.world_size,
        "old_iteration_time_s": old_s,
        "new_iteration_time_s": time_s,
        "slowdown": time_s / old_s,
        "ranks_moved": found.ranks_moved,
        "old_config_survives_on_spares": found.old_config_survives,
        "spares_iteration_time_s": found.spares_plan[1].iteration_time_s if found.spares_plan else None,
        "warm_starts": [{"kind": label, "configuration": p.describe(), "iteration_time_s": e.iteration_time_s,
                         "ranks_moved": ranks_moved(old, p, instance.model.num_layers)}
                        for label, p, e in found.warm],
        "global_batch_size": instance.training.global_batch_size,
    }
    return plan


def summary(instance, found) -> str:
    """What the terminal prints: the new plan against the old, its bound, the reshard."""
    old_s, new_s = found.old_estimate.iteration_time_s, found.estimate.iteration_time_s
    spares = (f"yes: the old configuration on spares takes {found.spares_plan[1].iteration_time_s:.4f} s"
              if found.spares_plan else "no: too few survivors for its world, or it does not fit")
    return "\n".join([
        f"failed: {len(found.survivors.failed)} GPUs; {found.survivors.num_gpus} survive, the plan uses "
        f"{found.placement.world_size}",
        f"new plan: {found.placement.summary()}",
        f"iteration time: {new_s:.4f} s (old plan {old_s:.4f} s, x{new_s / old_s:.3f}); bound {found.bound_s:.4f} s, "
        f"gap {100 * found.gap:.2f} %, status {found.status}, {found.wall_time_s:.2f} s ({found.method})",
        f"ranks that change their model shard: {found.ranks_moved} of {found.placement.world_size}",
        f"old configuration survives on spares: {spares}",
    ])


def _swap(cluster, a: int, b: int) -> dict[int, int]:
    """The GPU relabelling that exchanges nodes a and b (local index for local index)."""
    ga, gb = cluster.gpus_of_nodes([a]), cluster.gpus_of_nodes([b])
    return {**dict(zip(ga, gb)), **dict(zip(gb, ga))}


def _precompute(instance, old, args) -> int:
    """Every single-node failure: the first node of each interchangeable class searched, the others relabelled."""
    cluster, out = instance.cluster, Path(args.out)
    start = time.perf_counter()
    index, searched = {}, {}
    classes = cluster.interchangeable_nodes()
    first_of = {n: c[0] for c in classes for n in c}
    for k, node in enumerate(range(len(cluster.nodes))):
        name = cluster.nodes[node].name
        rep = first_of[node]
        try:
            if rep not in searched:
                searched[rep] = replan(instance, old, cluster.gpus_of_nodes([rep]), time_limit_s=args.time_limit,
                                       seed=args.seed, solver=_partition_backend(), move_tolerance=args.move_tolerance)
            found = searched[rep]
            if rep != node:
                found = _relabelled(instance, old, found, rep, node, args.move_tolerance)
        except (InfeasibleError, NoPlanInTime) as exc:
            index[name] = {"error": str(exc)}
            continue
        file = f"{name}.json"
        write_json_atomic(out / file, replan_document(instance, found, args.seed, old))
        index[name] = {"file": file, "iteration_time_s": found.estimate.iteration_time_s, "bound_s": found.bound_s,
                       "gap": found.gap, "ranks_moved": found.ranks_moved,
                       "answered_by": "search" if rep == node else f"relabelled from {cluster.nodes[rep].name}"}
        if not args.quiet:
            print(f"[{k + 1}/{len(cluster.nodes)}] {name}: {found.estimate.iteration_time_s:.4f} s, gap "
                  f"{100 * found.gap:.2f} % ({index[name]['answered_by']}), {time.perf_counter() - start:.1f} s",
                  file=sys.stderr)
    wall = time.perf_counter() - start
    write_json_atomic(out / "index.json", {"instance": args.instance, "plan": args.plan,
                                           "old_iteration_time_s": evaluate(instance, old).iteration_time_s,
                                           "searched": len(searched), "nodes": len(cluster.nodes),
                                           "wall_time_s": wall, "failures": index})
    print(f"{len(index)} single-node failures in {out} ({len(searched)} searched, the others relabelled within "
          f"their interchangeable class), {wall:.1f} s")
    return EXIT_OK


def _relabelled(instance, old, found, rep: int, node: int, tolerance: float):
    """`found` (the answer for node `rep` of the same class) with the two nodes exchanged (the same time: the
    exchange is an automorphism of the cluster), or the old plan's own warm start for `node` as `replan` chooses
    it; the warm starts and ranks moved are those of `node`'s failure."""
    swap = _swap(instance.cluster, rep, node)
    placement = dataclasses.replace(found.placement, gpus=tuple(swap.get(g, g) for g in found.placement.gpus))
    survivors = Survivors.of(instance, instance.cluster.gpus_of_nodes([node]))
    warm = warm_starts(instance, old, survivors)
    moved, _, chosen = fewest_moves(instance, old, placement, found.estimate.iteration_time_s, warm, tolerance)
    estimate = evaluate(instance, chosen)
    time_s = estimate.iteration_time_s
    spares = next(((p, e) for label, p, e in warm if label == "spares"), None)
    bound = min(found.bound_s, time_s)
    return dataclasses.replace(found, placement=chosen, estimate=estimate, survivors=survivors, warm=warm,
                               spares_plan=spares, bound_s=bound, gap=(time_s - bound) / time_s, ranks_moved=moved)
