"""The `solve` command.

    solve --instance instances/h100_128.json [--output plan.json] [--top K] [--output-dir DIR] [--plot]
    solve --instance X --evaluate placement.json [--json] [--output-dir DIR] [--plot]
    solve validate [--runs FILE.csv] [--json]        (predicted vs measured, reference runs by default)
    solve calibrate [--write]                        (fit efficiency parameters on the calibration split)

Exit codes: 0 a plan (or estimate) was produced (also when --time-limit or Ctrl-C stopped the search early:
the best plan so far, status "timeout", the bound proven so far); 1 no feasible plan (the reason names the
smallest shortfall) or no plan at all within --time-limit; 2 bad input (one line naming file, field and
expectation); 3 internal error; 130 interrupted before any plan existed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

EXIT_OK, EXIT_INFEASIBLE, EXIT_BAD_INPUT = 0, 1, 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="solve", description="Plan LLM training on a GPU cluster: parallel sizes, layer partition and "
                                  "GPU-to-rank map that make an iteration fastest without running out of memory.",
        epilog="Subcommands: 'solve validate --help', 'solve calibrate --help', 'solve bench --help'. Exit codes: "
               "0 plan found, 1 no feasible plan, 2 bad input.")
    parser.add_argument("--instance", required=True, help="instance file (JSON or YAML): model, training, cluster")
    parser.add_argument("--evaluate", metavar="PLACEMENT", help="score this placement (JSON; a plan file works too)")
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON instead of tables")
    parser.add_argument("--output", metavar="PLAN.json", help="write the plan (placement, estimate, solver report)")
    parser.add_argument("--output-dir", metavar="DIR", help="write plan.json, Megatron-LM arguments, torchrun and Slurm "
                                                            "launch scripts, torchtitan.toml, pictures and README.txt")
    parser.add_argument("--plot", action="store_true", help="draw schedule.png, memory.png and cluster.png (into "
                                                            "--output-dir, else next to --output, else here)")
    parser.add_argument("--solver", default="auto", choices=["auto", "cbc", "cpsat", "anneal", "baseline"],
                        help="auto: CP-SAT (CBC without OR-Tools); cbc / cpsat: that backend. Either way the exact "
                             "program where the cluster is small enough to prove (ranks x GPU classes <= 256), else "
                             "the bound-only search (default GPU maps, partitions solved exactly, proven global lower "
                             "bound, then annealed placements for the best configurations), and the report says "
                             "which; anneal: simulated annealing of the best default placements with the proven "
                             "global lower bound; baseline: Megatron-style defaults only, no bound")
    parser.add_argument("--objective", default="time", choices=["time", "cost", "gpus"],
                        help="time: fastest iteration (default); cost: least GPU price per trained token (per-type "
                             "price_per_hour in the instance); gpus: fewest GPUs reaching --required-tokens-per-s. "
                             "Clusters of several GPU types, and cost / gpus, use the island composition search")
    parser.add_argument("--required-tokens-per-s", type=float, default=None, metavar="TOK",
                        help="throughput the plan must reach (with --objective gpus)")
    parser.add_argument("--time-limit", type=float, default=None, metavar="S", help="wall-clock limit in seconds")
    parser.add_argument("--threads", type=int, default=1, help="solver threads")
    parser.add_argument("--seed", type=int, default=0, help="random seed (results are deterministic per seed)")
    parser.add_argument("--top", type=int, default=1, metavar="K", help="also report the K best configurations")
    parser.add_argument("--quiet", action="store_true", help="no progress output")
    parser.add_argument("--calibration", metavar="CAL.json", help="apply a few-shot calibration written by "
                                                                 "'solve calibrate --output' (compute, network, overhead)")
    return parser


def _fail(code: int, message: str) -> int:
    print(message.replace("\n", " "), file=sys.stderr)
    return code


def run(argv: list[str]) -> int:
    from rich.console import Console

    from formulation import InfeasibleError, InputError, evaluate, load_instance
    from formulation.placement import load_placement

    from . import solve, write_json_atomic
    from .search import NoPlanInTime
    from .report import estimate_tables, gpu_grid_table, print_tables

    if argv and argv[0] in ("validate", "calibrate"):
        from . import validate
        return validate.main(argv[0], argv[1:])
    if argv and argv[0] == "bench":
        from . import bench
        return bench.main(argv[1:])
    args = _parser().parse_args(argv)
    if args.top < 1:
        return _fail(EXIT_BAD_INPUT, f"--top: expected a positive integer, got {args.top}")
    if args.objective == "gpus" and not (args.required_tokens_per_s and args.required_tokens_per_s > 0):
        return _fail(EXIT_BAD_INPUT, "--required-tokens-per-s: expected a positive throughput with --objective gpus")
    if args.objective != "time" and args.solver in ("anneal", "baseline"):
        return _fail(EXIT_BAD_INPUT, f"--objective {args.objective}: needs --solver auto, cbc or cpsat, "
                                     f"not {args.solver}")
    if args.time_limit is not None and args.time_limit <= 0:
        return _fail(EXIT_BAD_INPUT, f"--time-limit: expected a positive number of seconds, got {args.time_limit}")
    try:
        instance = load_instance(args.instance)
        if args.calibration:
            from .user_calibration import apply_calibration, load_calibration
            instance = apply_calibration(instance, load_calibration(args.calibration))
        # Tables need room: a pipe or file gets 160 columns instead of rich's 80-column fallback.
        console = Console(stderr=args.json, width=None if sys.stdout.isatty() else 160)
        if args.evaluate:
            placement = load_placement(args.evaluate, instance)
            estimate = evaluate(instance, placement)
            if args.json:
                print(json.dumps({"placement": placement.to_dict(instance.cluster), "estimate": estimate.to_dict()},
                                 indent=2))
            else:
                print_tables(estimate_tables(instance, placement, estimate) + [gpu_grid_table(instance, placement)],
                             console)
            return _write_outputs(args, instance, _Evaluated(placement, estimate), console)
        result = _solve_with_progress(instance, args, solve)
    except InputError as exc:
        return _fail(EXIT_BAD_INPUT, f"error: {exc}")
    except InfeasibleError as exc:
        return _fail(EXIT_INFEASIBLE, f"infeasible: {exc}")
    except NoPlanInTime as exc:
        return _fail(EXIT_INFEASIBLE, f"timeout: {exc}")
    plan = result.to_dict(instance.cluster)
    if args.output:
        write_json_atomic(args.output, plan)
    if args.json:
        print(json.dumps(plan, indent=2))
        return _write_outputs(args, instance, result, console)
    print_tables(estimate_tables(instance, result.placement, result.estimate)
                 + [gpu_grid_table(instance, result.placement)], console)
    s = result.solver
    console.print(f"solver: {s.method}, status {s.status}, objective {s.objective_s:.4f} s, "
                  f"bound {'n/a' if s.bound_s is None else f'{s.bound_s:.4f} s'}, "
                  f"gap {'n/a' if s.gap is None else f'{100 * s.gap:.2f} %'}, wall time {s.wall_time_s:.2f} s, "
                  f"seed {s.seed}")
    if s.note:
        console.print(f"  ({s.note})")
    if s.objective != "time":
        from .islands_plan import UNITS
        console.print(f"objective {s.objective}: {s.objective_value:.6g} {UNITS[s.objective]} "
                      f"(bound {s.bound_value:.6g})")
    if s.islands:
        from .report import islands_table
        print_tables([islands_table(s.islands)], console)
    _print_default_comparison(instance, result, console)
    for rank, (p, e) in enumerate(result.alternatives, start=2):
        console.print(f"#{rank}: {e.iteration_time_s:.4f} s  tp={p.tp} pp={p.pp} cp={p.cp} dp={p.dp} vpp={p.vpp} "
                      f"mbs={p.micro_batch_size} recompute={p.recompute} zero={p.zero_stage}")
    if args.output:
        console.print(f"plan written to {args.output}")
    return _write_outputs(args, instance, result, console)


def _print_default_comparison(instance, result, console) -> None:
    """The plan against the fastest Megatron-style default placement, and the share of the gain that the
    GPU assignment alone brings (the plan's configuration and partition with ranks filled node by node)."""
    if not result.default:
        return
    import dataclasses

    from formulation import evaluate

    default_s = result.default[1].iteration_time_s
    plan_s = result.estimate.iteration_time_s
    filled = dataclasses.replace(result.placement, gpus=tuple(range(result.placement.world_size)))
    filled_s = evaluate(instance, filled, check=False).iteration_time_s
    gain = default_s - plan_s
    share = f"; the GPU assignment alone brings {100 * (filled_s - plan_s) / gain:.0f} % of it" if gain > 0 else ""
    if result.solver.islands:  # mixed types: the map and the split go together (stages sit on islands)
        share = "; stages composed on islands of identical GPUs, layers sized by each type's speed and memory"
    console.print(f"Megatron-style default (best over configurations): {default_s:.4f} s; this plan "
                  f"{plan_s:.4f} s, {default_s / plan_s:.3f}x{share}")


class _Evaluated:
    """A scored placement in the shape `export_plan` takes (placement, estimate, to_dict) when no solver ran."""

    def __init__(self, placement, estimate):
        self.placement, self.estimate = placement, estimate

    def to_dict(self, cluster) -> dict:
        return {"placement": self.placement.to_dict(cluster), "estimate": self.estimate.to_dict()}


def _write_outputs(args, instance, plan, console) -> int:
    """--output-dir (launch files and pictures) and --plot; the paths go to the console (stderr with --json)."""
    if not (args.output_dir or args.plot):
        return EXIT_OK
    from pathlib import Path

    target = args.output_dir or (str(Path(args.output).parent) if args.output else ".")
    try:
        if args.output_dir:
            from .export import export_plan
            written = export_plan(instance, plan, args.output_dir, pictures=True)
        else:
            from .plots import write_pictures
            written = write_pictures(instance, plan.placement, plan.estimate, target)
    except OSError as exc:
        return _fail(EXIT_BAD_INPUT, f"error: {target}: cannot write: {exc.strerror or exc}")
    for path in written.values():
        console.print(f"wrote {path}", highlight=False, soft_wrap=True)
    return EXIT_OK


def _solve_with_progress(instance, args, solve):
    """Run the search, with a progress bar on an interactive terminal unless --quiet."""
    kwargs = dict(solver=args.solver, time_limit=args.time_limit, threads=args.threads, seed=args.seed,
                  top=args.top, objective=args.objective, required_tokens_per_s=args.required_tokens_per_s)
    if args.quiet or not sys.stderr.isatty():
        return solve(instance, **kwargs)
    from rich.progress import Progress

    with Progress(transient=True) as bar:
        task = bar.add_task("searching configurations", total=None)

        def progress(examined=None, total=None, incumbent=None, bound=None):
            if examined is None:  # the baseline sweep: one tick per configuration
                bar.advance(task)
                return
            unit = {"time": " s", "cost": " per M tokens", "gpus": " GPUs"}[args.objective]
            bar.update(task, completed=examined, total=total,
                       description=f"solved {examined} of {total} configurations, incumbent {incumbent:.4f}{unit}, "
                                   f"bound {bound:.4f}{unit}")

        return solve(instance, progress=progress, **kwargs)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    try:
        code = run(argv)
    except KeyboardInterrupt:
        code = _fail(130, "interrupted")
    except BrokenPipeError:
        code = EXIT_OK
    except Exception as exc:  # a bug, not bad input: one line unless debugging
        if os.environ.get("SOLVE_DEBUG"):
            raise
        code = _fail(3, f"internal error: {type(exc).__name__}: {exc} (set SOLVE_DEBUG=1 for a traceback)")
    sys.exit(code)


if __name__ == "__main__":
    main()
