"""The plausibility guard: the table of the highest MFU published per GPU type and precision, its figures
recomputed from the runs they came from, and the flag an estimate above it raises in the report, the plan file and
the sweep table."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from conftest import build_instance, small_instance_dict
from formulation import default_placement, evaluate
from formulation.data import REFERENCE_DIR
from formulation.inputs.model import load_model_section
from formulation.intervals import interval_group
from formulation.mfu_ceiling import CEILINGS_PATH, ceilings, load_ceilings, mfu_check
from formulation.physics import moe_cost
from solvers.outputs.report import estimate_tables, estimate_warnings, print_tables
from solvers.result import PlanResult, SolverReport
from solvers.sweep.cells import plan_row
from solvers.validation.runs import load_runs


def _run_mfu(run) -> float:
    """A measured run's MFU as the planner defines it (formulation/evaluate.py): Megatron-LM's model FLOPs over
    the measured time, per GPU, over the 16-bit peak."""
    inst = run.instance
    flops = moe_cost.model_flops(inst.model, inst.training.global_batch_size, inst.training.seq_length)
    peak = inst.cluster.gpu_types[run.gpu_type].peak_tflops
    return flops / run.measured_iter_s / run.placement.world_size / 1e12 / peak


@pytest.fixture(scope="module")
def reference_runs():
    runs = []
    for path in sorted(REFERENCE_DIR.glob("published_runs*.csv")):
        runs += [(path.name, i, r) for i, r in enumerate(load_runs(path))
                 if r.instance is not None and r.measured_iter_s is not None]
    return runs


def test_every_ceiling_names_its_run_and_source():
    table = ceilings()
    assert 0 < table.tolerance <= 0.05
    keys = {(c.gpu_type, c.precision, c.model_kind) for c in table.entries}
    assert len(keys) == len(table.entries), "one entry per GPU type, precision and model kind"
    for wanted in [("a100-sxm-80gb", "16-bit", "dense"), ("h100-sxm-80gb", "16-bit", "dense"),
                   ("h100-sxm-80gb", "fp8", "dense"), ("h200-sxm-141gb", "fp8", "dense"), ("b200", "fp8", "dense"),
                   ("gb200", "fp8", "dense"), ("h100-sxm-80gb", "16-bit", "moe")]:
        assert wanted in keys
    for c in table.entries:
        assert c.source["title"] and c.source["url"].startswith("https://")
        assert {"model", "gpus", "seq_length", "global_batch_size", "run_precision", "measured"} <= set(c.run)
        assert c.published and c.conversion
        assert (c.reference is None) != (c.derived is None), "recomputable from the reference or from tokens/s"
    # the H200 borrows the H100 SXM's 16-bit figure (same die and peaks)
    assert table.best("h200-sxm-141gb", "16-bit", "dense") == table.best("h100-sxm-80gb", "16-bit", "dense")


def test_reference_ceilings_are_their_rows_recomputed_with_the_planners_flop_count(reference_runs):
    by_row = {(name, i): run for name, i, run in reference_runs}
    checked = 0
    for c in ceilings().entries:
        if c.reference:
            run = by_row[(c.reference["file"], c.reference["row"])]
            assert run.gpu_type == c.gpu_type
            assert run.instance.training.seq_length == c.run["seq_length"]
            assert _run_mfu(run) == pytest.approx(c.mfu, abs=6e-5)
            checked += 1
    assert checked >= 8
    # two by hand: DGX Cloud's Llama 3.1 8B on 8 H100 (59.37% as NVIDIA counts, full attention as the planner
    # does) and fms-fsdp's Llama-2-7B on 128 A100 (4,550 tokens/s per GPU: 6 x 6.74e9 + 12 x 32 x 4096 x 4096
    # = 46.9 GFLOP per token with full attention, 0.684 of 312 TFLOP/s; the planner's count, with the logits and
    # without the embedding's share, 0.672; fms-fsdp published 0.68)
    assert ceilings().best("h100-sxm-80gb", "16-bit", "dense").mfu == pytest.approx(0.5937, abs=0.002)
    assert ceilings().best("a100-sxm-80gb", "16-bit", "dense").mfu == pytest.approx(
        4550 * (6 * 6.74e9 + 12 * 32 * 4096 * 4096) / 312e12, abs=0.015)


def test_derived_ceilings_are_their_tokens_per_second_with_the_planners_flop_count():
    derived = [c for c in ceilings().entries if c.derived]
    assert derived
    for c in derived:
        model = load_model_section({"preset": c.derived["preset"]}, "<preset>", Path("."))
        seq = c.run["seq_length"]
        per_token = moe_cost.model_flops(model, 1, seq) / seq
        mfu = per_token * c.derived["tokens_per_s_per_gpu"] / 1e12 / c.derived["peak_tflops"]
        assert mfu == pytest.approx(c.mfu, abs=6e-5)
    # NeMo's own count gives 932 TFLOP/s for its GPT3-175B FP8 row on 512 H100s: the planner's count agrees
    nemo = ceilings().best("h100-sxm-80gb", "fp8", "dense")
    assert nemo.mfu * 989 == pytest.approx(932, rel=0.002)


def test_no_reference_run_is_above_its_ceiling(reference_runs):
    """The entries are the highest in the reference: no packaged run of a GPU type, precision and kind measured a
    higher MFU (the planner's definition) than the table says."""
    table = ceilings()
    covered = 0
    for name, i, run in reference_runs:
        inst = run.instance
        group = interval_group(inst.training, inst.cluster.gpu_types[run.gpu_type])
        kind = "moe" if moe_cost.is_moe(inst.model) else "dense"
        best = table.best(run.gpu_type, group, kind)
        if best is None:
            continue
        covered += 1
        assert _run_mfu(run) <= best.mfu + 6e-5, f"{name} row {i} ({run.name}) is above its ceiling"
    assert covered >= 150


def _estimates(boost: bool, precision: str = "bf16", gpu: str = "h100-sxm-80gb"):
    data = small_instance_dict(1, 8, global_batch_size=64, seq_length=4096)
    data["model"] = {"preset": "llama3-8b"}
    data["training"]["precision"] = precision
    data["cluster"]["gpu_types"] = {"mine": {"preset": gpu}}  # a name of the user's: matched by the preset's facts
    for node in data["cluster"]["nodes"]:
        node["gpu_type"] = "mine"
    if boost:  # a GPU that runs every GEMM and attention call at its peak: an MFU no one has published
        data["cluster"]["gpu_types"]["mine"].update(matmul_efficiency=1.0, attention_efficiency=1.0,
                                                    efficiency_half_gflop=0.001)
    instance = build_instance(data)
    placement = default_placement(instance, tp=1, pp=1, micro_batch_size=1, recompute="full", zero_stage=1)
    return instance, placement, evaluate(instance, placement)


def _flags(instance, placement, estimate) -> tuple[str, dict, dict]:
    out = io.StringIO()
    console = Console(file=out, width=400, color_system=None)
    print_tables(estimate_tables(instance, placement, estimate), console)
    for warning in estimate_warnings(instance, estimate):  # printed under the summary, as `solve` does
        console.print(f"WARNING: {warning}")
    report = SolverReport(method="test", status="optimal", objective_s=estimate.iteration_time_s,
                          bound_s=estimate.iteration_time_s, gap=0.0, wall_time_s=0.0, seed=0)
    result = PlanResult(placement=placement, estimate=estimate, solver=report)
    plan = json.loads(json.dumps(result.to_dict(instance.cluster)))
    return " ".join(out.getvalue().split()), plan, plan_row(instance, result, 15e12)


def test_an_estimate_above_its_ceiling_is_flagged_in_report_plan_and_sweep_row():
    instance, placement, estimate = _estimates(boost=True)
    ceiling = ceilings().best("h100-sxm-80gb", "16-bit", "dense")
    assert estimate.mfu > ceiling.mfu * (1 + ceilings().tolerance)
    text, plan, row = _flags(instance, placement, estimate)
    assert "WARNING: MFU" in text and "above the highest MFU published" in text
    assert ceiling.source["url"] in text
    flag = plan["plausibility"]
    assert flag["status"] == "above_published" and flag["gpu_type"] == "h100-sxm-80gb"
    assert flag["ceiling_mfu"] == ceiling.mfu and flag["ceiling"]["source"] == ceiling.source
    assert flag["excess"] == pytest.approx(estimate.mfu / ceiling.mfu - 1)
    assert row["mfu_above_published"] is True and row["mfu_ceiling"] == ceiling.mfu
    assert ceiling.source["url"] in row["mfu_ceiling_source"]


def test_an_estimate_below_its_ceiling_is_not_flagged():
    instance, placement, estimate = _estimates(boost=False)
    assert estimate.mfu < ceilings().best("h100-sxm-80gb", "16-bit", "dense").mfu
    text, plan, row = _flags(instance, placement, estimate)
    assert "above the highest MFU published" not in text
    assert plan["plausibility"]["status"] == "within_published" and plan["plausibility"]["warning"] == ""
    assert row["mfu_above_published"] is False


def test_fp8_and_same_chip_estimates_take_their_own_ceilings():
    """An FP8 plan is checked against FP8 runs (its MFU is over the 16-bit peak, as theirs); an H200 against the
    higher of its own figures and the H100 SXM's."""
    instance, _, estimate = _estimates(boost=False, precision="fp8", gpu="h200-sxm-141gb")
    check = mfu_check(instance.cluster, estimate)
    assert (check.gpu_type, check.precision, check.model_kind) == ("h200-sxm-141gb", "fp8", "dense")
    assert check.ceiling is ceilings().best("h100-sxm-80gb", "fp8", "dense")
    assert not check.above
    instance, _, estimate = _estimates(boost=False, gpu="b200")  # no public 16-bit dense B200 figure
    assert mfu_check(instance.cluster, estimate) is None


def test_a_ceiling_table_without_a_source_is_refused(tmp_path):
    data = json.loads(CEILINGS_PATH.read_text())
    data["entries"][0]["source"] = {"title": "somewhere"}
    path = tmp_path / "ceilings.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"ceilings.json: entries\[0\].source"):
        load_ceilings(path)


def test_the_sweep_table_files_carry_the_flag(tmp_path):
    """table.csv and table.json carry the ceiling, its source and the flag; index.html sets the flagged row apart."""
    import csv

    from solvers.sweep.cells import load_sweep
    from solvers.sweep.tables import write_tables
    sweep = load_sweep(Path(__file__).resolve().parent.parent / "instances" / "sweeps" / "llama31_70b_15t.yaml")
    rows = []
    for i, boost in enumerate((False, True)):
        row = _flags(*_estimates(boost=boost))[2]
        rows.append({"cell": i, "key": f"k{i}", "gpu_type": "h100-sxm-80gb", **row})
    write_tables(sweep, rows, tmp_path)
    table = list(csv.DictReader((tmp_path / "table.csv").open()))
    assert [r["mfu_above_published"] for r in table] == ["False", "True"]
    assert all("dgxc-benchmarking" in r["mfu_ceiling_source"] for r in table)
    cells = json.loads((tmp_path / "table.json").read_text())["cells"]
    assert [c["mfu_above_published"] for c in cells] == [False, True]
    page = (tmp_path / "index.html").read_text()
    assert page.count('<tr class="flag">') == 1
