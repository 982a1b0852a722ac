"""Solver faults and early stops: each ends with the best plan so far and an honest status, or a clear error,
and nothing half-written.

Cases: the CBC binary missing; CBC killed (SIGKILL) mid-solve; CP-SAT answering UNKNOWN and MODEL_INVALID;
a time limit of 0.1 s; Ctrl-C (SIGINT) during a long search, before and after a first plan exists.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import H100_128, REPO, JumpingClock, build_instance

H100_1024 = REPO / "instances" / "h100_1024.json"  # searched for several seconds: time to interrupt it
from formulation import evaluate
from solvers import backends, solve
from solvers.search.driver import NoPlanInTime
from solvers.search.uniform import search

pulp = pytest.importorskip("pulp")


def _fake_cbc(monkeypatch, path: str) -> None:
    """Make the CBC backend run `path` instead of the installed CBC binary."""
    from solvers.backends import cbc
    monkeypatch.setattr(cbc, "cbc_path", lambda: path)


def _small():
    """4 GPUs, every pair its own bandwidth: bounds alone do not settle it, so programs are solved."""
    from test_exact import small_instance
    return build_instance(small_instance(1)[0])


def _assert_honest_plan(instance, result) -> None:
    est = evaluate(instance, result.placement)  # the plan is valid and scored by the referee
    assert est.fits
    assert result.estimate.iteration_time_s == pytest.approx(est.iteration_time_s, rel=1e-9)
    s = result.solver
    assert s.status != "optimal"
    assert s.bound_s <= s.objective_s * (1 + 1e-9)
    assert s.gap > 0


@pytest.mark.parametrize("binary", ["missing", "killed"])
def test_cbc_failure_keeps_the_best_default_plan_and_says_so(monkeypatch, tmp_path, binary):
    if binary == "missing":
        path = str(tmp_path / "no-such-cbc")
    else:
        path = str(tmp_path / "cbc")
        with open(path, "w") as f:
            f.write("#!/bin/sh\nkill -9 $$\n")
        os.chmod(path, 0o755)
    _fake_cbc(monkeypatch, path)
    system_tmp = tmp_path / "system-tmp"  # where PuLP would put its files (it reads TMPDIR)
    system_tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(system_tmp))
    instance = _small()
    result = solve(instance, solver="cbc")
    _assert_honest_plan(instance, result)
    assert "solver failure" in result.solver.note and "CBC failed" in result.solver.note
    assert list(system_tmp.iterdir()) == []  # a failed CBC leaves no model file behind


def test_a_hung_cbc_cannot_hold_the_search_past_its_time_limit(monkeypatch, tmp_path):
    """`solve --backend cbc --time-limit 2` with a CBC that never returns: the plan so far (the best default
    placement), no claim, in seconds; without the guard PuLP waited the hung binary out. The stand-in would run
    10 minutes and leave a file when it ends by itself: it never does, whatever the machine's load."""
    hung, finished = tmp_path / "cbc", tmp_path / "finished"
    hung.write_text(f"#!/bin/sh\nsleep 600\ntouch {finished}\n")
    os.chmod(hung, 0o755)
    _fake_cbc(monkeypatch, str(hung))
    instance = _small()
    result = solve(instance, solver="cbc", time_limit=2)
    assert not finished.exists()
    _assert_honest_plan(instance, result)


def test_cbc_failure_result_reaches_the_backend_contract(monkeypatch, tmp_path):
    _fake_cbc(monkeypatch, str(tmp_path / "absent"))
    from formulation.programs.exact import build_program
    from formulation.space import configurations
    instance = _small()
    program = build_program(instance, next(iter(configurations(instance))))
    out = backends.get("cbc").solve(program, time_limit_s=5)
    assert out.status == "error" and out.values is None and out.message.startswith("CBC failed")


@pytest.mark.skipif(not backends.available()["cpsat"], reason="OR-Tools not installed")
@pytest.mark.parametrize("code", ["UNKNOWN", "MODEL_INVALID"])
def test_cpsat_without_an_answer_keeps_the_best_default_plan(monkeypatch, code):
    from ortools.sat.python import cp_model
    monkeypatch.setattr(cp_model.CpSolver, "solve", lambda self, model, *a, **k: getattr(cp_model, code))
    monkeypatch.setattr(cp_model.CpSolver, "Solve", lambda self, model, *a, **k: getattr(cp_model, code))
    instance = _small()
    result = solve(instance, solver="cpsat")
    _assert_honest_plan(instance, result)
    if code == "MODEL_INVALID":
        assert "CP-SAT rejected the model" in result.solver.note


def test_a_limit_that_has_passed_returns_the_first_plan_with_the_work_bound(monkeypatch):
    """The h100_128 search takes seconds. With every deadline already passed (the clock jumps 100 s per
    reading, as on a loaded machine given 0.1 s) it stops enumerating at the first fitting plan, not before it,
    and bounds every configuration it did not reach by its work bound (B0) instead of claiming no bound."""
    import solvers.search.uniform as search_module
    from formulation import load_instance
    from formulation.space import configurations
    from solvers.bounds.work import WorkBound
    instance = load_instance(H100_128)
    monkeypatch.setattr(search_module, "time", JumpingClock())
    found = search(instance, solver="cpsat", time_limit_s=0.1, exact=False)
    assert found.stopped == "time limit" and found.status == "timeout"
    assert found.candidates < len(list(configurations(instance)))  # stopped early, after the first plan
    # every term of the bound is some configuration's (B0) or the plan itself
    floor = min(WorkBound(instance)(c) for c in configurations(instance))
    assert 0.0 < floor <= found.bound_s <= found.ranked[0].estimate.iteration_time_s
    assert evaluate(instance, found.ranked[0].placement).fits


def _no_default_fits():
    """small_instance(40) with 1.79 GiB GPUs: some uneven partitions fit, no configuration's default (even) split
    does, so every plan has to come from a partition program."""
    from test_exact import small_instance
    data = small_instance(40)[0]
    data["cluster"]["gpu_types"] = {"h100-sxm-80gb": {"memory_gib": 1.79, "runtime_overhead_gib": 1.0}}
    return build_instance(data)


def test_no_plan_at_all_within_the_limit_is_a_clear_error(monkeypatch):
    """Without a fitting default placement the first pass runs to its end and only then does the limit stop
    the programs: no plan, and an error that says so (the same instance with time has a plan)."""
    import solvers.search.uniform as search_module
    instance = _no_default_fits()
    assert search(instance, solver="cpsat").ranked[0].estimate.fits
    monkeypatch.setattr(search_module, "time", JumpingClock())
    with pytest.raises(NoPlanInTime, match="no plan within the time limit"):
        search(instance, solver="cpsat", time_limit_s=1.0)


def _interrupt_on_call(monkeypatch, n: int) -> None:
    """Ctrl-C arriving while the n-th configuration is checked for memory (deterministic, in process)."""
    import solvers.search.uniform as search_module
    real, calls = search_module._fits_somehow, [0]

    def fits(instance, config):
        calls[0] += 1
        if calls[0] == n:
            raise KeyboardInterrupt
        return real(instance, config)

    monkeypatch.setattr(search_module, "_fits_somehow", fits)


def _cli(argv) -> int:
    from solvers.outputs.cli import main
    with pytest.raises(SystemExit) as stop:
        main([str(a) for a in argv])
    return stop.value.code


def test_interrupt_before_any_plan_exits_130_and_writes_nothing(monkeypatch, tmp_path, capsys):
    _interrupt_on_call(monkeypatch, 1)
    output = tmp_path / "plan.json"
    assert _cli(["--instance", H100_128, "--output", output, "--quiet"]) == 130
    assert capsys.readouterr().err.strip() == "interrupted"
    assert not output.exists()


def test_interrupt_after_plans_exist_returns_the_best_so_far(monkeypatch, tmp_path, capsys):
    _interrupt_on_call(monkeypatch, 400)
    output = tmp_path / "plan.json"
    assert _cli(["--instance", H100_128, "--output", output, "--quiet"]) == 0
    plan = json.loads(output.read_text())
    # the configurations never reached keep their work bound (B0): a bound, weaker than a full search's
    assert plan["solver"]["status"] == "timeout" and 0.0 < plan["solver"]["bound_s"] <= plan["solver"]["objective_s"]
    assert "interrupted" in plan["solver"]["note"]


def _as_from_a_terminal() -> None:
    """A suite started in the background (`pytest &`, nohup, some CI runners) passes SIGINT on as ignored, and
    Python then installs no KeyboardInterrupt handler: the child would run to the end (30 s) and test nothing.
    A user's Ctrl-C reaches a `solve` started from a terminal with the default disposition; so does this one."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _interrupt_after(seconds: float, output):
    proc = subprocess.Popen([sys.executable, "-m", "solvers.outputs.entry", "--instance", str(H100_1024), "--quiet",
                             "--output", str(output)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=_as_from_a_terminal)
    time.sleep(seconds)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=1200)  # a hang guard only
    return proc.returncode, out, err


def test_ctrl_c_during_the_search_ends_with_the_plan_so_far(tmp_path):
    output = tmp_path / "plan.json"
    code, out, err = _interrupt_after(3.0, output)
    assert "Traceback" not in err
    if code == 130:  # the machine was slow: no plan existed yet, so nothing may be written
        assert err.strip() == "interrupted" and not output.exists()
        return
    assert code == 0, err
    plan = json.loads(output.read_text())  # complete JSON: written atomically
    assert plan["solver"]["status"] in ("timeout", "feasible", "optimal")
    if plan["solver"]["status"] == "timeout":
        assert "interrupted" in plan["solver"]["note"]
    assert not list(tmp_path.glob("*.tmp*")), "a temporary file was left behind"
