"""`solve bench`: the planners side by side on a list of instances and seeds.

    solve bench [--instances A.json B.json ...] [--seeds 5] [--budget 10] [--out bench-results] [--quick]
    solve bench --family irregular|node-matrix [--seeds 3] [--budget 60]

Per instance and method (the Megatron-style default; `auto` without a limit; CBC and CP-SAT (exact where the
cluster is small enough, else their bound-only search); `auto` and simulated annealing each at the same
wall-clock budget): best objective, proven lower bound, gap, wall time to the final plan, time to reach
within 1 % of the best plan any method found on that instance, medians over the seeds. Writes bench.csv
(one line per run), bench.json (runs and medians) and bench.png (gap and time to 1 % per instance), and
prints the table, and for the budgeted runs with a bound how the gap closed over the budget. Timings are
wall-clock on a shared machine: quote medians, compare within one run.

Methods without a bound (solvers/validation/local_search.py): `local@budget`, a local search over every
configuration with restarts; `node-sa@budget`, Pipette-style SA over whole nodes of auto@budget's
configuration (same seed). Families (`--family`): see FAMILIES.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import statistics
import time
from pathlib import Path

from solvers.outputs.arguments import OneLineParser
from solvers.outputs.files import save_figure_atomic, write_json_atomic

# Shipped instances are looked up in ./instances first, then in the checkout this module runs from.
INSTANCE_DIRS = [Path("instances"), Path(__file__).resolve().parents[2] / "instances"]
DEFAULT_INSTANCES = ["small_2x4", "small_4x2", "measured_4", "measured_16", "measured_32", "measured_64", "h100_128",
                     "h100_1024", "h100_16384"]
QUICK_INSTANCES = ["small_4x2", "measured_16", "h100_128"]
# Mixed GPU types: the composed plan against the best plan on the largest island alone and against
# the type-blind Megatron default (even split over all GPUs, every stage at its slowest GPU's pace).
MIXED_INSTANCES = ["a100_h100_64", "mixed_256"]
MIXED_METHODS = ["default", "largest-island", "best-island", "islands-composed", "auto", "cbc", "cpsat"]
# Families: the irregular 32-64 GPU instances (instances/generate.py --irregular) against a local search at
# equal wall time, and all-different node-pair matrices against a node-permutation SA given auto's configuration.
FAMILIES = {
    "irregular": (sorted(str(p) for p in (Path(__file__).resolve().parents[2] / "instances" / "irregular").glob("*.json"))
                  + [str(Path(__file__).resolve().parents[2] / "tests" / "repro" / "search_irregular_8x8.json")],
                  ["auto@budget", "local@budget"]),
    "node-matrix": (["measured_16", "measured_32", "measured_64"], ["auto@budget", "node-sa@budget"]),
}
GAP_TIMES = (0.1, 0.25, 0.5, 1.0)  # fractions of the budget at which the bench reports the gap
# Beyond this many GPUs the configuration sweep alone outlasts a budget of seconds: only the default and
# `auto` without a limit run there.
BUDGET_RUNS_MAX_GPUS = 2048


def _run(instance, method: str, seed: int, budget: float, earlier: dict | None = None) -> dict:
    """One run; `earlier`: this instance's runs so far by (method, seed) (node-sa takes auto@budget's
    configuration from there)."""
    from solvers import solve
    from solvers.search.baseline import best_default

    started = time.perf_counter()
    if method in ("local@budget", "node-sa@budget"):
        return _run_baseline(instance, method, seed, budget, earlier or {})
    if method == "default":
        found = best_default(instance)
        best = found.best[0].estimate.iteration_time_s
        wall = time.perf_counter() - started  # one reading: its plan is found at the end of its wall time
        return {"objective_s": best, "bound_s": None, "gap": None, "wall_s": wall,
                "history": [(wall, best)], "status": "feasible", "reported": "default",
                "tokens_per_s": found.best[0].estimate.tokens_per_s}
    if method == "islands-composed":  # the literature's islands approach (solvers/validation/islands_composed.py)
        from solvers.validation.islands_composed import islands_composed
        _, estimate = islands_composed(instance)
        wall = time.perf_counter() - started
        return {"objective_s": estimate.iteration_time_s, "bound_s": None, "gap": None, "wall_s": wall,
                "history": [(wall, estimate.iteration_time_s)], "status": "feasible",
                "reported": "per-island plans composed (Tangram-style)", "tokens_per_s": estimate.tokens_per_s}
    if method in ("largest-island", "best-island"):
        from formulation.errors import InfeasibleError
        from formulation.programs.islands import find_islands

        from solvers.search.mixed import compose_search
        islands = find_islands(instance.cluster)
        if method == "largest-island":
            islands = [max(islands, key=lambda i: (i.num_gpus, instance.cluster.gpu_types[i.gpu_type].peak_tflops))]
        runs = []
        for isl in islands:
            try:
                runs.append((compose_search(instance, islands=[isl]), isl))
            except InfeasibleError:  # the model does not fit on this island alone
                continue
        found, isl = min(runs, key=lambda r: r[0].ranked[0].estimate.iteration_time_s)
        best = found.ranked[0].estimate
        wall = time.perf_counter() - started
        # the composition search proves its optimum over compositions only (a stage of 3 GPUs on 8-GPU nodes is
        # none): no bound or proof is claimed for an island alone (solvers/bounds/every_placement.py)
        return {"objective_s": best.iteration_time_s, "bound_s": None, "gap": None,
                "wall_s": wall, "history": [(wall, best.iteration_time_s)],
                "status": "feasible", "reported": f"islands, {isl.describe(instance.cluster)} only",
                "tokens_per_s": best.tokens_per_s}
    kwargs = {"seed": seed}
    if method.endswith("@budget"):
        kwargs["time_limit"] = budget
    solver = {"auto": "auto", "auto@budget": "auto", "anneal@budget": "anneal", "cbc": "cbc", "cpsat": "cpsat"}[method]
    result = solve(instance, solver=solver, **kwargs)
    s = result.solver
    return {"objective_s": s.objective_s, "bound_s": s.bound_s, "gap": s.gap, "wall_s": s.wall_time_s,
            "history": result.history, "status": s.status, "reported": s.method,
            "tokens_per_s": result.estimate.tokens_per_s, "config": list(result.placement.config_key())}


def _run_baseline(instance, method: str, seed: int, budget: float, earlier: dict) -> dict:
    """The baselines without a bound (solvers/validation/local_search.py), at the budget's wall time."""
    from formulation.space import Config

    from solvers.validation.local_search import local_search, node_sa

    started = time.perf_counter()
    if method == "local@budget":
        placement, estimate, history = local_search(instance, budget, seed)
        reported = "local search, every configuration"
    else:
        auto = earlier.get(("auto@budget", seed))
        if auto is None:
            raise ValueError("node-sa@budget needs auto@budget before it in --methods (it takes auto's configuration)")
        names = [f.name for f in dataclasses.fields(Config)]  # config_key(): every field of Config, in order
        found = node_sa(instance, Config(**dict(zip(names, auto["config"]))), budget, seed)
        placement, estimate, history = found.placement, found.estimate, found.history
        reported = "node-permutation SA, auto's configuration"
    return {"objective_s": estimate.iteration_time_s, "bound_s": None, "gap": None,
            "wall_s": time.perf_counter() - started, "history": history, "status": "feasible",
            "reported": reported, "tokens_per_s": estimate.tokens_per_s, "config": list(placement.config_key())}


def _gap_over_time(run: dict, budget: float) -> list:
    """The gap to the run's final bound of its best plan at 10 %, 25 %, 50 % and 100 % of the budget (None
    before its first plan)."""
    out = []
    for fraction in GAP_TIMES:
        seen = [value for t, value in run["history"] if t <= fraction * budget]
        out.append((min(seen) - run["bound_s"]) / min(seen) if seen and run["bound_s"] is not None else None)
    return out


def _time_to(history: list, target: float) -> float | None:
    return next((t for t, value in history if value <= target), None)


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def run_bench(names: list[str], seeds: int, budget: float, methods: list[str], progress=None) -> dict:
    from formulation import load_instance

    runs = []
    for name in names:
        path = Path(name) if name.endswith((".json", ".yaml", ".yml")) else next(
            (d / f"{name}.json" for d in INSTANCE_DIRS if (d / f"{name}.json").is_file()), INSTANCE_DIRS[0] / f"{name}.json")
        instance = load_instance(path)
        for method in methods:
            if method.endswith("@budget") and instance.cluster.num_gpus > BUDGET_RUNS_MAX_GPUS:
                continue
            if method in ("cbc", "cpsat") and instance.cluster.num_gpus > BUDGET_RUNS_MAX_GPUS:
                continue  # the same bound-only search as auto's, with another partition backend
            for seed in range(1 if method in ("default", "cbc", "cpsat") else seeds):
                if progress:
                    progress(f"{instance.name}: {method}, seed {seed}")
                earlier = {(r["method"], r["seed"]): r for r in runs if r["instance"] == instance.name}
                runs.append({"instance": instance.name, "gpus": instance.cluster.num_gpus, "method": method,
                             "seed": seed, **_run(instance, method, seed, budget, earlier)})
                if method.endswith("@budget") and runs[-1]["bound_s"] is not None:
                    runs[-1]["gap_over_time"] = _gap_over_time(runs[-1], budget)
    best = {}
    for r in runs:
        best[r["instance"]] = min(best.get(r["instance"], float("inf")), r["objective_s"])
    for r in runs:
        r["time_to_1pct_s"] = _time_to(r["history"], best[r["instance"]] * 1.01)
        r["vs_best"] = r["objective_s"] / best[r["instance"]] - 1
    summary = []
    for name in dict.fromkeys(r["instance"] for r in runs):
        for method in methods:
            group = [r for r in runs if r["instance"] == name and r["method"] == method]
            if not group:
                continue
            summary.append({
                "instance": name, "gpus": group[0]["gpus"], "method": method, "runs": len(group),
                "reported": group[0]["reported"], "objective_s": _median(r["objective_s"] for r in group),
                "bound_s": _median(r["bound_s"] for r in group), "gap": _median(r["gap"] for r in group),
                "vs_best": _median(r["vs_best"] for r in group), "wall_s": _median(r["wall_s"] for r in group),
                "time_to_1pct_s": _median(r["time_to_1pct_s"] for r in group),
                "tokens_per_s": _median(r.get("tokens_per_s") for r in group),
                "optimal": sum(r["status"] == "optimal" for r in group),
                "gap_over_time": [_median(r["gap_over_time"][k] for r in group) for k in range(len(GAP_TIMES))]
                if all("gap_over_time" in r for r in group) else None})
    return {"budget_s": budget, "seeds": seeds, "runs": runs, "summary": summary}


def _fmt(value, pattern: str) -> str:
    return "-" if value is None else pattern.format(value)


def print_table(result: dict, console) -> None:
    from rich.table import Table

    table = Table(title=f"bench: medians over seeds; '@budget' = {result['budget_s']:g} s wall-clock limit")
    for col in ("instance", "GPUs", "method", "reported as", "objective [s]", "tokens/s", "bound [s]", "gap",
                "vs best", "wall [s]", "to 1 % [s]", "optimal"):
        table.add_column(col, justify="left" if col in ("instance", "method", "reported as") else "right")
    for s in result["summary"]:
        table.add_row(s["instance"], f"{s['gpus']:,}", s["method"], s["reported"], f"{s['objective_s']:.4f}",
                      _fmt(s["tokens_per_s"], "{:,.0f}"), _fmt(s["bound_s"], "{:.4f}"), _fmt(s["gap"] and 100 * s["gap"], "{:.2f} %"),
                      f"{100 * s['vs_best']:+.2f} %", f"{s['wall_s']:.2f}", _fmt(s["time_to_1pct_s"], "{:.2f}"),
                      f"{s['optimal']}/{s['runs']}")
    console.print(table)
    rows = [s for s in result["summary"] if s.get("gap_over_time")]
    if rows:
        over = Table(title="how the gap closes: gap of the best plan so far to the run's final bound (medians)")
        for col in ("instance", "method", *(f"at {f * result['budget_s']:g} s" for f in GAP_TIMES)):
            over.add_column(col, justify="left" if col in ("instance", "method") else "right")
        for s in rows:
            over.add_row(s["instance"], s["method"], *(_fmt(g and 100 * g, "{:.2f} %") for g in s["gap_over_time"]))
        console.print(over)


def plot(result: dict, path: Path) -> None:
    from matplotlib.figure import Figure
    from matplotlib.ticker import FixedLocator, FuncFormatter

    names = list(dict.fromkeys(s["instance"] for s in result["summary"]))
    methods = list(dict.fromkeys(s["method"] for s in result["summary"]))
    fig = Figure(figsize=(13, 4.5), dpi=110, layout="constrained")
    left, right = fig.subplots(1, 2)
    width = 0.8 / max(1, len(methods))
    slowest = 0.0
    for k, method in enumerate(methods):
        rows = {s["instance"]: s for s in result["summary"] if s["method"] == method}
        xs = [i + k * width for i, n in enumerate(names) if n in rows]
        times = [rows[n]["time_to_1pct_s"] for n in names if n in rows]
        slowest = max([slowest, *(s for s in times if s is not None)])
        left.bar(xs, [100 * rows[n]["vs_best"] for n in names if n in rows], width, label=method)
        right.bar(xs, [s or 0 for s in times], width, label=method)
        for x, s in zip(xs, times):
            if s is None:  # never within 1 %: say so rather than draw an empty bar that reads as instant
                right.text(x, 0, "never", rotation=90, ha="center", va="bottom", fontsize=8)
    for ax, label in ((left, "objective above the best found [%]"), (right, "time to within 1 % of the best [s]")):
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(names))], names, rotation=20)
        ax.set_ylabel(label)
    if slowest > 2:  # seconds spanning decades: linear below 1 s, logarithmic above, ticks as plain numbers
        right.set_yscale("symlog", linthresh=1)
        ticks = [t for t in (0, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000) if t <= 1.5 * slowest]
        right.yaxis.set_major_locator(FixedLocator(ticks))
        right.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    left.legend(fontsize=8)
    fig.suptitle(f"planner benchmark (medians; @budget = {result['budget_s']:g} s)")
    save_figure_atomic(fig, path)


def _write(result: dict, out: Path) -> list[Path]:

    out.mkdir(parents=True, exist_ok=True)
    fields = ["instance", "gpus", "method", "seed", "reported", "status", "objective_s", "tokens_per_s", "bound_s", "gap",
              "wall_s", "time_to_1pct_s", "vs_best"]
    tmp = out / "bench.csv.tmp"
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(result["runs"])
    tmp.replace(out / "bench.csv")
    write_json_atomic(out / "bench.json", result)
    plot(result, out / "bench.png")
    return [out / "bench.csv", out / "bench.json", out / "bench.png"]


def main(argv: list[str]) -> int:
    from rich.console import Console

    parser = OneLineParser(prog="solve bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--instances", nargs="+", default=None,
                        help=f"instance names under instances/ or paths (default: {' '.join(DEFAULT_INSTANCES)})")
    parser.add_argument("--seeds", type=int, default=5, help="seeds per randomised method (default 5)")
    parser.add_argument("--budget", type=float, default=10.0, help="wall-clock budget of the @budget runs [s]")
    parser.add_argument("--methods", nargs="+", default=["default", "auto", "cbc", "cpsat", "auto@budget",
                                                         "anneal@budget"])
    parser.add_argument("--out", type=Path, default=Path("bench-results"), help="where bench.csv/json/png go")
    parser.add_argument("--quick", action="store_true", help=f"{', '.join(QUICK_INSTANCES)}, 2 seeds, 5 s budget")
    parser.add_argument("--family", choices=sorted(FAMILIES),
                        help="irregular: the irregular 32-64 GPU instances, auto@budget vs local@budget (a local "
                             "search over every configuration at equal wall time); node-matrix: measured_16/32/64, "
                             "auto@budget vs node-sa@budget (node-permutation SA given auto's configuration)")
    parser.add_argument("--mixed", action="store_true",
                        help=f"mixed GPU types: {', '.join(MIXED_INSTANCES)} with {', '.join(MIXED_METHODS)} "
                             f"(largest-island / best-island: the best plan on the largest island alone / on the "
                             f"best single island; islands-composed: each island's slice planned for one type, "
                             f"layers shared by peak compute, composed; default: type-blind even split over all "
                             f"GPUs)")
    args = parser.parse_args(argv)
    if args.family:
        args.instances = args.instances or FAMILIES[args.family][0]
        args.methods = FAMILIES[args.family][1] if args.methods == parser.get_default("methods") else args.methods
    if args.mixed:
        args.instances = args.instances or MIXED_INSTANCES
        args.methods = MIXED_METHODS if args.methods == parser.get_default("methods") else args.methods
    if args.seeds < 1 or args.budget <= 0:
        print("error: --seeds and --budget must be positive")
        return 2
    names = args.instances or (QUICK_INSTANCES if args.quick else DEFAULT_INSTANCES)
    seeds, budget = (2, 5.0) if args.quick else (args.seeds, args.budget)
    console = Console(stderr=True)
    with console.status("bench") as status:
        result = run_bench(names, seeds, budget, args.methods, progress=lambda text: status.update(text))
    print_table(result, Console(width=200))
    for path in _write(result, args.out):
        console.print(f"wrote {path}")
    return 0
