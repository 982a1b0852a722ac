"""The V-shaped schedules ZBVZeroBubble and DualPipeV (docs/schedules.md (S3)): the closed form against the event
simulation of torch's op order, the activations in flight, the searched decision against brute force with both
backends, and the torchtitan export."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from conftest import AVAILABLE_BACKENDS, seeds_by_backend
from test_schedules_exact import schedule_instance, scored_placements

from formulation import evaluate, instance_from_dict
from formulation.physics import v_schedules
from formulation.physics.pipeline_sim import simulate
from formulation.physics.schedules import FAMILIES
from formulation.space import configurations
from solvers import solve

SETS = 250


def installed(name: str):
    return pytest.mark.skipif(not AVAILABLE_BACKENDS.get(name), reason=f"{name} not installed")
ALL = ["1F1B", "Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"]


def _simulated(family, pp, m, f, b, w, sends=None):
    orders = {r: v_schedules.order(family, r, pp, m) for r in range(pp)}
    return simulate(orders, pp, 2, "v", f, b, w, sends or [0.0] * pp)[0]


def _stage_sets(rng, alike: bool, evaluator: bool = False):
    """Random (pp, m, F, B, W): W <= min(F, B), as (C15) makes it; `evaluator`: also B >= F, as every stage the
    evaluator scores has (docs/schedules.md (S3))."""
    for _ in range(SETS):
        pp = rng.randint(2, 8)
        m = rng.randint(2 * pp, 4 * pp)
        n = 1 if alike else pp
        w = [rng.uniform(0.1, 1.0) for _ in range(n)]
        f = [x + rng.uniform(0, 1.5) for x in w]
        b = [(y if evaluator else x) + rng.uniform(0, 1.5) for x, y in zip(w, f)]
        yield pp, m, (f * pp if alike else f), (b * pp if alike else b), (w * pp if alike else w)


@pytest.mark.parametrize("family", v_schedules.V_FAMILIES)
def test_closed_form_equals_simulation_on_uniform_stages(family):
    """(S3) equals the simulation of torch's order to 1e-9 on 250 random (F, B, W) sets, stages alike, no sends:
    every form on any W <= min(F, B), and the evaluator's rows (`model_rows`) wherever also B >= F."""
    for evaluator in (False, True):
        for pp, m, f, b, w in _stage_sets(random.Random(family), alike=True, evaluator=evaluator):
            t = [x + y + z for x, y, z in zip(f, b, w)]
            formula = v_schedules.pipeline_time(family, t, f, w, m, exact=not evaluator)[0]
            assert formula == pytest.approx(_simulated(family, pp, m, f, b, w), rel=1e-9), (pp, m, f[0], b[0], w[0])


def largest_difference(family: str, seed: int = 0, sends: float = 0.0) -> tuple[float, float]:
    """(largest over-estimate, largest under-estimate) of the evaluator's (S3) relative to the simulation, stages
    unlike (B >= F); `sends`: each boundary's send up to this share of the mean stage time, in the formula as
    (C10) (4 x the sum)."""
    rng, over, under = random.Random(seed), float("-inf"), float("inf")
    for pp, m, f, b, w in _stage_sets(rng, alike=False, evaluator=True):
        t = [x + y + z for x, y, z in zip(f, b, w)]
        c = [rng.uniform(0, sends) * sum(t) / pp for _ in range(pp)]
        formula = v_schedules.pipeline_time(family, t, f, w, m)[0] + 4 * sum(c[:pp - 1])
        ratio = formula / _simulated(family, pp, m, f, b, w, c) - 1
        over, under = max(over, ratio), min(under, ratio)
    return over, under


@pytest.mark.parametrize("family", v_schedules.V_FAMILIES)
def test_closed_form_against_simulation_on_unlike_stages(family):
    """A model, not an identity, with stages unlike: within the range docs/schedules.md gives."""
    over, under = largest_difference(family)
    assert -0.05 < under <= 0 <= over < 0.15


@pytest.mark.parametrize("family", v_schedules.V_FAMILIES)
def test_activations_in_flight_from_torchs_order(family):
    """(S4) ZBV holds 2 pp chunks on every rank (pp micro-batches of its layers, 1F1B's first stage, as Qi et al.
    state for ZB-V); DualPipeV more on the first ranks, which run its 2 (pp - 1 - r) + ... warm-up forwards."""
    for pp in range(2, 7):
        peaks = [v_schedules.in_flight_chunks(family, r, pp, 4 * pp) for r in range(pp)]
        if family == "zbv":
            assert peaks == [2 * pp] * pp
        else:
            assert peaks[0] >= 2 * pp and peaks == sorted(peaks, reverse=True)


def v_instance(seed: int) -> dict:
    data = schedule_instance(seed)
    data["training"]["pipeline_schedules"] = ALL
    return data


def brute_force(instance, data) -> float:
    """Every configuration, schedule family, layer split and GPU map, scored by evaluate() alone; checks on the way
    that every V stage has B >= F (what lets the program drop ZBV's 2F - B rows)."""
    def families(pp: int, vpp: int) -> list[str]:
        return [f for f in FAMILIES if f != "zero_bubble" or vpp > 1]  # ZBH1 (zero bubble, vpp 1): no stack runs it
    best = float("inf")
    for family, est in scored_placements(instance, data, families):
        if family in v_schedules.V_FAMILIES:
            assert all(s.input_grad_s >= s.forward_compute_s for s in est.stages)
        if est.fits:
            best = min(best, est.iteration_time_s)
    return best


SEEDS = [0, 1, 3, 8, 11, 12, 15, 18, 20, 21]  # 4-GPU instances with V configurations (m >= 2 pp)


@pytest.mark.parametrize("seed,backend", seeds_by_backend(SEEDS))
def test_search_with_v_schedules_free_equals_brute_force(seed, backend):
    data = v_instance(seed)
    instance = instance_from_dict(data)
    assert any(c.schedule in v_schedules.V_FAMILIES for c in configurations(instance))
    expected = brute_force(instance, data)
    result = solve(instance, solver=backend)
    assert result.solver.status == "optimal", result.solver
    assert result.estimate.iteration_time_s == pytest.approx(expected, rel=1e-6)
    assert result.solver.bound_s <= expected * (1 + 1e-9)


@pytest.mark.parametrize("seed,backend", [pytest.param(1, "cpsat", marks=installed("cpsat")),
                                          pytest.param(3, "cpsat", marks=installed("cpsat")),
                                          pytest.param(3, "cbc", marks=[installed("cbc"), pytest.mark.slow])])
def test_v_programs_equal_the_evaluator(seed, backend):
    """Every configuration's program, V ones included: objective = evaluator to 1e-6, cheap bound below. Seed 3 holds
    ZeRO-3 programs that stalled CP-SAT in a propagation loop while (P7) let a time variable rise at no cost
    (docs/programs.md (P7); tests/test_exact.py checks that no row does)."""
    from test_exact import programs_match_evaluator
    instance = instance_from_dict(v_instance(seed))
    assert sum(c.schedule in v_schedules.V_FAMILIES for c in configurations(instance)) >= 2
    assert programs_match_evaluator(instance, backend) >= 3


def test_torchtitan_reads_a_v_schedule(small_instance):
    """torchtitan 0.3's ConfigManager parses the exported ZBVZeroBubble / DualPipeV plan, torch knows the schedule,
    and the model parts follow the V: part k on rank k, then 2 pp - 1 - k (the output layer on rank 0)."""
    from types import SimpleNamespace

    from conftest import REPO
    from formulation import load_instance
    from frameworks import require
    from solvers.outputs.torchtitan import model_parts, torchtitan_arguments, torchtitan_flavour

    manager = require("torchtitan.config.manager")
    torch_schedules = require("torch.distributed.pipelining.schedules")
    from formulation.placement import default_placement
    instance = load_instance(REPO / "instances" / "h100_128.json")
    instance = replace(instance, training=replace(instance.training, software_stack="torchtitan", torch_compile=False,
                                                  pipeline_schedules=tuple(ALL)))
    for family, name in (("zbv", "ZBVZeroBubble"), ("dualpipev", "DualPipeV")):
        base = default_placement(instance, tp=8, pp=4, vpp=2, zero_stage=3)
        p = replace(base, schedule=family, layers_per_stage=(16, 24, 20, 20))
        e = evaluate(instance, p)
        args, subcommands, _ = torchtitan_arguments(instance, SimpleNamespace(placement=p, estimate=e))
        flavour, _ = torchtitan_flavour(instance.model)
        config = manager.ConfigManager().parse_args(["--module", flavour.module, "--config", flavour.config] + args
                                                    + subcommands)
        par = config.parallelism
        assert par.pipeline_parallel_schedule == name
        assert issubclass(torch_schedules.get_schedule_class(name), torch_schedules.PipelineScheduleMulti)
        parts = model_parts(instance, p)
        assert [len([n for n in part if n.startswith("layers.")]) for part in parts] == [8, 12, 10, 10, 10, 10, 12, 8]
        assert "output" in parts[-1] and "tok_embeddings" in parts[0]
        looped = evaluate(instance, replace(p, schedule="1f1b"))  # the output layer's GEMMs move to rank 0
        assert e.stages[0].weight_grad_s > looped.stages[0].weight_grad_s
        assert e.stages[-1].weight_grad_s < looped.stages[-1].weight_grad_s


def test_report_names_a_v_schedule_and_its_gain(small_instance):
    from formulation.placement import default_placement
    from solvers.outputs.plan_notes import schedule_line

    instance = replace(small_instance, training=replace(small_instance.training, software_stack="torchtitan",
                                                        torch_compile=False, pipeline_schedules=tuple(ALL)))
    p = replace(default_placement(instance, tp=1, pp=2, dp=4, vpp=2), schedule="dualpipev")
    e, one = evaluate(instance, p), evaluate(instance, replace(p, schedule="1f1b"))
    gain = 100 * (one.iteration_time_s / e.iteration_time_s - 1)
    assert schedule_line(instance, p, e).startswith(f"pipeline schedule: DualPipeV (allowed: {', '.join(ALL)}); "
                                                    f"{gain:.1f} % faster than Interleaved1F1B")


def test_v_schedules_follow_the_gpu_types_on_the_nodes():
    """(S3) needs one GPU type: the one the nodes hold, not every type `cluster.gpu_types` declares (a re-plan's
    survivors keep the whole declaration). A type declared but on no node keeps the V configurations; a node of a
    second type (a truly mixed cluster, planned as islands) drops them."""
    data = v_instance(0)
    declared = data["cluster"]["gpu_types"]
    declared["a100-sxm-80gb"] = dict(declared["h100-sxm-80gb"])
    assert any(c.schedule in v_schedules.V_FAMILIES for c in configurations(instance_from_dict(data)))
    data["cluster"]["nodes"][1]["gpu_type"] = "a100-sxm-80gb"
    configs = list(configurations(instance_from_dict(data)))
    assert configs and not any(c.schedule in v_schedules.V_FAMILIES for c in configs)


def test_work_bound_cache_follows_the_schedule():
    """(B0) caches W per configuration class, and a V puts the output layer on stage 0 (S3): a V configuration
    scored first must not leave a W without the output layer for the 1F1B configuration of the same sizes (a
    shared WorkBound gives every configuration what a fresh one does), and W counts the output layer on both."""
    from solvers.bounds.work import WorkBound
    instance = instance_from_dict(v_instance(0))
    configs = sorted(configurations(instance), key=lambda c: c.schedule not in v_schedules.V_FAMILIES)
    sizes = {replace(c, schedule="1f1b", vpp=1) for c in configs if c.schedule in v_schedules.V_FAMILIES}
    assert sizes and sizes <= set(configs)
    shared = WorkBound(instance)
    for c in configs:
        assert shared(c) == WorkBound(instance)(c), c
    for c in configs:
        if c.schedule in v_schedules.V_FAMILIES:
            assert shared.work(c) == shared.work(replace(c, schedule="1f1b", vpp=1)), c
