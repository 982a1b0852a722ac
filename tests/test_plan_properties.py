"""Properties of whole plans over generated valid instances (hypothesis).

- the loader round-trips: the same instance as JSON, as YAML and in memory loads to the same cluster and
  scores the same; a plan's placement written with `to_dict` reads back identical;
- every plan returned fits and its reported time and objective are `evaluate()`'s;
- the optimum never gets faster when a link gets slower;
- the same seed gives the same plan.
Examples per property: PLAN_EXAMPLES (default 12; the solver runs inside every example).
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import build_instance
from formulation import evaluate, load_instance
from formulation.placement_file import load_placement
from solvers import solve
from test_properties import instance_dicts, placements, with_slower_link

PLAN = settings(max_examples=int(os.environ.get("PLAN_EXAMPLES", 12)), deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def small_search(data: dict) -> dict:
    """Keep each solve to a fraction of a second: fewer recompute / sharding / micro-batch choices."""
    data["training"].update(recompute=["none", "full"], zero_stage=[1], max_micro_batch_size=2,
                            virtual_pipeline_sizes=[1, 2])
    return data


def plan_instances():
    return instance_dicts(max_nodes=2, gpus_per_node=(2, 4)).map(small_search)


@PLAN
@given(data=instance_dicts(max_nodes=3), pick=st.data())
def test_instance_loads_the_same_from_json_yaml_and_memory(tmp_path_factory, data, pick):
    folder = tmp_path_factory.mktemp("roundtrip")
    (folder / "i.json").write_text(json.dumps(data))
    (folder / "i.yaml").write_text(yaml.safe_dump(data))
    loaded = [build_instance(data), load_instance(folder / "i.json"), load_instance(folder / "i.yaml")]
    for other in loaded[1:]:
        assert other.model == loaded[0].model and other.training == loaded[0].training
        assert np.array_equal(other.cluster.inter_gb_per_s, loaded[0].cluster.inter_gb_per_s)
        assert all(np.array_equal(a, b) for a, b in zip(other.cluster.intra_gb_per_s, loaded[0].cluster.intra_gb_per_s))
    placement = pick.draw(placements(loaded[0]))
    times = {evaluate(inst, placement).iteration_time_s for inst in loaded}
    assert len(times) == 1
    # the placement as the plan file writes it reads back identical
    path = folder / "placement.json"
    path.write_text(json.dumps(placement.to_dict(loaded[0].cluster)))
    assert load_placement(path, loaded[0]) == placement


@PLAN
@given(data=plan_instances())
def test_every_plan_fits_and_reports_the_evaluators_time(data):
    instance = build_instance(data)
    result = solve(instance, seed=3)
    est = evaluate(instance, result.placement)
    assert est.fits
    assert result.estimate.iteration_time_s == pytest.approx(est.iteration_time_s, rel=1e-12)
    assert result.solver.objective_s == pytest.approx(est.iteration_time_s, rel=1e-6)
    assert result.solver.bound_s <= est.iteration_time_s * (1 + 1e-9)
    for placement, alternative in result.alternatives:
        assert evaluate(instance, placement).fits and alternative.fits


@PLAN
@given(data=plan_instances(), pick=st.data())
def test_the_optimum_never_gets_faster_when_a_link_gets_slower(data, pick):
    instance = build_instance(data)
    slower = build_instance(with_slower_link(data, instance, pick.draw))
    before, after = solve(instance), solve(slower)
    assert before.solver.status == after.solver.status == "optimal"
    assert after.estimate.iteration_time_s >= before.estimate.iteration_time_s * (1 - 1e-9)


@PLAN
@given(data=plan_instances(), seed=st.integers(0, 2 ** 31 - 1))
def test_same_seed_same_plan(data, seed):
    instance = build_instance(data)
    first, second = solve(instance, seed=seed), solve(instance, seed=seed)
    assert first.placement == second.placement
    assert first.estimate.iteration_time_s == second.estimate.iteration_time_s
