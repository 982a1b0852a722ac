"""Pictures: the three PNGs, the schedule simulation behind the Gantt chart, and the slow-link detection."""

from __future__ import annotations

import dataclasses

import pytest

from conftest import build_instance, small_instance_dict
from formulation import default_placement, evaluate
from solvers.outputs.plots import slow_links, write_pictures
from solvers.outputs.schedule import simulate_schedule, stage_order

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def small():
    return build_instance(small_instance_dict(num_nodes=2, gpus_per_node=4, global_batch_size=16))


def _pipeline_estimate(e) -> float:
    """The estimate's pipeline part: compute + bubble + exposed tp/cp + pp send/receive chain."""
    b = e.breakdown
    return b["compute_s"] + b["bubble_s"] + b["tp_comm_s"] + b["cp_comm_s"] + b["pp_comm_s"]


def _assert_pictures(written, directory):
    assert set(written) == {"schedule.png", "memory.png", "cluster.png"}
    for name, path in written.items():
        assert path == directory / name
        data = path.read_bytes()
        assert data.startswith(PNG) and len(data) > 10_000, name
    assert not [p for p in directory.iterdir() if p.name.startswith(".")]  # no temporary files left behind


def test_pictures_of_the_h100_plan(h100, plan, tmp_path):
    _assert_pictures(write_pictures(h100, plan.placement, plan.estimate, tmp_path), tmp_path)


def test_pictures_of_an_interleaved_small_plan(small, tmp_path):
    p = default_placement(small, tp=1, pp=4, dp=2, vpp=2)
    _assert_pictures(write_pictures(small, p, evaluate(small, p), tmp_path), tmp_path)


@pytest.mark.parametrize("config", [dict(tp=1, pp=4, dp=2), dict(tp=2, pp=2, dp=2), dict(tp=1, pp=4, dp=2, vpp=2)])
def test_simulated_schedule_is_consistent(small, config):
    p = default_placement(small, **config)
    e = evaluate(small, p)
    sched = simulate_schedule(small, p, e)
    m = e.num_micro_batches
    for stage in range(p.pp):
        ops = sorted((o for o in sched.ops if o.stage == stage), key=lambda o: o.start)
        assert sum(o.kind == "F" for o in ops) == sum(o.kind == "B" for o in ops) == m * p.vpp
        assert all(a.end <= b.start + 1e-12 for a, b in zip(ops, ops[1:]))  # one op at a time per stage
    forward = {(o.chunk * p.pp + o.stage, o.micro_batch): o for o in sched.ops if o.kind == "F"}
    for (virtual, mb), op in forward.items():  # a micro-batch reaches a virtual stage only after the previous one
        if virtual:
            assert op.start >= forward[(virtual - 1, mb)].end
    path = sched.critical_path
    assert path[0].start == 0 and path[-1].end == sched.makespan_s
    assert all(a.end <= b.start + 1e-12 for a, b in zip(path, path[1:]))


def test_megatron_op_order():
    # 1F1B, 4 stages, 6 micro-batches: stage 1 warms up with 2 forwards, then alternates
    assert stage_order(1, 4, 6, 1)[:6] == [("F", 0, 0), ("F", 0, 1), ("F", 0, 2), ("B", 0, 0), ("F", 0, 3),
                                           ("B", 0, 1)]
    # interleaved, last stage: (vpp - 1) x pp warm-up forwards of chunk 0, then chunk 1 forward before the first
    # backward, which is the last chunk's
    order = stage_order(3, 4, 8, 2)
    assert order[:4] == [("F", 0, 0), ("F", 0, 1), ("F", 0, 2), ("F", 0, 3)]
    assert order[4:6] == [("F", 1, 0), ("B", 1, 0)]


@pytest.mark.parametrize("config", [dict(tp=8, pp=4, cp=1), dict(tp=4, pp=8, cp=1, recompute="selective"),
                                    dict(tp=8, pp=2, cp=1, recompute="full")])
def test_simulated_1f1b_makespan_matches_the_estimate(h100, config):
    p = default_placement(h100, **config)
    e = evaluate(h100, p)
    simulated, predicted = simulate_schedule(h100, p, e).makespan_s, _pipeline_estimate(e)
    assert simulated == pytest.approx(predicted, rel=0.03)


def test_simulated_makespan_of_the_h100_plan_and_uneven_stages(h100, plan, small):
    sched = simulate_schedule(h100, plan.placement, plan.estimate)
    assert sched.makespan_s == pytest.approx(_pipeline_estimate(plan.estimate), rel=0.03)
    p = dataclasses.replace(default_placement(small, tp=1, pp=4, dp=2), layers_per_stage=(1, 3, 3, 1))
    e = evaluate(small, p)
    assert simulate_schedule(small, p, e).makespan_s == pytest.approx(_pipeline_estimate(e), rel=0.05)


def test_slow_links_of_h100_128(h100):
    nic, pairs, gpus = slow_links(h100.cluster)
    names = [n.name for n in h100.cluster.nodes]
    assert [names[i] for i in nic] == ["h100-05"]  # the half-speed NIC
    assert {(names[a], names[b]) for a, b, _, _ in pairs} == {("h100-02", "h100-11"), ("h100-06", "h100-07")}
    assert gpus == {}  # every NVLink pair is nominal
