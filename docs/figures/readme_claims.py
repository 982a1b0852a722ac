"""Claims of README.md that a command measures: the minimal instance's solve (wall time depends on the machine, so
an expensive figure, stamped with the commit it ran at)."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

from registry import figure

from formulation.inputs.instance import instance_from_dict

ROOT = Path(__file__).resolve().parents[2]


def readme_instance() -> dict:
    """The JSON of README.md's "A complete minimal instance"."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## A complete minimal instance", 1)[1]
    return json.loads(re.search(r"\n(    \{\n.*?\n    \})\n", section, re.DOTALL)[1])


@figure("readme-minimal-solve", doc="README.md", cost="expensive",
        command="python docs/figures/render.py --expensive readme-minimal-solve")
def minimal_solve() -> str:
    from solvers import solve

    instance = instance_from_dict(readme_instance(), "README.md")
    start = time.perf_counter()
    result = solve(instance)
    wall = time.perf_counter() - start
    status = result.solver.status
    proven = "to a proven optimum" if status == "optimal" else f"with status `{status}`"
    return (f"This instance solves {proven} in about {wall:.0f} s ({result.placement.describe()}, "
            f"{result.estimate.iteration_time_s:.3f} s per iteration; method `{result.solver.method}`; wall "
            f"time on {os.cpu_count()} cores at a load average of {os.getloadavg()[0]:.0f}).")
