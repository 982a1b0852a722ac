"""Printed tables stay readable in an ordinary terminal: no number is cut, no line is wider than the screen."""

from __future__ import annotations

import io
import re
from types import SimpleNamespace

import pytest
from rich.console import Console

from conftest import H100_128, build_instance, small_instance_dict
from formulation import default_placement, evaluate, load_instance
from solvers.outputs.report import estimate_tables, gpu_grid_table, print_report, print_tables


def report_text(instance, placement, estimate, width: int = 200) -> str:
    """What the terminal prints for a scored placement (`solve --evaluate`), cells' wrapped lines joined."""
    out = io.StringIO()
    print_report(instance, SimpleNamespace(placement=placement, estimate=estimate),
                 Console(file=out, width=width, color_system=None))
    return " ".join(out.getvalue().replace("│", " ").split())


@pytest.mark.parametrize("width", [80, 100, 160])
def test_tables_fit_the_terminal_and_keep_every_number(width):
    instance = load_instance(H100_128)
    placement = default_placement(instance, tp=4, pp=4, cp=2, vpp=5, micro_batch_size=1, recompute="none",
                                  zero_stage=1)
    estimate = evaluate(instance, placement)
    out = io.StringIO()
    print_tables(estimate_tables(instance, placement, estimate) + [gpu_grid_table(instance, placement)],
                 Console(file=out, width=width, color_system=None))
    text = out.getvalue()
    assert "…" not in text
    assert max(len(line) for line in text.splitlines()) <= width
    cells = " ".join(text.split())
    for stage in estimate.stages:  # every memory figure is printed whole (parts rounded to add up: within 0.1)
        for value in (stage.memory.total_gib, stage.memory.limit_gib):
            assert f" {value:.1f} " in cells
        assert any(f" {stage.memory.activations_gib + d:.1f} " in cells for d in (-0.05, 0.0, 0.05))
        assert re.search(rf"\b{1e3 * stage.dp_sync_s:.1f}\b", cells)
    assert f"{estimate.iteration_time_s:.3f}" in cells


def test_an_mfu_above_every_published_run_is_flagged():
    data = small_instance_dict(1, 8, global_batch_size=64, seq_length=4096)
    data["model"] = {"preset": "llama3-8b"}
    plain = build_instance(data)
    data["cluster"]["gpu_types"]["h100-sxm-80gb"].update(matmul_efficiency=1.0, attention_efficiency=1.0,
                                                           efficiency_half_gflop=0.001)
    boosted = build_instance(data)
    texts = []
    for instance in (plain, boosted):
        placement = default_placement(instance, tp=1, pp=1, micro_batch_size=1, recompute="full", zero_stage=1)
        estimate = evaluate(instance, placement)
        texts.append((estimate.mfu, report_text(instance, placement, estimate)))
    (plain_mfu, plain_text), (boosted_mfu, boosted_text) = texts
    assert plain_mfu < 0.59 and "treat as optimistic" not in plain_text
    assert boosted_mfu > 0.6 and "above the highest MFU published" in boosted_text


def test_the_report_says_how_often_pytorch_stack_runs_measured_beyond_the_slow_end():
    """The interval bands are shared by the stacks; held out by source, about a third of the PyTorch stacks' runs
    measured slower than their band's slow end, where the Megatron stack's almost never did (the share stored in
    intervals.json by `solve validate --write-intervals`). The report says it under a PyTorch-stack estimate, and
    every plan file carries its stack kind's share."""
    import json

    from formulation.intervals import INTERVALS_PATH
    shares = json.loads(INTERVALS_PATH.read_text())["slower_than_p90_by_stack"]
    assert shares["pytorch"] >= 0.2 > shares["megatron"]
    texts, plans = {}, {}
    for stack in ("megatron", "torchtitan"):
        data = small_instance_dict(1, 8, global_batch_size=64, seq_length=4096)
        data["training"]["software_stack"] = stack
        instance = build_instance(data)
        placement = default_placement(instance, tp=1, pp=1, micro_batch_size=1, recompute="full", zero_stage=1)
        estimate = evaluate(instance, placement)
        plans[stack] = estimate.to_dict()
        texts[stack] = report_text(instance, placement, estimate)
    phrase = f"{100 * shares['pytorch']:.0f} % of the published runs on the PyTorch stacks measured slower"
    assert phrase in texts["torchtitan"] and "measured slower" not in texts["megatron"]
    # the plan file carries the share of its stack kind beside the interval
    assert plans["torchtitan"]["iteration_time_slow_tail_share"] == shares["pytorch"]
    assert plans["megatron"]["iteration_time_slow_tail_share"] == shares["megatron"]


def test_runners_up_within_the_interval_are_ties_with_the_parts_that_separate_them():
    """Issue 14: a plan whose p10-p90 interval overlaps the best's is a tie, and the note names the breakdown
    parts where the two differ, largest first; a plan beyond the interval is not called a tie."""
    from solvers.outputs.plan_notes import tie_note
    instance = load_instance(H100_128)
    best = evaluate(instance, default_placement(instance, tp=4, pp=4, cp=2, vpp=5, micro_batch_size=1,
                                                recompute="none", zero_stage=1))
    near = evaluate(instance, default_placement(instance, tp=4, pp=4, cp=2, vpp=5, micro_batch_size=1,
                                                recompute="selective", zero_stage=1))
    far = evaluate(instance, default_placement(instance, tp=8, pp=16, cp=1, vpp=1, micro_batch_size=1,
                                               recompute="full", zero_stage=1))
    lo, hi = best.iteration_time_interval_s
    assert near.iteration_time_interval_s[0] <= hi < far.iteration_time_interval_s[0]
    note = tie_note(best, near)
    assert "TIE with #1" in note and "compute +" in note  # selective recompute costs compute, nothing else
    assert tie_note(best, far) == ""
