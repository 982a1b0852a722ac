"""The search on the largest shipped rack instance (docs/racks.md, "Where the 120 s of gb300_nvl72_4608 go"): once
(B1) and (B2) are raised for every configuration that could beat the best default placement, the bound is within
2 % of that placement. Without a time limit the first pass and the bounds run to the end, so this does not depend
on the machine's speed (the timed run reaches the same bound when the bounds complete inside half its limit)."""

from __future__ import annotations

import pytest
from conftest import REPO

from formulation import load_instance
from solvers.search.uniform import search


@pytest.mark.slow
def test_gb300_nvl72_4608s_bounds_leave_its_best_default_placement_within_two_percent():
    instance = load_instance(REPO / "instances" / "gb300_nvl72_4608.json")
    result = search(instance, exact=False, anneal_moves=0, refine=False)
    best = result.ranked[0].estimate.iteration_time_s
    assert result.candidates == 732
    assert result.bound_s <= best
    assert (best - result.bound_s) / best < 0.02
    assert result.candidates - result.pruned <= 3  # (B1) closes all but the plan's own configuration or so
