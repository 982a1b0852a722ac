"""The shipped 128-GPU instance end to end: the Megatron default placement, `solve --output`, and re-scoring
the written plan with `solve --evaluate`."""

from __future__ import annotations

import json
import math

import pytest

from conftest import H100_128, run_solve
from formulation import default_placement, evaluate, load_instance
from formulation.placement_file import load_placement

MEGATRON_DEFAULT = dict(tp=4, pp=4, cp=2, vpp=5, micro_batch_size=1, recompute="selective", zero_stage=1)
SOLVER_KEYS = {"method", "status", "objective_s", "bound_s", "gap", "wall_time_s", "seed"}


@pytest.fixture(scope="module")
def instance():
    return load_instance(H100_128)


@pytest.fixture(scope="module")
def plan_path(h100_cli_run):
    """The plan `solve --instance instances/h100_128.json --output ...` wrote (conftest.py: run once)."""
    return h100_cli_run / "cli_plan.json"


def test_instance_is_the_documented_cluster(instance):
    assert instance.cluster.num_gpus == 128
    assert len(instance.cluster.nodes) == 16
    assert instance.model.num_layers == 80 and instance.model.num_kv_heads == 8
    # the half-speed NIC of h100-05 caps every pair it is part of
    n5 = instance.cluster.node_index["h100-05"]
    assert max(instance.cluster.inter_gb_per_s[n5, j] for j in range(16) if j != n5) <= 24.0


def test_megatron_default_placement_evaluates_and_fits(instance):
    p = default_placement(instance, **MEGATRON_DEFAULT)
    assert p.dp == 4 and p.world_size == 128
    assert p.layers_per_stage == (20, 20, 20, 20)
    est = evaluate(instance, p)
    assert est.fits
    assert 0 < est.peak_memory_gib <= instance.training.memory_limit_fraction * 79.6
    assert est.num_micro_batches == 512 // (1 * 4)
    assert math.isclose(sum(est.breakdown.values()), est.iteration_time_s, rel_tol=1e-9)
    assert math.isclose(est.tokens_per_s, 512 * 8192 / est.iteration_time_s, rel_tol=1e-12)
    assert 0 < est.mfu < 1
    assert len(est.stages) == 4 and all(s.memory.fits for s in est.stages)


def test_plan_file_has_the_contract_keys(plan_path):
    plan = json.loads(plan_path.read_text())
    assert {"placement", "estimate", "solver"} <= set(plan)
    assert SOLVER_KEYS <= set(plan["solver"])
    solver = plan["solver"]
    assert solver["status"] in ("optimal", "feasible", "infeasible", "timeout")
    assert solver["seed"] == 0 and solver["wall_time_s"] >= 0
    assert math.isclose(solver["objective_s"], plan["estimate"]["iteration_time_s"], rel_tol=1e-9)
    if solver["bound_s"] is not None:
        assert solver["bound_s"] <= solver["objective_s"] * (1 + 1e-9)
    placement = plan["placement"]
    assert {"tp", "pp", "cp", "dp", "vpp", "micro_batch_size", "recompute", "zero_stage", "layers_per_stage",
            "gpus"} <= set(placement)
    assert len(placement["gpus"]) == placement["tp"] * placement["pp"] * placement["cp"] * placement["dp"]
    assert all(isinstance(g, str) and ":" in g for g in placement["gpus"])
    assert plan["estimate"]["fits"] is True


def test_plan_is_rescored_to_the_same_iteration_time_by_the_cli(plan_path):
    plan = json.loads(plan_path.read_text())
    result = run_solve("--instance", H100_128, "--evaluate", plan_path, "--json")
    assert result.returncode == 0, result.stderr
    rescored = json.loads(result.stdout)
    assert math.isclose(rescored["estimate"]["iteration_time_s"], plan["estimate"]["iteration_time_s"], rel_tol=1e-9)
    assert rescored["placement"] == plan["placement"]


def test_plan_is_rescored_to_the_same_estimate_in_process(instance, plan_path):
    plan = json.loads(plan_path.read_text())
    placement = load_placement(plan_path, instance)
    est = evaluate(instance, placement).to_dict()
    assert math.isclose(est["iteration_time_s"], plan["estimate"]["iteration_time_s"], rel_tol=1e-9)
    assert math.isclose(est["peak_memory_gib"], plan["estimate"]["peak_memory_gib"], rel_tol=1e-9)


def test_plan_is_no_slower_than_the_megatron_default(instance, plan_path):
    """The search covers the default configuration above, so its answer cannot be slower (if that one fits)."""
    plan = json.loads(plan_path.read_text())
    default = evaluate(instance, default_placement(instance, **MEGATRON_DEFAULT))
    assert plan["estimate"]["iteration_time_s"] <= default.iteration_time_s * (1 + 1e-9)


def test_the_reported_default_is_the_megatron_default_placement(h100, plan):
    """The comparison printed with every plan is against a real Megatron-style default placement (even split,
    ranks filled node by node), never a placement the search improved."""
    from formulation.placement import default_split

    placement, estimate = plan.default
    assert placement.gpus == tuple(range(placement.world_size))
    assert placement.layers_per_stage == default_split(h100.model.num_layers, placement.pp, placement.vpp)
    assert estimate.iteration_time_s == evaluate(h100, placement).iteration_time_s
    assert plan.estimate.iteration_time_s <= estimate.iteration_time_s
