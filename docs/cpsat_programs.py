"""One exact program of a test generator's instance solved by CP-SAT at a chosen setting: the table of programs that
stalled CP-SAT (docs/programs.md, Backends). Run it under a memory cap and a time limit, as a stall checks neither:

    ulimit -v 6000000; /usr/bin/time -v timeout 40 python docs/cpsat_programs.py v 3 49 --probing 1 --linearization 2

Families: exact (tests/test_exact.py's `small_instance`), schedules (tests/test_schedules_exact.py's
`schedule_instance`), v (tests/test_v_schedules.py's `v_instance`); the index counts `configurations(instance)`,
and without one every configuration's program is solved in turn (then a stall stops the run: use the timeout).
Prints the configuration, CP-SAT's status and solve time (model built, Python started and OR-Tools imported before
it), its objective and the evaluator's time of the decoded placement. The script runs on older commits too (a
"before" column: check out formulation/ and solvers/ of the commit in a scratch copy and run it there).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from formulation import evaluate, instance_from_dict  # noqa: E402
from formulation.programs.exact import build_program  # noqa: E402
from formulation.space import configurations  # noqa: E402
from solvers.backends import cpsat  # noqa: E402


def instance_of(family: str, seed: int):
    if family == "exact":
        from test_exact import small_instance
        return instance_from_dict(small_instance(seed)[0])
    if family == "schedules":
        from test_schedules_exact import schedule_instance
        return instance_from_dict(schedule_instance(seed))
    from test_v_schedules import v_instance
    return instance_from_dict(v_instance(seed))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("family", choices=["exact", "schedules", "v"])
    parser.add_argument("seed", type=int)
    parser.add_argument("index", type=int, nargs="?", help="position in configurations(instance) (none: every one)")
    parser.add_argument("--probing", type=int, default=None, help="cp_model_probing_level (default: the backend's)")
    parser.add_argument("--linearization", type=int, default=None, help="linearization_level (default: the backend's)")
    args = parser.parse_args()
    from ortools.sat.python import cp_model
    chosen = cp_model.CpSolver.Solve

    def solve(solver, model, *rest, **named):  # the backend's parameters, then the setting asked for
        if args.probing is not None:
            solver.parameters.cp_model_probing_level = args.probing
        if args.linearization is not None:
            solver.parameters.linearization_level = args.linearization
        return chosen(solver, model, *rest, **named)

    cp_model.CpSolver.Solve = solve
    instance = instance_of(args.family, args.seed)
    every = list(configurations(instance))
    times = []
    for index in range(len(every)) if args.index is None else [args.index]:
        try:
            program = build_program(instance, every[index])
        except ValueError:
            continue  # no partition fits
        out = cpsat.solve(program)
        times.append(out.wall_time_s)
        line = f"{index} {every[index]}\n  {out.status}: {out.wall_time_s:.3f} s"
        if out.values is not None:
            est = evaluate(instance, program.decode(out.values)).iteration_time_s
            line += f", objective {out.objective_s:.9f} s, evaluator {est:.9f} s"
        print(line, flush=True)
    if args.index is None:
        print(f"{len(times)} programs: {sum(times):.2f} s together, {max(times, default=0.0):.3f} s the slowest")


if __name__ == "__main__":
    main()
