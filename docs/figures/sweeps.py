"""docs/sweeps.md's table of the shipped sweep, written from what the sweep stored so that its figures cannot drift.

    python docs/figures/sweeps.py --from DIR    # take the plans of `solve sweep instances/sweeps/llama31_70b_15t.yaml
                                                # --out DIR` (the expensive part: cells x 60 s / workers) into
                                                # docs/sweeps/llama31_70b_15t_plans.json, then rewrite the table
    python docs/figures/sweeps.py               # rewrite the table from the stored plans (seconds)
    python docs/figures/sweeps.py --check       # exit 1 where docs/sweeps.md differs from what the code gives

Two parts, two costs. The search (each cell's configuration, GPU map, status and gap) is stored with the command
and commit that ran it: a 60 s search depends on the machine's speed, so no test repeats it. Everything else in the
table (iteration time and its p10-p90 band, MFU and the published MFU ceiling it is checked against, peak memory,
days and cost) is the current model's evaluation of those stored placements, through the sweep's own row
(solvers/sweep/cells.py `plan_row`): tests/test_docs_sweeps.py regenerates it and fails on any difference, so a
change of the cost model, the calibration or the ceiling table shows up as a diff of docs/sweeps.md.
"""

from __future__ import annotations

import argparse
import copy
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO))

from formulation import instance_from_dict  # noqa: E402
from formulation.evaluate import evaluate  # noqa: E402
from formulation.mfu_ceiling import ceilings  # noqa: E402
from formulation.placement import Placement  # noqa: E402
from solvers.result import PlanResult, SolverReport  # noqa: E402
from solvers.sweep.cells import cells, load_sweep, plan_row  # noqa: E402
from solvers.sweep.tables import pareto_front, pareto_picture  # noqa: E402

SWEEP = REPO / "instances" / "sweeps" / "llama31_70b_15t.yaml"
STORED = REPO / "docs" / "sweeps" / "llama31_70b_15t_plans.json"
DOC = REPO / "docs" / "sweeps.md"
PICTURE = REPO / "docs" / "sweeps" / "llama31_70b_15t_pareto.png"
BEGIN = "<!-- figure: docs/figures/sweeps.py (do not edit by hand) -->"
END = "<!-- /figure -->"


def store_plans(out: Path, command: str, commit: str | None = None) -> dict:
    """The search's part of a finished sweep: each cell's placement (GPU indices), status, gap and wall time."""
    sweep = load_sweep(SWEEP)
    table = {r["cell"]: r for r in json.loads((out / "table.json").read_text())["cells"]}
    stored = []
    for cell in cells(sweep):
        row = table[cell.index]
        if not (out / "plans" / f"cell{cell.index:04d}.json").is_file():  # no plan: bad input, infeasible, none in time
            stored.append({"cell": cell.index, "status": row.get("status"), "reason": row.get("reason", "")})
            continue
        plan = json.loads((out / "plans" / f"cell{cell.index:04d}.json").read_text())
        instance = instance_from_dict(copy.deepcopy(cell.document), f"cell {cell.index}")
        placement = dict(plan["placement"])
        placement["gpus"] = [instance.cluster.gpu_index(name) for name in placement["gpus"]]
        stored.append({"cell": cell.index, "status": row["status"], "gap": row["gap"],
                       "wall_time_s": round(row["wall_time_s"], 1), "placement": placement})
    commit = commit or subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                                      capture_output=True, text=True).stdout.strip()
    return {"command": command, "commit": commit, "cells": stored}


def rows(stored: dict) -> list[dict]:
    """The sweep's table rows of the stored placements, as the current model scores them."""
    sweep = load_sweep(SWEEP)
    by_cell = {c["cell"]: c for c in stored["cells"]}
    out = []
    for cell in cells(sweep):
        saved = by_cell[cell.index]
        base = {"cell": cell.index, "gpu_type": cell.values.get("gpu_type"), "nodes": cell.values.get("nodes")}
        if "placement" not in saved:
            out.append({**base, "status": saved["status"]})
            continue
        instance = instance_from_dict(copy.deepcopy(cell.document), f"cell {cell.index}")
        p = saved["placement"]
        placement = Placement(**{**p, "layers_per_stage": tuple(p["layers_per_stage"]), "gpus": tuple(p["gpus"])})
        report = SolverReport(method="stored", status=saved["status"], objective_s=None, bound_s=None,
                              gap=saved["gap"], wall_time_s=saved["wall_time_s"], seed=sweep.seed)
        result = PlanResult(placement=placement, estimate=evaluate(instance, placement), solver=report)
        row = plan_row(instance, result, sweep.token_budget)
        out.append({**base, **row})
    return out


def _pct(v: float) -> str:
    return f"{100 * v:.1f}%"


def render(stored: dict) -> str:
    """The markdown block: the table, the ceilings it was checked against, and where the search came from."""
    lines = ["| GPUs | GPU type | tp pp cp dp vpp | iteration (s) | p10-p90 (s) | MFU | MFU ceiling | peak GiB | gap "
             "| days | cost (M) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    sources, flagged, table = {}, [], rows(stored)
    for r in table:
        if "iteration_time_s" not in r:
            lines.append(f"| | {r['gpu_type']} ({r['nodes']} nodes) | {r['status']} | | | | | | | | |")
            continue
        ceiling = ""
        if "mfu_ceiling" in r:
            mark = sources.setdefault(r["mfu_ceiling_source"], f"[{len(sources) + 1}]")
            ceiling = f"{_pct(r['mfu_ceiling'])} {mark}"
            if r["mfu_above_published"]:
                ceiling += " **above**"
                flagged.append(r)
        band = (f"{r['iteration_time_p10_s']:.1f}-{r['iteration_time_p90_s']:.1f}"
                if "iteration_time_p10_s" in r else "")
        lines.append(f"| {r['gpus']} | {r['gpu_type']} | {r['tp']} {r['pp']} {r['cp']} {r['dp']} {r['vpp']} | "
                     f"{r['iteration_time_s']:.2f} | {band} | {_pct(r['mfu'])} | {ceiling} | "
                     f"{r['peak_memory_gib']:.1f} | {100 * r['gap']:.2f}% | {r['days']:.0f} | {r['cost'] / 1e6:.2f} |")
    lines.append("")
    for source, mark in sources.items():
        lines.append(f"{mark} The highest MFU published for the GPU type and precision (formulation/data/"
                     f"mfu_ceilings.json): {source}.")
    lines.append("")
    lines.append(f"Cells above their ceiling (by more than the table's {100 * ceilings().tolerance:.0f}% tolerance): "
                 f"{len(flagged)} of "
                 f"{len(table)}" + (", " + ", ".join(
                     f"{r['gpus']} {r['gpu_type']} ({_pct(r['mfu'])})" for r in flagged) if flagged else "") + ".")
    lines.append("")
    lines.append(f"Configurations, GPU maps and gaps: `{stored['command']}` at commit {stored['commit']} (stored in "
                 f"docs/sweeps/{STORED.name}); every other figure is the current model's evaluation of those "
                 "placements, regenerated by `python docs/figures/sweeps.py` and checked by tests/test_docs_sweeps.py.")
    return "\n".join(lines)


def replace_block(text: str, block: str) -> str:
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    if not rest:
        raise SystemExit(f"{DOC}: no '{BEGIN}' marker")
    return f"{head}{BEGIN}\n{block}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="source", type=Path, help="a finished `solve sweep ... --out DIR`")
    parser.add_argument("--command", default=f"solve sweep {SWEEP.relative_to(REPO)} --out sweep_out/",
                        help="the command that made --from DIR, recorded with the plans")
    parser.add_argument("--commit", default=None, help="the commit that ran it (default: HEAD)")
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/sweeps.md is not what the code gives")
    args = parser.parse_args(argv)
    if args.source:
        stored = store_plans(args.source, args.command, args.commit)
        cells_text = ",\n".join("  " + json.dumps(c, separators=(",", ":")) for c in stored["cells"])
        STORED.write_text(f'{{"command": {json.dumps(stored["command"])}, "commit": {json.dumps(stored["commit"])},\n'
                          f' "cells": [\n{cells_text}\n]}}\n')
    stored = json.loads(STORED.read_text())
    text = DOC.read_text()
    new = replace_block(text, render(stored))
    if args.check:
        if new != text:
            print(f"{DOC} differs from what docs/figures/sweeps.py gives: run it and commit the result")
            return 1
        return 0
    DOC.write_text(new)
    table = rows(stored)  # the picture from the same rows (not compared by the test: PNG bytes vary by version)
    pareto_picture(load_sweep(SWEEP), table, pareto_front(table), PICTURE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
