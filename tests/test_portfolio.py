"""The backend `auto` stands for when CP-SAT and CBC are both installed (solvers/backends/portfolio.py): CP-SAT
first, CBC for a program CP-SAT has not closed within FIRST_TRY_S; a proof only from the backend that proves."""

from __future__ import annotations

import math
import time

import pytest

from solvers import backends, solve
from solvers.backends import BackendResult, portfolio
from test_backends import market_split

needs_both = pytest.mark.skipif(not portfolio.available(), reason="needs CP-SAT and CBC")


def _fake(monkeypatch, name: str, result: BackendResult | None, calls: list, sleep_s: float = 0.0) -> None:
    """Replace backend `name`'s solve: record its time limit, sleep, return `result` (None: fail if called)."""
    def solve_(program, time_limit_s=None, threads=1, seed=0):
        assert result is not None, f"{name} should not have been called"
        calls.append((name, time_limit_s))
        time.sleep(sleep_s)
        return result
    monkeypatch.setattr(backends.get(name), "solve", solve_)


@needs_both
def test_auto_is_the_portfolio_when_both_are_installed():
    assert backends.automatic() == portfolio.NAME
    assert backends.get(portfolio.NAME) is portfolio


@needs_both
def test_a_program_cp_sat_closes_never_reaches_cbc(monkeypatch):
    calls: list = []
    _fake(monkeypatch, "cbc", None, calls)
    out = portfolio.solve(market_split(rows=1, cols=6), time_limit_s=30.0)
    assert out.status == "optimal" and out.values is not None and calls == []


@needs_both
def test_a_program_cp_sat_leaves_open_goes_to_cbc_for_the_rest_of_its_limit(monkeypatch):
    calls: list = []
    _fake(monkeypatch, "cpsat", BackendResult("timeout", None, None, None, 0.2), calls, sleep_s=0.2)
    monkeypatch.setattr(backends.get("cbc"), "solve", _recording(backends.get("cbc").solve, calls, "cbc"))
    out = portfolio.solve(market_split(rows=1, cols=8, seed=3), time_limit_s=30.0)
    assert out.status == "optimal" and out.bound_s == out.objective_s  # CBC's proof
    assert calls[0] == ("cpsat", portfolio.FIRST_TRY_S)
    assert calls[1][0] == "cbc" and 20.0 < calls[1][1] <= 30.0 - 0.2  # what CP-SAT left of the 30 s
    assert "CP-SAT timeout" in out.message and "CBC optimal" in out.message


def _recording(real, calls, name):
    def solve_(program, time_limit_s=None, threads=1, seed=0):
        calls.append((name, time_limit_s))
        return real(program, time_limit_s=time_limit_s, threads=threads, seed=seed)
    return solve_


@needs_both
def test_a_short_limit_goes_to_cp_sat_alone(monkeypatch):
    calls: list = []
    _fake(monkeypatch, "cpsat", BackendResult("timeout", None, None, None, 0.1), calls, sleep_s=0.1)
    _fake(monkeypatch, "cbc", None, calls)  # 0.45 s of a 0.55 s limit left, under MIN_SECOND_TRY_S: no CBC
    out = portfolio.solve(market_split(rows=1, cols=4), time_limit_s=0.55)
    assert calls == [("cpsat", 0.55)]
    assert out.status == "timeout" and out.values is None


@needs_both
def test_neither_proving_gives_the_better_solution_and_the_larger_bound_never_a_proof(monkeypatch):
    calls: list = []
    _fake(monkeypatch, "cpsat", BackendResult("feasible", [1.0], 2.0, 1.0, 5.0), calls)
    _fake(monkeypatch, "cbc", BackendResult("feasible", [0.0], 1.5, 0.8, 20.0), calls)
    out = portfolio.solve(market_split(rows=1, cols=4), time_limit_s=60.0)
    assert (out.status, out.values, out.objective_s, out.bound_s) == ("feasible", [0.0], 1.5, 1.0)
    # and without any solution: no values, the better bound, no claim
    _fake(monkeypatch, "cpsat", BackendResult("timeout", None, None, 1.2, 5.0), calls)
    _fake(monkeypatch, "cbc", BackendResult("error", None, None, None, 0.1, "CBC failed: killed"), calls)
    out = portfolio.solve(market_split(rows=1, cols=4), time_limit_s=60.0)
    assert (out.status, out.values, out.bound_s) == ("timeout", None, 1.2)
    assert "CBC failed: killed" in out.message


@needs_both
def test_infeasible_from_cp_sat_is_final(monkeypatch):
    calls: list = []
    _fake(monkeypatch, "cpsat", BackendResult("infeasible", None, None, None, 0.1), calls)
    _fake(monkeypatch, "cbc", None, calls)
    assert portfolio.solve(market_split(rows=1, cols=4)).status == "infeasible"


@needs_both
@pytest.mark.slow
def test_a_one_way_instance_cp_sat_alone_leaves_open_is_proven():
    """tests/test_oneway_uneven.py's generator at seed 111 (1 x 4 GPUs, one-way pairs): with CP-SAT alone `solve`
    ended after 138 s with two programs unclosed (auto's 60 s per program) at a gap of 8.4 %; CBC closes them.
    With the portfolio: optimal, the brute-force minimum, in about 14 s."""
    from test_oneway_uneven import optima
    instance, best = optima(111, False)
    result = solve(instance, method="exact")  # no per-program wall-clock limit, whatever the machine's load
    assert result.solver.method == f"exact-{portfolio.NAME}"
    assert result.solver.status == "optimal", result.solver
    assert result.estimate.iteration_time_s == pytest.approx(min(best.values()), rel=1e-6)
    assert not math.isnan(result.solver.bound_s)
