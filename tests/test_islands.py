"""Mixed GPU types: islands, the composition program against brute force and the evaluator, objectives.

The brute force shares nothing with the program but `evaluate()` and the slot layout: for every configuration
it enumerates every sequence of islands along the pipeline (each island one contiguous run, within its slots)
and every layer partition, builds the placement (an island's stages take its slots in pipeline order), scores
it with `evaluate()` and keeps the fastest that fits.
"""

from __future__ import annotations

import itertools
import random

import pytest

from formulation import evaluate, instance_from_dict
from formulation.programs.composition import build_composition, island_tables
from formulation.programs.islands import find_islands, island_slots
from formulation.space import placement_for
from solvers import backends, solve
from solvers.search.mixed import compose_search, configurations
from solvers.search.objectives import objective_value

from conftest import ALL_BACKENDS, REPO, JumpingClock, seeds_by_backend

BACKENDS = ALL_BACKENDS


def mixed_dict(seed: int) -> dict:
    """A seeded small mixed cluster: nodes of H100 and A100-80GB (and sometimes a slow-NIC H100 node), each
    type with its own NVLink and NIC figures; tight memory for some seeds."""
    rng = random.Random(seed)
    per_node = rng.choice([1, 2])
    h, a = rng.choice([(1, 1), (2, 1), (1, 2)])
    layers = rng.choice([3, 4, 5])
    nodes = [{"name": f"h{i}", "gpu_type": "h100-sxm-80gb", "gpus": per_node} for i in range(h)]
    nodes += [{"name": f"a{i}", "gpu_type": "a100-sxm-80gb", "gpus": per_node} for i in range(a)]
    per = [{"node": f"h{i}", "intra_node_gb_per_s": 400.0, "inter_node_gb_per_s": rng.choice([24.0, 48.0])}
           for i in range(h)]
    per += [{"node": f"a{i}", "intra_node_gb_per_s": 200.0, "inter_node_gb_per_s": 24.0} for i in range(a)]
    hidden = rng.choice([512, 1024])
    types = {"h100-sxm-80gb": {"price_per_hour": 2.5}, "a100-sxm-80gb": {"price_per_hour": 1.0}}
    if seed % 3 == 0:  # tight memory: some stages fit on one type only
        types["a100-sxm-80gb"]["memory_gib"] = 3.9 + hidden / 512
        types["h100-sxm-80gb"]["memory_gib"] = 6.0 + hidden / 512
        for t in types.values():
            t["runtime_overhead_gib"] = 1.0
    return {
        "name": f"mixed{seed}",
        "model": {"num_hidden_layers": layers, "hidden_size": hidden, "intermediate_size": hidden * 3,
                  "num_attention_heads": 8, "num_key_value_heads": rng.choice([2, 4]), "vocab_size": 32000},
        "training": {"global_batch_size": rng.choice([4, 8]), "seq_length": rng.choice([1024, 2048]),
                     "recompute": rng.sample(["none", "selective", "full"], 2), "zero_stage": [rng.choice([0, 1])],
                     "max_micro_batch_size": rng.choice([1, 2]), "context_parallel_sizes": [1],
                     "virtual_pipeline_sizes": [1, 2]},
        "cluster": {"gpu_types": types, "nodes": nodes,
                    "network": {"intra_node_gb_per_s": 400.0, "inter_node_gb_per_s": 48.0, "nodes": per}},
    }


def brute_force(instance, config, islands) -> float:
    """Fastest fitting composition of one configuration, by enumeration (inf if none fits)."""
    cluster, L = instance.cluster, instance.model.num_layers
    S = config.tp * config.cp * config.dp
    slots = [island_slots(isl, cluster, S, config.tp) for isl in islands]
    best = float("inf")
    counts = [q for q in range(config.vpp, L + 1, config.vpp)]
    for seq in itertools.product(range(len(islands)), repeat=config.pp):
        runs = [k for j, k in enumerate(seq) if j == 0 or seq[j - 1] != k]
        if len(runs) != len(set(runs)) or any(seq.count(k) > len(slots[k]) for k in set(seq)):
            continue
        used = [0] * len(islands)
        gpus = []
        for k in seq:
            gpus += slots[k][used[k]]
            used[k] += 1
        for split in itertools.product(counts, repeat=config.pp):
            if sum(split) != L:
                continue
            est = evaluate(instance, placement_for(config, split, gpus))
            if est.fits:
                best = min(best, est.iteration_time_s)
    return best


def test_islands_of_the_shipped_mixed_instances():
    from formulation import load_instance

    two = find_islands(load_instance(REPO / "instances" / "a100_h100_64.json").cluster)
    assert [(i.gpu_type, i.num_gpus) for i in two] == [("h100-sxm-80gb", 32), ("a100-sxm-80gb", 32)]
    three = find_islands(load_instance(REPO / "instances" / "mixed_256.json").cluster)
    assert sorted((i.gpu_type, i.num_gpus) for i in three) == [("a100-sxm-80gb", 128), ("h100-sxm-80gb", 64),
                                                               ("h200-sxm-141gb", 64)]


def test_a_slow_nic_node_is_an_island_of_its_own():
    data = mixed_dict(1)
    data["cluster"]["nodes"] = [{"name": f"h{i}", "gpu_type": "h100-sxm-80gb", "gpus": 2} for i in range(4)]
    data["cluster"]["network"]["nodes"] = [{"node": "h2", "inter_node_gb_per_s": 12.0}]
    islands = find_islands(instance_from_dict(data, "<test>", REPO).cluster)
    assert [i.nodes for i in islands] == [(0, 1, 3), (2,)]
    # every block of the node matrix is one figure
    inter = instance_from_dict(data, "<test>", REPO).cluster.inter_gb_per_s
    for a in islands:
        for b in islands:
            values = {float(inter[x, y]) for x in a.nodes for y in b.nodes if x != y}
            assert len(values) <= 1


@pytest.mark.parametrize("seed,solver", seeds_by_backend(range(8)))
def test_composition_equals_brute_force_and_evaluator(seed, solver):
    instance = instance_from_dict(mixed_dict(seed), "<test>", REPO)
    islands = find_islands(instance.cluster)
    assert compositions_match_brute_force(instance, islands, solver, [
        c for c in configurations(instance, islands) if c.pp <= 4]) > 0


def compositions_match_brute_force(instance, islands, solver: str, configs) -> int:
    """Each configuration's composition program: infeasible exactly when brute force finds nothing, else its
    optimum is the brute-force minimum and the evaluator's time of its plan. Returns how many were compared."""
    checked = 0
    for config in configs:
        expected = brute_force(instance, config, islands)
        try:
            comp = build_composition(instance, config, island_tables(instance, config, islands))
        except ValueError:
            assert expected == float("inf")
            continue
        out = backends.get(solver).solve(comp.program)  # no wall-clock limit: a proof is asserted
        if expected == float("inf"):
            assert out.status == "infeasible"
            continue
        assert out.status == "optimal", config
        est = evaluate(instance, comp.decode(out.values))
        assert est.fits
        assert est.iteration_time_s == pytest.approx(out.objective_s, rel=1e-6), config
        assert est.iteration_time_s == pytest.approx(expected, rel=1e-6), config
        checked += 1
    return checked


@pytest.mark.parametrize("solver", BACKENDS)
@pytest.mark.parametrize("seed", [0] + [pytest.param(s, marks=pytest.mark.slow) for s in range(1, 6)])
def test_composition_with_dense_and_moe_layers_equals_brute_force(seed, solver):
    """A model whose first 1 or 2 layers are dense (docs/moe.md (E1)) on a mixed cluster: the composition
    program (one-hot mixes per stage and island, linked to the boundaries, docs/programs.md (P2b)) equals brute
    force over every composition and partition and the evaluator of its plan."""
    data = mixed_dict(seed)
    rng = random.Random(seed)
    hidden = data["model"]["hidden_size"]
    data["model"] = {"num_hidden_layers": rng.choice([4, 5]), "hidden_size": hidden, "num_attention_heads": 8,
                     "num_key_value_heads": 8, "vocab_size": 32000, "hidden_act": "silu",
                     "intermediate_size": 4 * hidden, "n_routed_experts": 4, "num_experts_per_tok": 2,
                     "moe_intermediate_size": hidden // 2, "n_shared_experts": 1,
                     "first_k_dense_replace": rng.choice([1, 2])}
    data["training"]["virtual_pipeline_sizes"] = [1]
    instance = instance_from_dict(data, "<test>", REPO)
    islands = find_islands(instance.cluster)
    assert compositions_match_brute_force(instance, islands, solver, [
        c for c in configurations(instance, islands) if 1 < c.pp <= 4]) > 0


def test_search_is_optimal_over_all_configurations():
    instance = instance_from_dict(mixed_dict(4), "<test>", REPO)
    islands = find_islands(instance.cluster)
    best = min(brute_force(instance, c, islands) for c in configurations(instance, islands) if c.pp <= 5)
    found = compose_search(instance)
    assert found.status == "optimal"
    assert found.ranked[0].estimate.iteration_time_s == pytest.approx(best, rel=1e-6)


def test_adding_slower_gpus_never_makes_the_plan_slower():
    for seed in (2, 5, 7):
        instance = instance_from_dict(mixed_dict(seed), "<test>", REPO)
        islands = find_islands(instance.cluster)
        everything = compose_search(instance).ranked[0].estimate.iteration_time_s
        for isl in islands:
            alone = compose_search(instance, islands=[isl])
            assert everything <= alone.ranked[0].estimate.iteration_time_s * (1 + 1e-9)


def test_a_type_that_cannot_hold_a_stage_is_left_out_and_said_so():
    data = mixed_dict(2)
    data["cluster"]["gpu_types"]["a100-sxm-80gb"]["memory_gib"] = 2.0  # below the runtime overhead alone
    instance = instance_from_dict(data, "<test>", REPO)
    result = solve(instance)
    used_types = {instance.cluster.gpu_type_of(g).name for g in result.placement.gpus}
    assert used_types == {"h100-sxm-80gb"}
    a100 = [r for r in result.solver.islands if r["gpu_type"] == "a100-sxm-80gb"]
    assert a100 and all(r["idle_gpus"] == r["gpus"] and "cannot hold" in r["why_idle"] for r in a100)


def test_cost_and_gpu_count_objectives():
    instance = instance_from_dict(mixed_dict(5), "<test>", REPO)
    fastest = solve(instance)
    cheapest = solve(instance, objective="cost")
    # the bound covers every placement (B5), not only compositions: it may leave a gap the search cannot close
    assert 0 < cheapest.solver.bound_value <= cheapest.solver.objective_value * (1 + 1e-9)
    assert (cheapest.solver.status == "optimal") == (cheapest.solver.gap <= 1e-9)
    cost = lambda r: objective_value(instance, "cost", r.placement, r.estimate)  # noqa: E731
    assert cost(cheapest) <= cost(fastest) * (1 + 1e-9)
    assert fastest.estimate.iteration_time_s <= cheapest.estimate.iteration_time_s * (1 + 1e-9)
    assert cheapest.solver.objective_value == pytest.approx(cost(cheapest))
    # fewest GPUs for half the best throughput: it reaches it, and no smaller world can (brute force)
    need = fastest.estimate.tokens_per_s / 2
    few = solve(instance, objective="gpus", required_tokens_per_s=need)
    assert few.estimate.tokens_per_s >= need * (1 - 1e-9)
    tokens = instance.training.global_batch_size * instance.training.seq_length
    islands = find_islands(instance.cluster)
    for config in configurations(instance, islands):
        world = config.tp * config.cp * config.dp * config.pp
        if world < few.placement.world_size:
            assert tokens / brute_force(instance, config, islands) < need


def test_cli_objective_errors_and_mixed_plan_file(tmp_path):
    from conftest import run_solve, write_instance

    path = write_instance(tmp_path, mixed_dict(5))
    bad = run_solve("--instance", path, "--objective", "gpus")
    assert bad.returncode == 2 and "--required-tokens-per-s" in bad.stderr and "Traceback" not in bad.stderr
    bad = run_solve("--instance", path, "--objective", "cost", "--solver", "anneal")
    assert bad.returncode == 2 and "--objective cost" in bad.stderr
    out = tmp_path / "plan.json"
    ok = run_solve("--instance", path, "--objective", "cost", "--output", out, "--quiet")
    assert ok.returncode == 0, ok.stderr
    import json
    solver = json.loads(out.read_text())["solver"]
    assert solver["objective"] == "cost" and solver["bound_s"] is None and solver["status"] in ("optimal", "feasible")
    assert 0 < solver["bound_value"] <= solver["objective_value"] * (1 + 1e-9)
    assert {r["gpu_type"] for r in solver["islands"]} == {"h100-sxm-80gb", "a100-sxm-80gb"}
    # the plan is compared with the default in the objective's unit, not in seconds
    assert "Megatron-style default (best over configurations):" in ok.stdout
    assert "per million tokens; this plan" in " ".join(ok.stdout.split())


def test_no_type_can_hold_the_model_says_which_stage_needs_what(tmp_path):
    from conftest import run_solve, write_instance

    data = mixed_dict(2)
    for gpu_type in data["cluster"]["gpu_types"].values():
        gpu_type["memory_gib"] = 2.0
    out = run_solve("--instance", write_instance(tmp_path, data), "--quiet")
    assert out.returncode == 1 and out.stderr.startswith("infeasible:"), out.stderr
    assert "needs" in out.stderr and "GiB allowed" in out.stderr and "Traceback" not in out.stderr


def test_layer_capacity_is_the_most_layers_that_fit():
    """The capacity read off memory's affine line equals a scan of the memory model, on both GPU types."""
    from formulation.physics.memory import stage_memory
    from formulation.space import layer_capacity

    for seed in (0, 3, 4):
        instance = instance_from_dict(mixed_dict(seed), "<test>", REPO)
        islands = find_islands(instance.cluster)
        for config in list(configurations(instance, islands))[::5]:
            p = placement_for(config, (1,) * config.pp, range(config.tp * config.cp * config.dp * config.pp))
            for gpu_type in instance.cluster.gpu_types.values():
                for i in range(config.pp):
                    fitting = [q for q in range(instance.model.num_layers + 1)
                               if stage_memory(instance, p, i, q, gpu_type).fits]
                    assert layer_capacity(instance, p, i, gpu_type) == (max(fitting) if fitting else -1)


def test_a_budget_too_short_for_any_program_returns_the_default_without_a_bound(monkeypatch):
    """Mixed types: when the time limit ends the search before any composition program, the plan is the
    type-blind Megatron default (status timeout, no bound claimed), not an error; the cost objective has no
    such default and still says that no plan came in time."""
    import solvers.search.mixed as mixed
    from solvers.search.driver import NoPlanInTime
    instance = instance_from_dict(mixed_dict(4), "<test>", REPO)
    monkeypatch.setattr(mixed, "time", JumpingClock())
    plan = solve(instance, time_limit=1.0)
    assert plan.solver.status == "timeout" and plan.solver.bound_s is None and plan.solver.gap is None
    assert "type-blind Megatron default" in plan.solver.note
    assert evaluate(instance, plan.placement).iteration_time_s == pytest.approx(plan.estimate.iteration_time_s)
    assert plan.estimate.fits
    with pytest.raises(NoPlanInTime):
        solve(instance, time_limit=1.0, objective="cost")


def test_islands_composed_baseline_fits_and_is_no_faster_than_the_plan():
    """`solve bench --mixed`'s islands approach (per-island slices composed, layers by peak compute): a fitting
    plan scored by the evaluator, never faster than the planner's plan, which the enumeration of this 6-GPU
    cluster proves optimal over every placement."""
    from formulation import load_instance
    from solvers import solve
    from solvers.validation.islands_composed import islands_composed

    instance = load_instance(REPO / "tests" / "repro" / "mixed_types_mixed2.json")
    placement, estimate = islands_composed(instance)
    assert estimate.fits and estimate.iteration_time_s == evaluate(instance, placement).iteration_time_s
    result = solve(instance)
    assert result.solver.status == "optimal"
    assert result.estimate.iteration_time_s <= estimate.iteration_time_s * (1 + 1e-9)
