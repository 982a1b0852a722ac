"""Pipeline schedules (docs/schedules.md): the op orders against torch's own, the closed forms (S1) against the
event simulation of those orders, the weight-gradient split (C15), and the schedule as a searched decision."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from formulation import evaluate, instance_from_dict
from formulation.physics import cost, schedule_orders, schedules
from formulation.physics.pipeline_sim import simulate
from formulation.placement import default_placement
from solvers.outputs.schedule import stage_order

SETS = 250  # random stage-time sets per schedule


def _orders(name: str, pp: int, m: int, vpp: int) -> tuple[dict, int, str]:
    if name == "1F1B":
        return {r: schedule_orders.one_f_one_b(r, pp, m) for r in range(pp)}, 1, "loop"
    if name in ("Interleaved1F1B", "InterleavedZeroBubble", "ZBH1"):
        zb = name != "Interleaved1F1B"
        return {r: schedule_orders.looped(r, pp, m, vpp, zb) for r in range(pp)}, vpp, "loop"
    make = schedule_orders.zbv if name == "ZBVZeroBubble" else schedule_orders.dualpipev
    return {r: make(r, pp, m) for r in range(pp)}, 2, "v"


def _torch_order(name: str, pp: int, m: int, vpp: int) -> dict:
    """torch.distributed.pipelining's own op order of each rank (its order generator, without process groups)."""
    S = pytest.importorskip("torch.distributed.pipelining.schedules")
    obj = object.__new__(S.get_schedule_class(name))
    rounds = max(1, m // pp)
    obj.__dict__.update(_n_microbatches=m, pp_group_size=pp, n_local_stages=vpp, num_stages=pp * vpp,
                        _num_stages=pp * vpp, number_of_rounds=rounds, microbatches_per_round=m // rounds)
    out = {}
    for r in range(pp):
        ops = []
        for a in obj._calculate_single_rank_operations(r):
            if a is None:
                continue
            for b in (a.sub_actions or (a,)):
                kind = b.computation_type.value
                if kind in ("F", "B", "I", "W"):
                    ops.append((kind, b.stage_index, b.microbatch_index))
        out[r] = ops
    return out


@pytest.mark.parametrize("name", ["Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"])
def test_orders_are_torchs(name):
    checked = 0
    for pp in range(2, 7):
        for m in range(1, 4 * pp + 1):
            vpps = (2, 3) if name.startswith("Interleaved") else (2,)
            for vpp in vpps:
                if name.startswith("Interleaved") and m % max(1, m // pp) or name == "DualPipeV" and m < 2 * pp:
                    continue
                assert _orders(name, pp, m, vpp)[0] == _torch_order(name, pp, m, vpp), (pp, m, vpp)
                checked += 1
    assert checked > 40


def test_1f1b_order_is_megatrons():
    """Megatron-LM's 1F1B (what the plan's picture simulated before) is the same order."""
    for pp in range(1, 7):
        for m in range(1, 20):
            for r in range(pp):
                ours = [(k, mb) for k, _, mb in schedule_orders.one_f_one_b(r, pp, m)]
                assert ours == [(k, mb) for k, _, mb in stage_order(r, pp, m, 1)]


def _uniform_sets(name: str, rng: random.Random):
    for _ in range(SETS):
        pp = rng.randint(2, 8)
        m = pp * rng.randint(1, 4)
        vpp = 1 if name in ("1F1B", "ZBH1") else rng.choice([2, 3])
        w = rng.uniform(0.1, 1.0)  # W <= min(F, B), as (C15) makes it
        yield pp, m, vpp, w + rng.uniform(0, 1.5), w + rng.uniform(0, 1.5), w


@pytest.mark.parametrize("name", ["1F1B", "Interleaved1F1B", "ZBH1", "InterleavedZeroBubble"])
def test_closed_form_equals_simulation_on_uniform_stages(name):
    """(S1) equals the event simulation of the schedule's real op order to 1e-9 on 250 random (F, B, W) sets,
    every stage alike, no sends."""
    family = "zero_bubble" if "Zero" in name or name == "ZBH1" else "1f1b"
    rng = random.Random(name)
    for pp, m, vpp, f, b, w in _uniform_sets(name, rng):
        orders, chunks, style = _orders(name, pp, m, vpp)
        sim = simulate(orders, pp, chunks, style, [f] * pp, [b] * pp, [w] * pp, [0.0] * pp)[0]
        formula = schedules.pipeline_time(family, [f + b + w] * pp, [f] * pp, [b] * pp, [w] * pp, m, vpp)[0]
        assert formula == pytest.approx(sim, rel=1e-9), (pp, m, vpp, f, b, w)


def largest_difference(name: str, sets: int = SETS, seed: int = 0) -> tuple[float, float]:
    """(largest over-estimate, largest under-estimate) of (S1) relative to the simulation, stages unlike."""
    family = "zero_bubble" if "Zero" in name or name == "ZBH1" else "1f1b"
    rng = random.Random(seed)
    over = under = 0.0
    for _ in range(sets):
        pp = rng.randint(2, 8)
        m = pp * rng.randint(1, 4)
        vpp = 1 if name in ("1F1B", "ZBH1") else rng.choice([2, 3])
        w = [rng.uniform(0.1, 1.0) for _ in range(pp)]
        f = [x + rng.uniform(0, 1.5) for x in w]
        b = [x + rng.uniform(0, 1.5) for x in w]
        orders, chunks, style = _orders(name, pp, m, vpp)
        sim = simulate(orders, pp, chunks, style, f, b, w, [0.0] * pp)[0]
        t = [x + y + z for x, y, z in zip(f, b, w)]
        formula = schedules.pipeline_time(family, t, f, b, w, m, vpp)[0]
        over, under = max(over, formula / sim - 1), min(under, formula / sim - 1)
    return over, under


def test_1f1b_closed_form_bounds_the_simulation_on_unlike_stages():
    """(C9) never under-estimates the simulated 1F1B with stages of different F, B, W (docs/schedules.md gives the
    largest differences of every schedule)."""
    over, under = largest_difference("1F1B")
    assert under > -1e-12 and over > 0.01


def test_weight_gradient_split_keeps_times(small_instance):
    """(C15) W is a part of the backward, at most the forward and at most the rest of the backward, and a
    1F1B placement's time is what (C9) made it before the split."""
    p = default_placement(small_instance, tp=1, pp=2, micro_batch_size=1)
    est = evaluate(small_instance, p)
    for s in est.stages:
        assert 0 < s.weight_grad_s <= min(s.forward_s, s.input_grad_s)
    times = [s.forward_s + s.backward_s for s in est.stages]
    assert est.breakdown["bubble_s"] == pytest.approx(
        cost.pipeline_time(times, est.num_micro_batches, 1)[0] - est.num_micro_batches * max(times))


def test_zero_bubble_is_faster_and_holds_its_micro_batches(small_instance):
    p = default_placement(small_instance, tp=1, pp=2, micro_batch_size=1)
    one, zb = evaluate(small_instance, p), evaluate(small_instance, replace(p, schedule="zero_bubble"))
    assert zb.breakdown["bubble_s"] < one.breakdown["bubble_s"]
    assert zb.iteration_time_s < one.iteration_time_s
    # (S4) ZB-H1 holds pp micro-batches on every stage until their W: the last stage holds more than under 1F1B
    assert zb.stages[-1].memory.activations_gib > one.stages[-1].memory.activations_gib


def test_torchtitan_reads_the_zero_bubble_schedule(tmp_path):
    """torchtitan 0.3's ConfigManager parses the exported schedule, torch knows it as a multi-stage schedule, and
    the model parts are pp x vpp chunks (what its multi-stage schedules need)."""
    from types import SimpleNamespace

    from conftest import REPO
    from formulation import load_instance
    from frameworks import require
    from solvers.outputs.torchtitan import torchtitan_arguments, torchtitan_flavour

    manager = require("torchtitan.config.manager")
    torch_schedules = require("torch.distributed.pipelining.schedules")
    instance = load_instance(REPO / "instances" / "h100_128.json")
    instance = replace(instance, training=replace(instance.training, software_stack="torchtitan", torch_compile=False))
    p = replace(default_placement(instance, tp=8, pp=4, vpp=2, zero_stage=3), schedule="zero_bubble")
    args, subcommands, _ = torchtitan_arguments(instance, SimpleNamespace(placement=p, estimate=evaluate(instance, p)))
    flavour, _ = torchtitan_flavour(instance.model)
    config = manager.ConfigManager().parse_args(["--module", flavour.module, "--config", flavour.config] + args
                                                + subcommands)
    par = config.parallelism
    assert par.pipeline_parallel_schedule == "InterleavedZeroBubble"
    assert issubclass(torch_schedules.get_schedule_class(par.pipeline_parallel_schedule),
                      torch_schedules.PipelineScheduleMulti)
    assert len(par.module_fqns_per_model_part) == p.pp * p.vpp


@pytest.mark.parametrize("vpp", [1, 2])
def test_zero_bubble_picture_simulates_the_plan(small_instance, vpp, tmp_path):
    """The schedule picture of a zero-bubble plan: every op of torch's order once, one at a time per stage, W after
    its B, the simulated pipeline within the closed form's reach (S1 is exact for like stages only)."""
    from solvers.outputs.plots import schedule_gantt
    from solvers.outputs.schedule import simulate_schedule

    p = replace(default_placement(small_instance, tp=1, pp=4, dp=2, vpp=vpp), schedule="zero_bubble")
    e = evaluate(small_instance, p)
    sched = simulate_schedule(small_instance, p, e)
    m = e.num_micro_batches
    for stage in range(p.pp):
        ops = sorted((o for o in sched.ops if o.stage == stage), key=lambda o: o.start)
        assert [sum(o.kind == k for o in ops) for k in "FBW"] == [m * vpp] * 3
        assert all(a.end <= b.start + 1e-12 for a, b in zip(ops, ops[1:]))
    ends = {(o.kind, o.chunk, o.stage, o.micro_batch): o.end for o in sched.ops}
    assert all(o.start >= ends[("B", o.chunk, o.stage, o.micro_batch)] for o in sched.ops if o.kind == "W")
    assert sched.critical_path[-1].end == sched.makespan_s
    pipe = e.breakdown["compute_s"] + e.breakdown["bubble_s"] + e.breakdown["tp_comm_s"] + e.breakdown["cp_comm_s"]
    assert sched.makespan_s == pytest.approx(pipe + e.breakdown["pp_comm_s"], rel=0.1)
    assert schedule_gantt(small_instance, p, e, tmp_path / "schedule.png").stat().st_size > 10_000


def test_a_placement_file_with_a_schedule_its_stack_cannot_run_is_refused(small_instance):
    """Megatron-LM runs no zero-bubble schedule: a placement file asking for one is a one-line input error."""
    from formulation import InputError
    from formulation.placement_file import placement_from_dict

    doc = {"tp": 1, "pp": 2, "dp": 4, "vpp": 2, "schedule": "zero_bubble"}
    with pytest.raises(InputError, match="schedule: software_stack megatron does not run InterleavedZeroBubble"):
        placement_from_dict(doc, small_instance, "p.json")
    assert placement_from_dict({**doc, "schedule": "1f1b"}, small_instance, "p.json").schedule_name == \
        "Interleaved1F1B"


@pytest.mark.parametrize("vpp", [1, 2])
def test_best_partition_of_a_zero_bubble_map_is_the_brute_force_best(small_instance, vpp):
    """solvers/local/partition.py under (S1): the partition it returns is the evaluator's best over every split."""
    import itertools

    from solvers.local.partition import best_partition

    p = replace(default_placement(small_instance, tp=1, pp=4, dp=2, vpp=vpp), schedule="zero_bubble")
    L = small_instance.model.num_layers
    best = min(evaluate(small_instance, replace(p, layers_per_stage=split), check=False).iteration_time_s
               for split in itertools.product(range(vpp, L, vpp), repeat=4) if sum(split) == L)
    found = best_partition(small_instance, p)
    assert evaluate(small_instance, found).iteration_time_s == pytest.approx(best, rel=1e-6)


def test_megatron_arguments_of_a_zero_bubble_plan_say_what_runs_instead(small_instance):
    from solvers.outputs.export import megatron_arguments

    p = replace(default_placement(small_instance, tp=1, pp=4, dp=2, vpp=2), schedule="zero_bubble")
    notes = megatron_arguments(small_instance, p)[1]
    assert any("cannot run the planned InterleavedZeroBubble" in n and "Interleaved1F1B" in n for n in notes)
    assert not any("cannot run the planned" in n for n in megatron_arguments(small_instance, replace(p, schedule="1f1b"))[1])


def test_report_says_the_schedule_and_its_gain_over_1f1b(small_instance):
    """Where the job allows more than the 1F1B family, the report names the plan's schedule and its gain."""
    from solvers.outputs.plan_notes import schedule_line

    eager = replace(small_instance.training, software_stack="torchtitan", torch_compile=False,
                    pipeline_schedules=("1F1B", "Interleaved1F1B", "InterleavedZeroBubble"))
    instance = replace(small_instance, training=eager)
    p = replace(default_placement(instance, tp=1, pp=4, dp=2, vpp=2), schedule="zero_bubble")
    e, one = evaluate(instance, p), evaluate(instance, replace(p, schedule="1f1b"))
    line = schedule_line(instance, p, e)
    gain = 100 * (one.iteration_time_s / e.iteration_time_s - 1)
    assert line.startswith("pipeline schedule: InterleavedZeroBubble") and f"{gain:.1f} % faster than " \
        "Interleaved1F1B" in line
    assert schedule_line(small_instance, p, e) == ""  # megatron: the 1F1B family alone, lines as before
