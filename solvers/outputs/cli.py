"""The `solve` command.

    solve --instance instances/h100_128.json [--output plan.json] [--top K] [--output-dir DIR] [--plot]
          [--framework megatron|torchtitan] [--method auto|exact|bound-only|anneal|baseline]
          [--backend auto|cbc|cpsat] [--time-limit S]
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
from pathlib import Path

from formulation import InfeasibleError, InputError, evaluate, load_instance
from formulation.inputs.ingest import summarize
from formulation.inputs.user_calibration import apply_user_calibration, load_user_calibration
from formulation.placement_file import load_placement
from solvers import solve
from solvers.backends import portfolio
from solvers.local.block_recompute import block_recompute_hint
from formulation.inputs.frameworks import config_problem
from solvers.outputs.arguments import (EXIT_BAD_INPUT, EXIT_OK, OneLineParser, add_framework_option, count, fail,
                                       planning_failure, seconds, seed, write_plan_file)
from solvers.outputs.plan_notes import input_warnings, launch_notes
from solvers.outputs.report import estimate_warnings, print_report, terminal_console
from solvers.result import with_caveats, with_plausibility
from solvers.search.driver import NoPlanInTime
from solvers.search.uniform import MAX_EXACT_SIZE
from solvers.strategy import BACKENDS, METHODS, SOLVER_ALIASES, strategy


def _parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="solve", description="Plan LLM training on a GPU cluster: parallel sizes, layer partition and "
                                  "GPU-to-rank map that make an iteration fastest without running out of memory.",
        epilog="Subcommands: 'solve validate --help', 'solve calibrate --help', 'solve bench --help', "
               "'solve ingest FILE' (what the planner takes from a measurement or config file), 'solve sweep --help' "
               "(what-if sweeps over models, GPU types and cluster sizes), 'solve replan --help' (the best plan after "
               "failures). Exit codes: "
               "0 plan found, 1 no feasible plan, 2 bad input.")
    parser.add_argument("--instance", required=True, help="instance file (JSON or YAML): model, training, cluster")
    parser.add_argument("--evaluate", metavar="PLACEMENT", help="score this placement (JSON; a plan file works too)")
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON instead of tables")
    parser.add_argument("--output", metavar="PLAN.json", help="write the plan (placement, estimate, solver report)")
    parser.add_argument("--output-dir", metavar="DIR", help="write plan.json, Megatron-LM arguments, torchrun and Slurm "
                                                            "launch scripts, torchtitan arguments (0.3) and TOML (0.2), pictures, README.txt")
    add_framework_option(parser)
    parser.add_argument("--plot", action="store_true", help="draw schedule.png, memory.png and cluster.png (into "
                                                            "--output-dir, else next to --output, else here)")
    parser.add_argument("--method", default=None, choices=METHODS,
                        help="auto (default): the exact program where the cluster is small enough to prove "
                             f"(GPUs x GPU classes <= {MAX_EXACT_SIZE}), else the bound-only search; exact: the exact "
                             "program (refused beyond its reach); bound-only: default GPU maps with layer partitions "
                             "solved exactly, a proven global lower bound, then annealed placements for the best "
                             "configurations; anneal: simulated annealing of the best default placements with the "
                             "proven global lower bound; baseline: Megatron-style defaults only, no bound. The report "
                             "says which ran")
    parser.add_argument("--backend", default=None, choices=BACKENDS,
                        help=f"the solver of the programs: cbc, cpsat, or auto (default: CP-SAT, and CBC for an exact "
                             f"program CP-SAT has not closed in {portfolio.FIRST_TRY_S:g} s; the one installed if the "
                             f"other is not)")
    parser.add_argument("--solver", default=None, choices=list(SOLVER_ALIASES),
                        help="older spelling of a method and backend: auto, cbc / cpsat (method auto with that "
                             "backend), anneal, baseline")
    parser.add_argument("--objective", default="time", choices=["time", "cost", "gpus"],
                        help="time: fastest iteration (default); cost: least GPU price per trained token (per-type "
                             "price_per_hour in the instance); gpus: fewest GPUs reaching --required-tokens-per-s. "
                             "Clusters of several GPU types, and cost / gpus, use the island composition search")
    parser.add_argument("--required-tokens-per-s", type=float, default=None, metavar="TOK",
                        help="throughput the plan must reach (with --objective gpus)")
    parser.add_argument("--time-limit", type=seconds, default=None, metavar="S", help="wall-clock limit in seconds")
    parser.add_argument("--threads", type=count, default=1, help="solver threads")
    parser.add_argument("--seed", type=seed, default=0, help="random seed (results are deterministic per seed)")
    parser.add_argument("--top", type=count, default=1, metavar="K", help="also report the K best configurations")
    parser.add_argument("--calibration", metavar="CAL.json", help="your cluster's knobs, fitted on your own runs "
                        "by 'solve calibrate --runs MINE.csv --output CAL.json' (compute, network, overhead)")
    parser.add_argument("--quiet", action="store_true", help="no progress output")
    return parser


def _validate_command(argv: list[str]) -> int:
    # Subcommands import their modules on demand: validation pulls in scipy, which `solve --help` should not wait for.
    from solvers.validation import validate
    return validate.main(argv[0], argv[1:])


def _sweep_command(argv: list[str]) -> int:
    from solvers.sweep import run as sweep
    return sweep.main(argv[1:])


def _replan_command(argv: list[str]) -> int:
    from solvers.outputs import replan_cli
    return replan_cli.main(argv[1:])


def _bench_command(argv: list[str]) -> int:
    from solvers.validation import bench
    return bench.main(argv[1:])


_SUBCOMMANDS = {"validate": _validate_command, "calibrate": _validate_command, "sweep": _sweep_command,
                "bench": _bench_command, "replan": _replan_command, "ingest": lambda argv: _ingest(argv[1:])}


def _argument_problem(args) -> str | None:
    """What is wrong with the flags taken together (argparse checks each alone), as the line to print."""
    if args.output and Path(args.output).is_dir():
        return f"--output: {args.output} is a directory; expected the plan file's path"
    if args.output_dir and Path(args.output_dir).exists() and not Path(args.output_dir).is_dir():
        return f"--output-dir: {args.output_dir} exists and is not a directory"
    if args.objective == "gpus" and not (args.required_tokens_per_s and args.required_tokens_per_s > 0):
        return "--required-tokens-per-s: expected a positive throughput with --objective gpus"
    if args.solver is not None and (args.method is not None or args.backend is not None):
        return "--solver: give either --solver or --method/--backend, not both"
    method, _ = strategy(args.solver, args.method or "auto", args.backend or "auto")
    if args.objective != "time" and method not in ("auto", "exact"):
        return f"--objective {args.objective}: needs --method auto or exact, not {method}"
    return None


def run(argv: list[str]) -> int:
    if argv and argv[0] in _SUBCOMMANDS:
        return _SUBCOMMANDS[argv[0]](argv)
    args = _parser().parse_args(argv)
    problem = _argument_problem(args)
    if problem:
        return fail(EXIT_BAD_INPUT, problem)
    args.method, args.backend = strategy(args.solver, args.method or "auto", args.backend or "auto")
    try:
        instance = load_instance(args.instance, framework=args.framework)
        if args.calibration:
            calibration = load_user_calibration(args.calibration)
            instance = apply_user_calibration(instance, calibration)
        for warning in input_warnings(instance):
            print(f"warning: {warning}", file=sys.stderr)
        console = terminal_console(stderr=args.json)
        if args.evaluate:  # a scored placement takes the plan's way out: --json, --output, the tables, --output-dir
            placement = load_placement(args.evaluate, instance)
            problem = config_problem(instance.training.framework, instance.training.seq_length, placement)
            if problem:  # the framework would run something else: its score would not be this placement's
                return fail(EXIT_BAD_INPUT, f"error: {args.evaluate}: {problem[0]}: {problem[1]} "
                                             f"({instance.training.framework_origin})")
            result = _Evaluated(placement, evaluate(instance, placement))
        else:
            result = _solve_with_progress(instance, args, solve)
        if getattr(result, "solver", None) is not None and result.solver.objective == "time":
            result.hints = [h for h in [block_recompute_hint(instance, result.placement, result.estimate)] if h]
        result.warnings = input_warnings(instance) + estimate_warnings(instance, result.estimate)
        result.calibration = None if instance.calibration is None else instance.calibration.to_dict()
    except (InputError, InfeasibleError, NoPlanInTime) as exc:
        return planning_failure(exc)
    plan = result.to_dict(instance.cluster)
    if args.output and (code := write_plan_file(args.output, plan)) is not None:
        return code
    if args.json:
        print(json.dumps(plan, indent=2))
        return _write_outputs(args, instance, result, console)
    print_report(instance, result, console)
    if args.output:
        console.print(f"plan written to {args.output}")
    return _write_outputs(args, instance, result, console)


def _ingest(argv: list[str]) -> int:
    """`solve ingest FILE...`: what the planner takes from each measurement or config file."""
    parser = OneLineParser(prog="solve ingest", description="Say what the planner takes from an "
                                     "nccl-tests log, `nvidia-smi topo -m` output or Hugging Face config.json")
    parser.add_argument("files", nargs="+", metavar="FILE")
    parser.add_argument("--gpu-generation", default=None, help="with a topology: also print its GPU-pair "
                                                               "bandwidths for this generation (v100, a100, h100, ...)")
    args = parser.parse_args(argv)
    try:
        for path in args.files:
            print(summarize(path, args.gpu_generation))
    except InputError as exc:
        return fail(EXIT_BAD_INPUT, f"error: {exc}")
    return EXIT_OK


class _Evaluated:
    """A scored placement in the shape `export_plan` takes (placement, estimate, to_dict) when no solver ran."""

    def __init__(self, placement, estimate):
        self.placement, self.estimate = placement, estimate
        self.warnings, self.calibration = [], None

    def to_dict(self, cluster) -> dict:
        plan = {"placement": self.placement.to_dict(cluster), "estimate": self.estimate.to_dict()}
        return with_caveats(with_plausibility(plan, cluster, self.estimate), self.warnings, self.calibration)


def _write_outputs(args, instance, plan, console) -> int:
    """--output-dir (launch files and pictures) and --plot; the paths go to the console (stderr with --json)."""
    if not (args.output_dir or args.plot):
        return EXIT_OK
    target = args.output_dir or (str(Path(args.output).parent) if args.output else ".")
    try:
        if args.output_dir:
            from solvers.outputs.export import export_plan
            written = export_plan(instance, plan, args.output_dir, pictures=True)
        else:
            from solvers.outputs.plots import write_pictures
            written = write_pictures(instance, plan.placement, plan.estimate, target)
    except OSError as exc:
        return fail(EXIT_BAD_INPUT, f"error: {target}: cannot write: {exc.strerror or exc}")
    for path in written.values():
        console.print(f"wrote {path}", highlight=False, soft_wrap=True)
    for note in launch_notes(instance, plan) if args.output_dir else []:  # report.html lists them too
        console.print(f"note: {note}", highlight=False)
    if args.output_dir and instance.training.framework:
        console.print(f"the plan is for {instance.training.framework}: the launch scripts run it by default "
                      f"(bash {Path(args.output_dir) / 'launch_torchrun.sh'}, or launch_slurm.sh)",
                      highlight=False, soft_wrap=True)
    return EXIT_OK


def _solve_with_progress(instance, args, solve):
    """Run the search, with a progress bar on an interactive terminal unless --quiet."""
    kwargs = dict(method=args.method, backend=args.backend, time_limit=args.time_limit, threads=args.threads, seed=args.seed,
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
        code = fail(130, "interrupted")
    except BrokenPipeError:
        code = EXIT_OK
    except Exception as exc:  # a bug, not bad input: one line unless debugging
        if os.environ.get("SOLVE_DEBUG"):
            raise
        code = fail(3, f"internal error: {type(exc).__name__}: {exc} (set SOLVE_DEBUG=1 for a traceback)")
    sys.exit(code)


if __name__ == "__main__":
    main()
