"""Search quality beyond the exact program (solvers/search/close_gap.py): where the bound says the optimum may
be, the planner must look. tests/repro/search_irregular_8x8*.json: 64 GPUs with leaf blocks, slow NICs, a
congested pair and a slower NVLink node, where a plain local search once beat the planner by 8.3% in another
configuration (the one with the lowest bound), found only by annealing configurations in bound order."""

from __future__ import annotations

from pathlib import Path

import pytest

from formulation import evaluate, load_instance
from formulation.placement_file import load_placement
from solvers import solve

REPRO = Path(__file__).parent / "repro"


@pytest.fixture(scope="module")
def irregular():
    instance = load_instance(REPRO / "search_irregular_8x8.json")
    better = evaluate(instance, load_placement(REPRO / "search_irregular_8x8_better.json", instance))
    # 2.1630 s when the repro was filed; 2.0634 s once the GEMM shape and attention efficiency became catalog
    # facts and collectives ran at NCCL's share of nominal link speed; 2.1526 s since an overlapped dp sync
    # costs at least half its time (imperfect_dp_overlap, docs/physics.md); 2.1782 s since every iteration pays
    # the fitted per-iteration overhead (iteration_overhead, with the efficiencies refitted); 2.1772 s with the
    # refit with fp8_small_gemms (0.059 -> 0.056 s of overhead); 2.1872 s since the fits take Huber's loss and
    # torchtitan's float8 rows (0.067 s), unchanged at 0.068 s with the sixth session's ten rows; 2.1863 s with
    # the seventh session's four 405B rows (0.065 s, H100 0.74 -> 0.7395); 2.1461 s since a ring across nodes
    # runs both levels at once (rail_ring, with the refit: 0.064 s, H100 0.736); 2.1451 s with H100's causal
    # attention figure from FA2's forward and backward and the non-causal ring steps (0.061 s, H100 0.747); 2.1480 s
    # with IBM's fms-fsdp runs in the fits (0.067 s, H100 0.7485); 2.1512 s with NCCL's tuning model for the
    # collectives (docs/collectives.md) and the refit (H100 0.75); 2.1532 s with the refit after torchtitan's
    # pipelined FSDP sync once per step (0.070 s, H100 0.7505); 2.1512 s again with the refit after fms-fsdp's eager
    # rotary embedding (0.067 s, H100 0.75): a pin, so that a model change is noticed here
    assert better.fits and better.iteration_time_s == pytest.approx(2.1512, abs=1e-4)
    return instance, better


def test_annealing_the_configuration_the_bound_favours_finds_the_better_placement(irregular):
    """The better placement's configuration is the one with the lowest lower bound; annealed from its default
    map for the moves the search gives each configuration, it gets there (deterministic per seed)."""
    from solvers.bounds.configs import lower_bound
    from solvers.local.annealing import anneal
    from solvers.search.close_gap import ANNEAL_MOVES

    instance, better = irregular
    config = load_placement(REPRO / "search_irregular_8x8_better.json", instance).config
    found = anneal(instance, config, seed=0, max_moves=ANNEAL_MOVES)
    assert found.estimate.iteration_time_s <= better.iteration_time_s * (1 + 1e-9)
    assert lower_bound(instance, config) <= found.estimate.iteration_time_s


@pytest.mark.slow
def test_planner_at_least_as_good_as_the_better_placement_on_irregular_8x8(irregular):
    """The whole search without a time limit (about 15-20 s on 2 shared cores)."""
    instance, better = irregular
    result = solve(instance, seed=0)  # no time limit: move counts, deterministic
    assert result.estimate.iteration_time_s <= better.iteration_time_s * (1 + 1e-9)
    assert evaluate(instance, result.placement).iteration_time_s == pytest.approx(result.estimate.iteration_time_s,
                                                                                  rel=1e-9)
    # the gap that remains is honest: the bound is below the plan and within 3.5 % of it here (3.2 % since an
    # overlapped dp sync costs at least half its time and 1.9 % before, with collectives at NCCL's share of line
    # rate; 0.8 % before that: communication, where the bound takes the best links, weighs more each time)
    assert result.solver.bound_s <= result.estimate.iteration_time_s
    assert result.solver.gap < 0.035
    # the improvements are recorded over time (seconds, best so far), each better than the last
    times = [t for t, _ in result.history]
    values = [v for _, v in result.history]
    assert times == sorted(times) and values == sorted(values, reverse=True) and values[-1] == pytest.approx(
        result.estimate.iteration_time_s)


def test_warm_continuation_starts_cooler():
    """`warm`: a continuation of an annealed plan starts part-way down the cooling schedule (the search's
    deepening anneals, solvers/search/close_gap.py): fewer uphill moves taken than re-heated, never worse than
    its start, deterministic per seed."""
    from conftest import H100_128
    from formulation.space import Config
    from solvers.local.annealing import anneal
    h100 = load_instance(H100_128)
    config = Config(4, 4, 2, 4, 5, 1, "none", 1)
    first = anneal(h100, config, seed=3, max_moves=1500)
    hot = anneal(h100, config, seed=4, max_moves=1500, start=first.placement)
    warm = anneal(h100, config, seed=4, max_moves=1500, start=first.placement, warm=0.5)
    again = anneal(h100, config, seed=4, max_moves=1500, start=first.placement, warm=0.5)
    assert warm.placement == again.placement and warm.accepted == again.accepted
    assert warm.estimate.iteration_time_s <= first.estimate.iteration_time_s
    assert warm.accepted < hot.accepted


def test_gap_rounds_with_no_time_for_an_anneal_return_at_once(monkeypatch):
    """Phase 2 starts no anneal with less than MIN_ANNEAL_S left: it returns instead of cycling through rounds of
    anneals that each return at once until its end (measured_64 at 10 s lost about 1 s so, and the final
    share that followed was then too short for the descent)."""
    import time

    import solvers.search.close_gap as close_gap
    from solvers.search.uniform import SearchResult, _enumerate
    from conftest import REPO
    instance = load_instance(REPO / "instances" / "small_2x4.json")
    candidates, result = [], SearchResult(method="test")
    _enumerate(instance, candidates, result, float("inf"), 1)
    calls = []
    monkeypatch.setattr(close_gap, "_anneal", lambda *a, **k: calls.append(a) or False)
    close_gap._rounds(instance, candidates, result, 0, 1, None, "cpsat", set(),
                      time.perf_counter() + close_gap.MIN_ANNEAL_S / 2, 1_000_000, float("inf"))
    assert calls == []


def test_a_plan_the_bounds_prove_is_not_annealed(monkeypatch):
    """Once the global bound meets the plan (small_2x4 under bound-only: the bounds of every configuration reach
    it), no anneal, descent or node-order search runs (close_gap.settled): a time limit is not spent proving what
    is proven. The report says why the search ended."""
    import solvers.search.close_gap as close_gap
    from conftest import REPO

    calls = []
    for name in ("anneal", "slot_anneal", "polish"):
        monkeypatch.setattr(close_gap, name, lambda *a, name=name, **k: calls.append(name))
    result = solve(load_instance(REPO / "instances" / "small_2x4.json"), method="bound-only", time_limit=600)
    assert result.solver.status == "optimal" and calls == []
    assert result.solver.note.endswith("the bound meets the plan, so the search ended there")


def test_settled_asks_every_reported_plan_to_be_proven():
    """With --top K a configuration among the K best must have its bound at its own time, the others at the K-th
    best; a bound 1e-6 short of that (the reported gap's "optimal") counts as met."""
    from formulation.space import Config
    from solvers.search.close_gap import settled
    from solvers.search.uniform import Candidate

    def cand(tp, bound, value):
        return Candidate(Config(tp, 1, 1, 8 // tp, 1, 1, "none", 1), bound, value=value)

    first, second, third = cand(1, 10.0, 10.0), cand(2, 11.0, 12.0), cand(4, 12.0, None)
    assert settled([first, second, third], 1)  # 11 and 12 cannot beat 10
    assert not settled([first, second, third], 2)  # the second best (12) may still fall to 11
    second.lower_bound = 12.0 * (1 - 1e-7)
    assert settled([first, second, third], 2)
    third.lower_bound = 11.9
    assert not settled([first, second, third], 2)  # the third may still beat the second
