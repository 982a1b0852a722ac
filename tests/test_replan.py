"""`solve replan`: the failed list, the survivors' cluster, the ranks that change their shard, the warm start and
the re-planned answer against a fresh `solve` of the reduced cluster (docs/replan.md)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import solvers
from conftest import REPO
from formulation import InputError, evaluate, load_instance
from formulation.inputs.failures import Survivors, parse_failed
from formulation.placement import Placement
from formulation.shards import ranks_moved, stage_layers
from solvers.search.replan import MOVE_TOLERANCE, fewest_moves, replan
from solvers.search.replan_warm import warm_starts
from test_malformed_inputs import run_cli

SMALL = REPO / "instances" / "small_2x4.json"


@pytest.fixture(scope="module")
def small():
    return load_instance(SMALL)


@pytest.fixture(scope="module")
def old_plan(small):
    """small_2x4's own optimum (exact, deterministic): tp=1 pp=2 dp=4 vpp=2, stage 0 on s01, stage 1 on s00."""
    return solvers.solve(small).placement


def test_failed_list_takes_nodes_and_single_gpus(small):
    assert parse_failed("s01", small.cluster) == (4, 5, 6, 7)
    assert parse_failed("s00:3, s01:0,s00:3", small.cluster) == (3, 4)
    assert parse_failed("s00:1,s01", small.cluster) == (1, 4, 5, 6, 7)


@pytest.mark.parametrize("text, phrase", [
    ("s09", "--failed: s09: unknown node 's09' (the instance lists 2 nodes: s00 ... s01)"),
    ("s00:4", "--failed: s00:4: GPU index '4' out of range: s00 has 4 GPUs (0 .. 3)"),
    ("s00:x", "--failed: s00:x: GPU index 'x' out of range"),
    ("s00,,s01:1", "found an empty entry"),
    ("s00,s01", "every one of the 8 GPUs failed"),
])
def test_failed_list_errors_name_the_flag_and_the_entry(small, text, phrase):
    with pytest.raises(InputError) as err:
        parse_failed(text, small.cluster)
    assert phrase in str(err.value)


def test_survivors_keep_their_links_and_a_partly_failed_node_keeps_its_other_gpus(small):
    surv = Survivors.of(small, parse_failed("s00:1", small.cluster))
    sub, to_original = surv.all
    # the node that lost a GPU comes after the whole one, with its 3 others
    assert [(n.name, n.num_gpus) for n in sub.cluster.nodes] == [("s01", 4), ("s00", 3)]
    assert list(to_original) == [4, 5, 6, 7, 0, 2, 3]
    cluster = small.cluster
    for a in range(sub.cluster.num_gpus):
        for b in range(sub.cluster.num_gpus):
            if a != b:
                assert sub.cluster.bandwidth(a, b) == cluster.bandwidth(int(to_original[a]), int(to_original[b]))
    # a world smaller than the survivors takes the first of them, the last node cut to what it needs
    part, first = surv.first(6)
    assert [(n.name, n.num_gpus) for n in part.cluster.nodes] == [("s01", 4), ("s00", 2)]
    assert list(first) == [4, 5, 6, 7, 0, 2]


def test_stage_layers_follow_megatron_interleaving():
    # 8 layers, 2 stages of 4, vpp 2: chunks of 2; stage 0 holds chunk 0 of each half (layers 0-1 and 4-5)
    assert stage_layers(8, (4, 4), 2) == [frozenset({0, 1, 4, 5}), frozenset({2, 3, 6, 7})]
    assert stage_layers(8, (3, 5), 1) == [frozenset({0, 1, 2}), frozenset({3, 4, 5, 6, 7})]


def test_stage_layers_follow_the_v_of_zbv_and_dualpipev():
    """Under a V schedule rank r holds virtual stages r and 2 pp - 1 - r (torchtitan's model parts): going from
    interleaved 1F1B to ZBV at the same split moves both ranks' second chunk."""
    from dataclasses import replace

    for schedule in ("zbv", "dualpipev"):
        assert stage_layers(8, (4, 4), 2, schedule) == [frozenset({0, 1, 6, 7}), frozenset({2, 3, 4, 5})]
    old = Placement(tp=1, pp=2, cp=1, dp=1, vpp=2, micro_batch_size=1, recompute="none", zero_stage=1,
                    layers_per_stage=(4, 4), gpus=(0, 1))
    assert ranks_moved(old, replace(old, schedule="zbv"), 8) == 2
    assert ranks_moved(old, replace(old, schedule="zero_bubble"), 8) == 0


def _plan(tp, pp, dp, gpus, layers):
    return Placement(tp=tp, pp=pp, cp=1, dp=dp, vpp=1, micro_batch_size=1, recompute="none", zero_stage=1,
                     layers_per_stage=layers, gpus=tuple(gpus))


def test_ranks_moved_on_a_hand_derived_example():
    """Old: tp 2, pp 2, dp 2 on GPUs 0-7 (rank = tp_i + 2 (dp_i + 2 pp_i)): GPUs 0-3 hold stage 0 (layers 0-15),
    4-7 stage 1 (16-31); tp index = GPU parity."""
    old = _plan(2, 2, 2, range(8), (16, 16))
    assert ranks_moved(old, _plan(2, 2, 1, [0, 1, 4, 5], (16, 16)), 32) == 0  # replica 0 kept in place
    assert ranks_moved(old, _plan(2, 2, 1, [2, 3, 6, 7], (16, 16)), 32) == 0  # replica 1: the same shards
    assert ranks_moved(old, _plan(2, 2, 1, [0, 1, 2, 3], (16, 16)), 32) == 2  # GPUs 2, 3 go from stage 0 to 1
    assert ranks_moved(old, _plan(2, 2, 1, [1, 0, 4, 5], (16, 16)), 32) == 2  # GPUs 0 and 1 swap tp index
    assert ranks_moved(old, _plan(2, 2, 1, [0, 1, 4, 5], (15, 17)), 32) == 4  # every stage's layers change
    assert ranks_moved(old, _plan(4, 1, 1, [0, 1, 2, 3], (32,)), 32) == 4  # another tp size: another slice
    assert ranks_moved(old, _plan(2, 2, 1, [0, 1, 8, 9], (16, 16)), 32) == 2  # GPUs that held nothing


@pytest.mark.parametrize("failed", ["s01", "s00:1", "s01:0,s01:1"])
def test_replan_equals_a_fresh_solve_of_the_reduced_cluster(small, old_plan, failed):
    """Within the exact program's reach both are proven optima; the replan's space holds the fresh solve's (every
    survivor used) and every smaller world, so it is never slower, and on these failures no smaller world wins."""
    gpus = parse_failed(failed, small.cluster)
    found = replan(small, old_plan, gpus)
    fresh = solvers.solve(Survivors.of(small, gpus).all[0])
    assert found.status == "optimal" and fresh.solver.status == "optimal"
    assert found.estimate.iteration_time_s == pytest.approx(fresh.estimate.iteration_time_s, rel=1e-6)
    assert not set(found.placement.gpus) & set(gpus)
    assert found.estimate.iteration_time_s == evaluate(small, found.placement).iteration_time_s
    assert found.bound_s <= found.estimate.iteration_time_s


def test_warm_start_never_worse_than_the_old_configuration_remapped():
    """On h100_128 with one node lost: the old configuration on its spare (a plan that leaves one node idle) or
    with a smaller dp is the first incumbent; the answer is never slower, with any time limit."""
    inst = load_instance(REPO / "instances" / "h100_128.json")
    old = Placement(tp=8, pp=4, cp=1, dp=2, vpp=1, micro_batch_size=1, recompute="full", zero_stage=1,
                    layers_per_stage=(20, 20, 20, 20), gpus=tuple(range(64)))
    check = replan(inst, old, parse_failed("h100-03", inst.cluster), time_limit_s=0.5, move_tolerance=0.0)
    labels = {label: est.iteration_time_s for label, _, est in check.warm}
    assert "spares" in labels and check.old_config_survives
    spares = check.spares_plan[0]
    assert not set(spares.gpus) & set(parse_failed("h100-03", inst.cluster))
    assert spares.config == old.config  # the same configuration, on the idle nodes' GPUs
    assert check.estimate.iteration_time_s <= min(labels.values())
    assert check.bound_s <= check.estimate.iteration_time_s
    # the spare node takes the failed node's 8 ranks, local index for local index: those 8 GPUs move, no other
    assert ranks_moved(old, spares, inst.model.num_layers) == 8
    # the smaller dp keeps replica 0 (nodes 0, 2, 4, 6: node = dp index + 2 x stage) in place: nothing moves
    smaller = next(p for label, p, _ in check.warm if label == "smaller dp")
    assert smaller.dp == 1 and ranks_moved(old, smaller, inst.model.num_layers) == 0
    # a tolerance between the two warm starts' slowdowns takes the spares, a wider one the smaller dp
    fastest = check.estimate.iteration_time_s
    middle = (labels["spares"] + labels["smaller dp"]) / 2 / fastest - 1
    assert labels["spares"] < labels["smaller dp"]
    for tolerance, expected, moved in ((middle, spares, 8), (10.0, smaller, 0)):
        assert fewest_moves(inst, old, check.placement, fastest, check.warm, tolerance)[::2] == (moved, expected)


def test_smaller_dp_warm_start_keeps_whole_replicas_in_place():
    inst = load_instance(REPO / "instances" / "h100_128.json")
    old = Placement(tp=8, pp=4, cp=1, dp=4, vpp=1, micro_batch_size=1, recompute="full", zero_stage=1,
                    layers_per_stage=(20, 20, 20, 20), gpus=tuple(range(128)))
    failed = parse_failed("h100-02", inst.cluster)  # replica 2 of stage 0
    warm = dict((label, (p, e)) for label, p, e in warm_starts(inst, old, Survivors.of(inst, failed)))
    assert "spares" not in warm  # every GPU was in use
    placement, _ = warm["smaller dp"]
    assert placement.dp == 2 and ranks_moved(old, placement, inst.model.num_layers) == 0
    assert not set(placement.gpus) & set(failed)


def test_cli_writes_a_plan_file_that_evaluate_reads(tmp_path, old_plan, small):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"placement": old_plan.to_dict(small.cluster)}))
    out = tmp_path / "new.json"
    result = run_cli("replan", "--instance", SMALL, "--plan", plan, "--failed", "s01", "--output", out)
    assert result.returncode == 0, result.stderr
    assert "ranks that change their model shard: 4 of 4" in result.stdout
    doc = json.loads(out.read_text())
    assert doc["replan"]["failed"] == ["s01:0", "s01:1", "s01:2", "s01:3"]
    assert doc["replan"]["old_iteration_time_s"] == evaluate(small, old_plan).iteration_time_s
    again = run_cli("--instance", SMALL, "--evaluate", out, "--json")
    assert again.returncode == 0
    assert json.loads(again.stdout)["estimate"]["iteration_time_s"] == doc["estimate"]["iteration_time_s"]


@pytest.mark.parametrize("flags, phrase", [
    (("--failed", "nope"), "error: --failed: nope: unknown node 'nope'"),
    (("--failed", "s00:9"), "error: --failed: s00:9: GPU index '9' out of range"),
    ((), "--failed: expected the failed nodes and GPUs"),
    (("--precompute",), "--out: expected the table's directory with --precompute"),
])
def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, old_plan, small, flags, phrase):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"placement": old_plan.to_dict(small.cluster)}))
    result = run_cli("replan", "--instance", SMALL, "--plan", plan, *flags)
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1 and phrase in result.stderr, result.stderr


def test_cli_refuses_survivors_of_several_gpu_types(tmp_path):
    inst_path = REPO / "instances" / "a100_h100_64.json"
    inst = load_instance(inst_path)
    old = solvers.solve(inst, method="baseline").placement
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"placement": old.to_dict(inst.cluster)}))
    result = run_cli("replan", "--instance", inst_path, "--plan", plan, "--failed", inst.cluster.nodes[0].name + ":0")
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1
    assert "solve replan plans clusters of one GPU type" in result.stderr


def test_cli_refuses_a_plan_of_another_instance(tmp_path):
    other = {"placement": {"tp": 8, "pp": 4, "dp": 4, "gpus": [f"h100-{n:02d}:{g}" for n in range(16)
                                                                for g in range(8)]}}
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(other))
    result = run_cli("replan", "--instance", SMALL, "--plan", plan, "--failed", "s01")
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1
    assert result.stderr.startswith(f"error: {plan}: ")


def test_precompute_answers_every_node_and_relabels_interchangeable_ones(tmp_path, old_plan, small):
    """small_4x2's four nodes: the table has one file per node; a node answered by relabelling has its class's
    searched node's time (or a warm start of its own within the move tolerance), and its plan avoids its GPUs."""
    inst_path = REPO / "instances" / "small_4x2.json"
    inst = load_instance(inst_path)
    old = solvers.solve(inst, method="baseline").placement
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"placement": old.to_dict(inst.cluster)}))
    result = run_cli("replan", "--precompute", "--instance", inst_path, "--plan", plan, "--out", tmp_path / "t",
                     "--quiet")
    assert result.returncode == 0, result.stderr
    index = json.loads((tmp_path / "t" / "index.json").read_text())
    assert sorted(index["failures"]) == sorted(n.name for n in inst.cluster.nodes)
    classes = inst.cluster.interchangeable_nodes()
    assert index["searched"] == len(classes)
    for name, entry in index["failures"].items():
        doc = json.loads((tmp_path / "t" / entry["file"]).read_text())
        assert not any(g.startswith(f"{name}:") for g in doc["placement"]["gpus"])
        assert doc["estimate"]["iteration_time_s"] == entry["iteration_time_s"]
        node = inst.cluster.node_index[name]
        rep = next(c[0] for c in classes if node in c)
        # the class's answer relabelled (the same time), or a warm start within the move tolerance of it
        assert entry["iteration_time_s"] <= index["failures"][inst.cluster.nodes[rep].name]["iteration_time_s"] \
            * (1 + MOVE_TOLERANCE) * (1 + 1e-9)


@pytest.mark.parametrize("path, failed", [("small_2x4.json", "s00:1"), ("small_4x2.json", "s01"),
                                          ("measured_16.json", None)])
def test_per_layer_bound_holds_for_a_world_on_any_survivors(path, failed):
    """`unit_bound`, computed on every survivor, against the evaluator's time of placements of the same
    configuration on other GPUs than the first w: random subsets of the survivors, random rank orders, even
    and uneven layer splits."""
    from formulation.space import partition_fits
    from solvers.bounds.work import WorkBound
    from solvers.search.replan import every_option, unit_bound
    inst = load_instance(REPO / "instances" / path)
    gpus = parse_failed(failed or inst.cluster.nodes[0].name, inst.cluster)
    surv = Survivors.of(inst, gpus)
    everyone = surv.all[0]
    gpu_type = next(iter(everyone.cluster.gpu_types.values()))
    rng = np.random.default_rng(0)
    checked = 0
    for option in every_option(surv, WorkBound(everyone))[::3]:
        fits, caps = partition_fits(everyone, option.config, gpu_type)
        if not fits:
            continue
        bound = unit_bound(everyone, option.config, caps)
        L, P, v = inst.model.num_layers, option.config.pp, option.config.vpp
        for _ in range(4):
            chosen = rng.choice(np.asarray(surv.order), size=option.world, replace=False)
            cuts = np.sort(rng.choice(np.arange(1, L // v), size=P - 1, replace=False)) if P > 1 else []
            layers = tuple(int(x) * v for x in np.diff(np.concatenate([[0], cuts, [L // v]])))
            placement = Placement.of(option.config, layers, [int(g) for g in chosen])
            assert bound <= evaluate(inst, placement, check=False).iteration_time_s, option.config.describe()
            checked += 1
    assert checked > 20


def test_same_answer_for_the_same_seed(small, old_plan):
    failed = parse_failed("s00:1", small.cluster)
    a, b = replan(small, old_plan, failed, seed=3), replan(small, old_plan, failed, seed=3)
    assert a.placement == b.placement and a.bound_s == b.bound_s
    assert np.isfinite(a.bound_s)


@pytest.mark.parametrize("family", ["zbv", "dualpipev"])
def test_per_layer_bound_is_below_the_v_schedules(monkeypatch, family):
    """`unit_bound` of a V configuration against the V's own time (S3) on alike stages, F = 1, B = 1.2, W = 0.8 per
    stage (two chunks of one layer, u = 1.5 a layer), pp 8, m 16: ZBV 52.2, DualPipeV 53.1, where the interleaved
    (C9) (m - 1/vpp) M + S / vpp gives 58.5. The bound's per-layer time is stubbed at u; the rest is the code's."""
    from types import SimpleNamespace
    from formulation.physics import v_schedules
    from formulation.placement import Config
    from solvers.bounds.parts import Parts
    from solvers.search import replan as module
    pp, m, F, B, W = 8, 16, 1.0, 1.2, 0.8
    config = Config(1, pp, 1, 1, 2, 1, "none", 0, schedule=family)
    parts = SimpleNamespace(config=config, m=m, u=(F + B + W) / 2)
    parts.schedule = lambda M, S: Parts.schedule(parts, M, S)
    monkeypatch.setattr(module, "stage_parts", lambda *args, **kwargs: parts)
    sub = SimpleNamespace(model=SimpleNamespace(num_layers=2 * pp, moe=None),
                          cluster=SimpleNamespace(gpu_types={"g": SimpleNamespace(iteration_overhead_s=0.0)}))
    v_time = v_schedules.pipeline_time(family, [F + B + W] * pp, [F] * pp, [W] * pp, m)[0]
    assert v_time == pytest.approx({"zbv": 52.2, "dualpipev": 53.1}[family])
    assert module.unit_bound(sub, config, caps=None) <= v_time
