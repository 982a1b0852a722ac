"""CBC through PuLP 3's `COIN_CMD` (the bundled `PULP_CBC_CMD` goes away in PuLP 4), with the CBC binary of the
`cbcbox` package that `pulp[cbc]` installs, or a `cbc` on PATH.

A proof only from CBC's own word: the run's log must end in "Result - Optimal solution found". PuLP maps a
run stopped at its time limit with an incumbent to status "Optimal" (its solution status tells them apart,
but only the log carries CBC's bound), so the log is read for the status and the bound alike.

With a time limit CBC is started through a guard (`_guard`): CBC checks its own limit (`-sec`) during branch and
bound, not in every step, and PuLP waits for it without one; a run still going at the limit plus the overrun grace
is killed and reported as a timeout without values, as CP-SAT's are (a time limit is a promise; CBC is also the
second leg of the `auto` backend, solvers/backends/portfolio.py).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
import tempfile
import time

from solvers.backends import BackendResult, given_up, overrun_grace

# CBC is killed this long after its limit at the least (the shared grace is 0.5 s): a run that stops at its limit
# still writes its solution and exits, on a loaded machine too, and a run killed loses its incumbent
MIN_GRACE_S = 2.0
# CBC stops when the incumbent is within these of its bound; the program's objective is in microseconds times
# the schedule's divisor, so an absolute allowance of 0 and a relative one of 1e-9 prove the optimum itself.
RELATIVE_GAP = 1e-9
ABSOLUTE_GAP = 0.0


def cbc_path() -> str | None:
    """The CBC executable: cbcbox's build for this CPU, else `cbc` on PATH (None: no CBC)."""
    try:
        import cbcbox
        path = cbcbox.cbc_bin_path()
        if os.access(path, os.X_OK):
            return path
    except Exception:  # not installed, or no build for this platform
        pass
    return shutil.which("cbc")


def available() -> bool:
    try:
        import pulp
        path = cbc_path()
        return path is not None and bool(pulp.COIN_CMD(path=path, msg=False).available())
    except Exception:  # pragma: no cover - a broken install is "unavailable"
        return False


def _lp(program):
    import pulp

    lp = pulp.LpProblem("plan", pulp.LpMinimize)
    cat = {"binary": pulp.LpBinary, "integer": pulp.LpInteger, "continuous": pulp.LpContinuous}
    xs = [lp.add_variable(f"v{i}", lowBound=lo, upBound=None if up == float("inf") else up, cat=cat[kind])
          for i, (kind, lo, up) in enumerate(zip(program.kinds, program.lower, program.upper))]
    lp += pulp.lpSum(c * xs[i] for i, c in program.objective.items()) + program.objective_constant
    for k, (terms, sense, rhs, _) in enumerate(program.rows):
        expr = pulp.lpSum(c * xs[i] for i, c in terms.items())
        lp += (expr >= rhs) if sense == ">=" else (expr <= rhs) if sense == "<=" else (expr == rhs), f"c{k}"
    return lp, xs


def read_log(text: str) -> dict:
    """CBC's closing report: `result` (the words after "Result - "), `objective` and `bound` (as CBC saw the
    objective, without PuLP's constant), None where absent."""
    def number(label: str) -> float | None:
        found = re.search(rf"^{label}:\s*(\S+)", text, re.MULTILINE)
        try:
            return float(found.group(1)) if found else None
        except ValueError:
            return None

    result = re.search(r"^Result - (.*)$", text, re.MULTILINE)
    return {"result": result.group(1).strip() if result else None, "objective": number("Objective value"),
            "bound": number("Lower bound")}


def solve(program, time_limit_s: float | None = None, threads: int = 1, seed: int = 0) -> BackendResult:
    import pulp

    start = time.perf_counter()
    path = cbc_path()
    if path is None:
        return BackendResult("error", None, None, None, 0.0, "CBC failed: no CBC binary (pip install 'pulp[cbc]')")
    lp, xs = _lp(program)
    options = [f"randomSeed {seed % (2 ** 31 - 1) + 1}", "randomCbcSeed 1"]
    with tempfile.TemporaryDirectory(prefix="cbc-") as tmp:
        log_path = os.path.join(tmp, "cbc.log")
        grace = None if time_limit_s is None else max(MIN_GRACE_S, overrun_grace(time_limit_s))
        wait_s = None if time_limit_s is None else time_limit_s + grace
        solver = pulp.COIN_CMD(path=_guard(path, wait_s, tmp), msg=False, timeLimit=time_limit_s, threads=threads,
                               options=options, gapRel=RELATIVE_GAP, gapAbs=ABSOLUTE_GAP, logPath=log_path)
        # PuLP writes the model and solution files to the system's temporary folder and deletes them only after
        # a run that returns: a failed or killed CBC left its .mps there (15 per test run). In ours they go with it.
        solver.tmpDir = tmp
        try:
            lp.solve(solver)
        except (pulp.PulpSolverError, OSError) as exc:  # binary missing, not executable, killed without output
            if os.path.exists(os.path.join(tmp, GIVEN_UP)):
                return given_up("CBC", time_limit_s, grace, time.perf_counter() - start)
            text = str(exc).strip()
            return BackendResult("error", None, None, None, time.perf_counter() - start,
                                 f"CBC failed: {text.splitlines()[0] if text else type(exc).__name__}")
        with open(log_path, errors="replace") as handle:
            report = read_log(handle.read())
    return _result(program, lp, xs, report, time.perf_counter() - start)


GIVEN_UP = "given-up"  # the guard leaves this file in the run's folder when it killed CBC


def _guard(path: str, wait_s: float | None, folder: str) -> str:
    """The executable PuLP starts: CBC itself without a time limit (or on Windows), else a launcher in the run's
    folder that kills CBC after `wait_s` and leaves GIVEN_UP there (exit 124, which PuLP reports as a failure)."""
    if wait_s is None or os.name == "nt":
        return path
    script = os.path.join(folder, "guard.py")
    with open(script, "w") as handle:
        handle.write(f"import subprocess, sys\n"
                     f"try:\n"
                     f"    sys.exit(subprocess.run([{path!r}] + sys.argv[1:], timeout={wait_s!r}).returncode)\n"
                     f"except subprocess.TimeoutExpired:\n"
                     f"    open({os.path.join(folder, GIVEN_UP)!r}, 'w').close()\n"
                     f"    sys.exit(124)\n")
    launcher = os.path.join(folder, "cbc-guarded")
    with open(launcher, "w") as handle:  # a short shebang: the interpreter's own path may be long
        handle.write(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(script)} \"$@\"\n")
    os.chmod(launcher, 0o755)
    return launcher


def _result(program, lp, xs, report: dict, wall_time_s: float) -> BackendResult:
    import pulp

    scale = program.time_unit_s / program.objective_divisor
    have = lp.sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible)
    values = [x.value() or 0.0 for x in xs] if have else None
    objective = pulp.value(lp.objective) * scale if have else None
    proven = (have and lp.sol_status == pulp.LpSolutionOptimal
              and (report["result"] or "").startswith("Optimal solution found"))
    if proven:
        return BackendResult("optimal", values, objective, objective, wall_time_s)
    if have:
        bound = None
        if report["bound"] is not None:  # CBC's objective may lack the program's constant: offset by what it saw
            seen = report["objective"]
            offset = pulp.value(lp.objective) - seen if seen is not None else program.objective_constant
            bound = min((report["bound"] + offset) * scale, objective)
        return BackendResult("feasible", values, objective, bound, wall_time_s)
    if lp.status == pulp.LpStatusInfeasible:
        return BackendResult("infeasible", None, None, None, wall_time_s)
    return BackendResult("timeout", None, None, None, wall_time_s)
