"""The backends' statuses: a proof only from a solver status that proves.

A market-split program (Cornuéjols and Dawande, 1999: a few equality rows of random weights over binaries,
each with a slack pair, minimise the slacks) is tiny to state and notoriously hard for LP-based branch and
bound: any assignment is feasible, so a solver stopped at its time limit holds an incumbent, and its LP bound
is far below it. CBC stopped there must say feasible with a bound below its incumbent, never optimal.
"""

from __future__ import annotations

import random
import warnings

import pytest

from conftest import Stall
from formulation.programs.mip import Program
from solvers import backends
from solvers.backends import cbc

AVAILABLE = backends.available()
needs_cbc = pytest.mark.skipif(not AVAILABLE["cbc"], reason="cbc not installed")


def market_split(rows: int = 4, cols: int = 30, seed: int = 0, constant: float = 7.0) -> Program:
    rng = random.Random(seed)
    prog = Program()
    x = [prog.var(f"x{j}", "binary") for j in range(cols)]
    for i in range(rows):
        weights = [rng.randint(0, 99) for _ in range(cols)]
        over, under = prog.var(f"over{i}"), prog.var(f"under{i}")
        prog.add({**{x[j]: weights[j] for j in range(cols)}, over: 1, under: -1}, "==", sum(weights) // 2, "split")
        prog.objective[over] = prog.objective[under] = 1
    prog.objective_constant = constant
    return prog


@needs_cbc
def test_cbc_stopped_at_its_time_limit_is_feasible_with_its_bound():
    prog = market_split()
    out = cbc.solve(prog, time_limit_s=1.0)
    assert out.status == "feasible", out
    assert out.values is not None and out.objective_s is not None
    # the bound is CBC's, shifted by the constant CBC does not see: at least the constant, at most the incumbent
    assert out.bound_s is not None
    assert prog.objective_constant * prog.time_unit_s * (1 - 1e-9) <= out.bound_s <= out.objective_s  # float offset
    assert out.bound_s < out.objective_s  # nothing proven: the gap is open
    # the incumbent is what its values say
    recomputed = sum(c * out.values[i] for i, c in prog.objective.items()) + prog.objective_constant
    assert out.objective_s == pytest.approx(recomputed * prog.time_unit_s)


@needs_cbc
def test_cbc_proves_a_small_program_and_says_so():
    prog = market_split(rows=1, cols=8, seed=3)
    out = cbc.solve(prog, time_limit_s=60)
    assert out.status == "optimal"
    assert out.bound_s == out.objective_s


def test_cbc_log_report_is_read():
    text = ("Result - Stopped on time limit\n\nObjective value:                11.00000000\n"
            "Lower bound:                    0.500\nGap:                            inf\n")
    assert cbc.read_log(text) == {"result": "Stopped on time limit", "objective": 11.0, "bound": 0.5}
    assert cbc.read_log("nothing useful") == {"result": None, "objective": None, "bound": None}


@needs_cbc
def test_cbc_backend_uses_no_deprecated_pulp_api():
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        assert cbc.available()
        assert cbc.solve(market_split(rows=1, cols=4), time_limit_s=30).status == "optimal"


@pytest.mark.skipif(not AVAILABLE["cpsat"], reason="cpsat not installed")
def test_search_refuses_an_optimum_the_evaluator_does_not_confirm(monkeypatch):
    """A backend whose objective is not the evaluator's score of its answer proves nothing: the search keeps
    the plan but not the proof (this is how one-way links once produced a false "optimal")."""
    from dataclasses import replace
    from pathlib import Path

    from formulation import load_instance
    from solvers import solve
    from solvers.backends import cpsat

    real = cpsat.solve

    def mispriced(program, **kwargs):
        out = real(program, **kwargs)
        if out.status != "optimal":
            return out
        return replace(out, objective_s=out.objective_s * 0.9, bound_s=out.bound_s * 0.9)

    monkeypatch.setattr(cpsat, "solve", mispriced)
    instance = load_instance(Path(__file__).resolve().parent / "repro" / "false_proof_asym_1x4.json")
    result = solve(instance, solver="cpsat")
    assert result.solver.status != "optimal"
    assert result.solver.bound_s < result.estimate.iteration_time_s * (1 - 1e-6)
    assert result.estimate.fits


@needs_cbc
def test_cbc_that_ignores_its_time_limit_is_given_up_as_a_timeout(monkeypatch, tmp_path):
    """A CBC that does not stop at its limit (here a stand-in that would sleep 10 minutes) is killed at the limit
    plus the grace: a timeout without values, in a second or two. PuLP alone waits for it. What shows it whatever
    the machine's load: the stand-in leaves a file when it ends by itself, and it never did."""
    import os
    hung, finished = tmp_path / "cbc", tmp_path / "finished"
    hung.write_text(f"#!/bin/sh\nsleep 600\ntouch {finished}\n")
    os.chmod(hung, 0o755)
    monkeypatch.setattr(cbc, "cbc_path", lambda: str(hung))
    out = cbc.solve(market_split(rows=1, cols=4), time_limit_s=0.3)
    assert out.status == "timeout" and out.values is None and out.bound_s is None
    assert "given up" in out.message
    assert not finished.exists()  # killed, not waited for


needs_cpsat = pytest.mark.skipif(not AVAILABLE["cpsat"], reason="OR-Tools not installed")


@needs_cpsat
def test_cpsat_that_ignores_its_time_limit_is_given_up_as_a_timeout(monkeypatch):
    """A CP-SAT solve that does not return at its limit (a stall in one long search step, as seen on
    tests/test_exact.py's seed 6: 20 s under a 2 s limit; here a solve that sleeps 30 s) is given up at the
    limit plus the grace: a timeout without values, never a claim, in a few seconds rather than 30."""
    from ortools.sat.python import cp_model

    from solvers.backends import cpsat
    stall = Stall(cp_model.OPTIMAL)
    monkeypatch.setattr(cp_model.CpSolver, "Solve", stall)
    try:
        out = cpsat.solve(market_split(rows=1, cols=4), time_limit_s=0.2)
        assert stall.still_running()  # the caller had its answer while the stalled solve went on: given up
    finally:
        stall.release()
    assert out.status == "timeout" and out.values is None and out.bound_s is None
    assert "given up" in out.message


@needs_cpsat
def test_cpsat_errors_in_its_thread_reach_the_caller(monkeypatch):
    from ortools.sat.python import cp_model

    from solvers.backends import cpsat

    def broken(self, model, *a, **k):
        raise RuntimeError("solver crashed")

    monkeypatch.setattr(cp_model.CpSolver, "Solve", broken)
    with pytest.raises(RuntimeError, match="solver crashed"):
        cpsat.solve(market_split(rows=1, cols=4), time_limit_s=5.0)


@needs_cpsat
def test_cpsat_with_and_without_a_time_limit_gives_the_same_proof():
    from solvers.backends import cpsat
    prog = market_split(rows=1, cols=6)
    free, limited = cpsat.solve(prog), cpsat.solve(prog, time_limit_s=30.0)
    assert free.status == limited.status == "optimal"
    assert free.objective_s == limited.objective_s and free.values == limited.values


@needs_cpsat
@pytest.mark.parametrize("time_limit_s", [20.0, None])
def test_ctrl_c_during_a_cp_sat_solve_reaches_the_caller(monkeypatch, time_limit_s):
    """Ctrl-C while CP-SAT runs in its thread, with or without a limit: the caller gets KeyboardInterrupt at once
    (the search then ends with its best plan), also when the signal lands on another thread than the waiting
    one. CP-SAT's own SIGINT catching used to end only the solve: a Ctrl-C during seed 6's 20 s solve let the
    search run on to "optimal" 23 s later."""
    import signal
    import threading

    from ortools.sat.python import cp_model

    from solvers.backends import cpsat
    stall = Stall(cp_model.OPTIMAL)
    monkeypatch.setattr(cp_model.CpSolver, "Solve", stall)
    # Python's own Ctrl-C handler, as in a terminal: a process started in the background (CI's runner, nohup)
    # inherits SIGINT ignored, and Python then installs none
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Timer(0.3, signal.raise_signal, args=(signal.SIGINT,)).start()  # raised in the timer's thread
        with pytest.raises(KeyboardInterrupt):
            cpsat.solve(market_split(rows=1, cols=4), time_limit_s=time_limit_s)
        assert stall.still_running()  # at once: not after the solve ended by itself
    finally:
        stall.release()
        signal.signal(signal.SIGINT, previous)
