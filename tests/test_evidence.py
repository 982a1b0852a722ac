"""Intervals by evidence (formulation/intervals.py, solvers/validation/evidence.py): a stack, GPU, fabric or regime
the reference has no measured runs of gets the band of the matching hold-out, the report and plan file say so, and
`solve validate` measures the bands' coverage and the regret inside sweeps."""

from __future__ import annotations

import csv
import io
import json
import math
from types import SimpleNamespace

import pytest
from rich.console import Console

from conftest import REPO, build_instance, run_solve, small_instance_dict
from formulation import default_placement, evaluate, intervals
from formulation.data import REFERENCE_DIR
from solvers.outputs.report import estimate_tables, print_tables
from solvers.validation import crossval, evidence
from solvers.validation.runs import load_runs

STORED = json.loads(intervals.INTERVALS_PATH.read_text())


def _width(group: str) -> float:
    lo, hi = intervals.prediction_interval(1.0, group)
    return math.log(hi / lo)


def _estimate(stack: str | None, **placement):
    data = small_instance_dict(1, 8, global_batch_size=64, seq_length=4096)
    if stack is not None:
        data["training"]["software_stack"] = stack
    instance = build_instance(data)
    p = default_placement(instance, **({"tp": 1, "pp": 1, "micro_batch_size": 1, "recompute": "full",
                                        "zero_stage": 1} | placement))
    return instance, p, evaluate(instance, p)


def _report(instance, p, e) -> str:
    out = io.StringIO()
    print_tables(estimate_tables(instance, p, e), Console(file=out, width=220, color_system=None))
    return " ".join(out.getvalue().replace("│", " ").split())


def test_the_stored_bands_widen_with_what_the_model_does_not_know():
    """The stored levels come from their hold-outs: an unprofiled stack's band (held out by stack) is wider than
    a profiled 16-bit estimate's (held out by source), and its spread is the largest median error of a stack
    predicted with nothing fitted on it."""
    levels = STORED["levels"]
    assert _width(intervals.UNPROFILED) > _width(intervals.SIXTEEN_BIT) * 1.5
    assert _width(intervals.NEW_SETUP) > _width(intervals.SIXTEEN_BIT)
    unprofiled = levels[intervals.UNPROFILED]
    assert unprofiled["stack_spread"] == pytest.approx(max(abs(e) for e in unprofiled["median_error_by_stack"].values()),
                                                       abs=1e-4)
    assert set(unprofiled["median_error_by_stack"]) == set(STORED["evidence"]) == {"megatron", "torchtitan",
                                                                                   "llm-foundry"}
    # calibrating on two runs of one's own narrows the unprofiled band
    after = STORED["after_two_runs"]
    assert after["log_residual_p90"] - after["log_residual_p10"] < _width(intervals.UNPROFILED)


@pytest.mark.parametrize("name", ["nanotron", "colossalai", "maxtext", "other", "my own trainer"])
def test_an_unknown_stack_is_planned_as_megatron_with_the_unprofiled_band(name):
    """Any stack name is accepted: planned with Megatron-Core's behaviour and efficiency (the same time), with the
    band held out by stack, and the report says which stack, what was assumed and what narrows it."""
    instance, p, e = _estimate(name)
    _, _, megatron = _estimate("megatron")
    assert instance.training.software_stack == "megatron" and instance.training.unmodelled_stack == name
    assert e.iteration_time_s == pytest.approx(megatron.iteration_time_s)
    assert e.interval_group == f"{intervals.UNPROFILED}+16-bit" and megatron.interval_group == intervals.SIXTEEN_BIT
    (lo, hi), (mlo, mhi) = e.iteration_time_interval_s, megatron.iteration_time_interval_s
    # the band leans slow: it reaches far beyond the profiled band's slow end, never inside its fast end
    assert lo <= mlo and hi > mhi * 1.2
    spread = 100 * STORED["levels"][intervals.UNPROFILED]["stack_spread"]
    text = _report(instance, p, e)
    assert f"{name}: not a modelled stack, planned as megatron" in text
    assert (f"no measured runs of {name}: Megatron-Core efficiency assumed; measured stacks predicted so, with "
            f"nothing fitted on them, were off by up to {spread:.0f} %") in text
    assert "`solve calibrate --runs yours.csv --output cal.json` on 2 runs, then `--calibration cal.json`, narrows this" in text
    # the plan file carries the basis
    plan = e.to_dict()
    assert plan["iteration_time_interval_basis"] == intervals.UNPROFILED
    assert plan["iteration_time_interval_evidence"]["missing"] == [f"no measured runs of {name}"]
    assert plan["iteration_time_interval_evidence"]["note"].startswith(f"no measured runs of {name}")


def test_known_stacks_and_aliases_keep_their_own_evidence():
    """megatron-deepspeed is modelled but has no measured runs: unprofiled; the fsdp alias is torchtitan, which
    has; a profiled estimate's note says where its band comes from."""
    instance, _, e = _estimate("megatron-deepspeed")
    assert instance.training.unmodelled_stack == "" and e.interval_group == f"{intervals.UNPROFILED}+16-bit"
    instance, _, e = _estimate("fsdp", zero_stage=3)
    assert instance.training.software_stack == "torchtitan" and instance.training.unmodelled_stack == ""
    assert e.interval_group == intervals.SIXTEEN_BIT and e.interval_gaps == ()
    assert intervals.interval_note(e.interval_group, ()).startswith("measured runs of this stack on this GPU")


def test_a_regime_without_measured_runs_of_the_stack_is_a_new_setup():
    """llm-foundry has no measured FP8 run (the reference's are bf16): an FP8 llm-foundry estimate on H100 is
    NEW_SETUP, the regime named; the same on megatron, which has FP8 runs, is profiled."""
    data = small_instance_dict(1, 8, global_batch_size=64, seq_length=4096)
    data["training"].update(precision="fp8")
    evidence_of = {}
    for stack in ("llm-foundry", "megatron"):
        data["training"]["software_stack"] = stack
        data["training"]["recompute"] = ["none", "full"]
        instance = build_instance(data)
        e = evaluate(instance, default_placement(instance, tp=1, pp=1, micro_batch_size=1, recompute="full",
                                                 zero_stage=1))
        evidence_of[stack] = (e.interval_group, e.interval_gaps)
    assert evidence_of["llm-foundry"] == (f"{intervals.NEW_SETUP}+fp8", ("no measured run of llm-foundry with FP8 GEMMs",))
    assert evidence_of["megatron"] == (intervals.FP8, ())


def test_fabric_coverage_is_link_class_and_bandwidth_within_a_factor():
    seen = [["NVLink", 25.0], ["NVLink", None]]
    assert intervals.fabric_covered(("NVLink", 50.0), seen) and intervals.fabric_covered(("NVLink", None), seen)
    assert not intervals.fabric_covered(("NVLink", 6.25), seen) and not intervals.fabric_covered(("PCIe", 25.0), seen)


def _prediction(row, family, stack, predicted, measured, group=("m", "gpu", 8, 4096, 64)):
    run = SimpleNamespace(row=row, measured_iter_s=measured, group=group,
                          instance=SimpleNamespace(training=SimpleNamespace(unmodelled_stack="", software_stack=stack)))
    return SimpleNamespace(run=run, family=family, timed=True, iteration_time_s=predicted,
                           error=predicted / measured - 1)


def test_regret_is_the_measured_time_of_the_first_ranked_over_the_best():
    """Four runs of one sweep: the model ranks row 2 first (1.0 s predicted), which measured 1.2 s; the fastest
    measured was row 3 (1.1 s): regret 1.2 / 1.1 - 1. A group of three runs is left out, as for Spearman."""
    group = [_prediction(1, "s", "megatron", 1.3, 1.5), _prediction(2, "s", "megatron", 1.0, 1.2),
             _prediction(3, "s", "megatron", 1.05, 1.1), _prediction(4, "s", "megatron", 1.4, 1.3)]
    small = [_prediction(k, "s", "megatron", 1.0 + k, 1.0, group=("other",)) for k in range(5, 8)]
    out = evidence.regret(group + small)
    assert [(g["chosen_row"], g["best_row"], g["runs"]) for g in out["groups"]] == [(2, 3, 4)]
    assert out["median"] == out["worst"] == pytest.approx(1.2 / 1.1 - 1)


def test_the_unprofiled_band_leans_slow_with_one_vote_per_stack():
    """evidence.stack_band: a stack whose runs measured 20% slower than predicted (log -0.2, ten runs) and one
    predicted 10% too slow (two runs, log +0.1, the reference stack predicted from slower ones) give a band from
    -0.2 to -0.1: each stack's median departure put on the slow side, each stack weighing half whatever its runs."""
    lo, hi = evidence.stack_band({"a": [-0.2] * 10, "b": [0.1] * 2})
    assert (lo, hi) == (pytest.approx(-0.2), pytest.approx(-0.1))
    # the within-stack spread is kept about the shifted median: a stack -0.3 to -0.1 about -0.2 (its p10 and p90)
    assert evidence.stack_band({"a": [-0.3, -0.2, -0.1] * 4}) == (pytest.approx(-0.3), pytest.approx(-0.1))
    # a stack predicted 10% too slow (median +0.1) counts as 10% slow: [0.0, 0.2] about 0.1 becomes [-0.2, 0.0]
    assert evidence.stack_band({"b": [0.0, 0.1, 0.2] * 4}) == (pytest.approx(-0.2), pytest.approx(0.0, abs=1e-12))


def test_held_out_bands_come_from_the_other_units_only():
    """Held out by stack, a stack's runs are scored against the band of the other stacks' residuals; the reference
    stack (megatron, predicted with the slower stacks' efficiency) against the mirrored band. torchtitan 20% slow,
    llm-foundry 5%, megatron predicted 10% too slow: torchtitan from [-0.1, -0.05] (outside, slower), megatron
    from the mirror of [-0.2, -0.05] (inside), llm-foundry from [-0.2, -0.1] (outside, faster)."""
    residual = {"megatron": 0.1, "torchtitan": -0.2, "llm-foundry": -0.05}
    preds = [_prediction(k, f"s{k}", stack, math.exp(r), 1.0) for k, (stack, r) in
             enumerate([(s, r) for s, r in residual.items() for _ in range(4)])]
    bands = evidence.held_out_bands(intervals.UNPROFILED, preds)
    expected = {"torchtitan": (-0.1, -0.05), "megatron": (0.05, 0.2), "llm-foundry": (-0.2, -0.1)}
    for p in preds:
        assert bands[p.run.row] == (pytest.approx(expected[crossval.run_stack(p.run)][0]),
                                    pytest.approx(expected[crossval.run_stack(p.run)][1]))
    cover = evidence.coverage(preds, bands, lambda p: crossval.run_stack(p.run))
    assert cover["torchtitan"]["slower_than_p90"] == 1 and cover["megatron"]["inside"] == 1
    assert cover["llm-foundry"]["faster_than_p10"] == 1


def _reference_rows(path, count, **changes):
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        rows = [row | changes for row, _ in zip(reader, range(count))]
        return reader.fieldnames, rows


def _write(path, fields, rows):
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    return path


def test_a_dense_row_with_experts_points_to_the_moe_runs_format(tmp_path):
    fields, rows = _reference_rows(REFERENCE_DIR / "published_runs.csv", 2)
    rows[1]["ep"] = "2"
    runs = load_runs(_write(tmp_path / "mine.csv", fields, rows))
    reason = runs[1].skipped_reason
    assert "not modelled" not in reason and "published_runs_moe.csv" in reason and "model_config" in reason


def test_an_moe_run_takes_its_model_inline_or_from_a_config_file(tmp_path):
    """A user's MoE run of a model with no preset: the model's fields as JSON in `model_config`, or the path of a
    config.json; either predicts what the preset row predicts."""
    fields, rows = _reference_rows(REFERENCE_DIR / "published_runs_moe.csv", 1)
    preset = rows[0]["model_preset"]
    config = json.loads((REPO / "formulation" / "data" / "models" / f"{preset}.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config))
    fields = [f for f in fields if f != "model_preset"] + ["model_config"]
    inline = {k: v for k, v in rows[0].items() if k != "model_preset"}
    path = _write(tmp_path / "moe.csv", fields, [inline | {"model_config": json.dumps(config)},
                                                 inline | {"model_config": "config.json"},
                                                 inline | {"model_config": "{not json"}])
    runs = load_runs(path)
    reference = load_runs(_write(tmp_path / "preset.csv", list(rows[0]), rows))[0]
    expected = evaluate(reference.instance, reference.placement, check=False).iteration_time_s
    for run in runs[:2]:
        assert run.skipped_reason is None
        assert evaluate(run.instance, run.placement, check=False).iteration_time_s == pytest.approx(expected)
    assert "model_config: not a JSON object" in runs[2].skipped_reason


def test_validate_json_carries_the_bands_coverage_and_regret(tmp_path):
    """A user's runs file (predicted by the stored calibration): every prediction carries the p10-p90 its
    estimate would, and the summary the coverage per stack and per source and the regret."""
    fields, rows = _reference_rows(REFERENCE_DIR / "published_runs.csv", 24)
    path = _write(tmp_path / "mine.csv", fields, rows[16:24])
    result = run_solve("validate", "--runs", str(path), "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    for p in out["predictions"]:
        assert p["predicted_p10_s"] < p["predicted_s"] < p["predicted_p90_s"]
    coverage = out["summary"]["coverage_by_level"]["stored"]
    assert sum(c["runs"] for c in coverage["by_stack"].values()) == len(out["predictions"])
    assert sum(c["runs"] for c in coverage["by_source"].values()) == len(out["predictions"])
    assert {"groups", "median", "worst"} <= set(out["summary"]["regret"])


def test_an_fp8_estimate_beyond_profiled_keeps_the_fp8_bands_slow_side():
    """The symmetric bands of the levels beyond profiled never end inside the profiled band of the estimate's
    precision: an unprofiled FP8 estimate reaches at least as far to the slow side as a profiled FP8 one."""
    t = 1.0
    profiled = intervals.prediction_interval(t, intervals.FP8)
    unprofiled = intervals.prediction_interval(t, f"{intervals.UNPROFILED}+{intervals.FP8}")
    assert unprofiled[0] <= profiled[0] and unprofiled[1] >= profiled[1]
    assert intervals.interval_basis(f"{intervals.UNPROFILED}+{intervals.FP8}") == intervals.UNPROFILED


@pytest.fixture(scope="module")
def three_stacks():
    """A100-80GB runs of the three measured stacks, a few per source (quick folds), held out three ways."""
    runs = [r for r in crossval.scored(crossval.reference_runs())
            if r.gpu_type == "a100-sxm-80gb" and r.measured_iter_s is not None]
    picked = []
    for family in sorted({crossval.source_family(r.source) for r in runs}):
        picked += [r for r in runs if crossval.source_family(r.source) == family][:4]
    return evidence.holdouts(picked)


def test_held_out_by_stack_the_band_is_wider_than_held_out_by_source(three_stacks):
    """From the hold-outs themselves (not stored constants): the stacks' runs predicted with nothing fitted on
    their stack spread wider than with nothing fitted on their source, and the band a level stores is the
    quantiles of its own hold-out."""
    stacks = {crossval.run_stack(p.run) for p in three_stacks["stack"]}
    assert stacks == {"megatron", "torchtitan", "llm-foundry"}
    source = [crossval.log_residual(p) for p in three_stacks["source"]]
    levels = evidence.level_quantiles(three_stacks)
    unprofiled = levels[intervals.UNPROFILED]
    lo, hi = crossval.p10_p90(source)
    assert unprofiled["log_residual_p90"] - unprofiled["log_residual_p10"] > hi - lo
    by_stack = {}
    for p in three_stacks["stack"]:
        by_stack.setdefault(crossval.run_stack(p.run), []).append(crossval.log_residual(p))
    assert (unprofiled["log_residual_p10"], unprofiled["log_residual_p90"]) == (
        pytest.approx(evidence.stack_band(by_stack)[0], abs=1e-6), pytest.approx(evidence.stack_band(by_stack)[1],
                                                                                 abs=1e-6))
    coverage = evidence.level_coverage(three_stacks)
    for level in coverage.values():
        assert sum(c["runs"] for c in level["by_stack"].values()) == len(source) == level["all"]["runs"]


@pytest.mark.slow
def test_the_stored_levels_are_the_reference_hold_outs_and_cover_sanely():
    """The whole reference held out three ways (a few minutes): the stored levels are what the hold-outs give,
    and pooled over every run each level's band, derived without the run's source (or stack), covers 70-95%."""
    by_holdout = evidence.holdouts(crossval.reference_runs())
    levels = evidence.level_quantiles(by_holdout)
    for name, level in levels.items():
        assert level["log_residual_p90"] == pytest.approx(STORED["levels"][name]["log_residual_p90"], abs=1e-6)
    coverage = evidence.level_coverage(by_holdout)
    for name, level in coverage.items():
        assert 0.7 <= level["all"]["inside"] <= 0.95, (name, level["all"])
    # the unprofiled band held out by stack covers 70-90% of each stack's runs (issue 41's criterion)
    for stack, c in coverage[intervals.UNPROFILED]["by_stack"].items():
        assert 0.7 <= c["inside"] <= 0.9, (stack, c)


def test_the_intervals_are_written_from_the_reference_held_out_only(tmp_path):
    fields, rows = _reference_rows(REFERENCE_DIR / "published_runs.csv", 3)
    result = run_solve("validate", "--runs", str(_write(tmp_path / "mine.csv", fields, rows)), "--write-intervals")
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert "--write-intervals" in result.stderr and "held out" in result.stderr


def test_expert_parallel_runs_take_the_new_setup_band():
    """The bands' hold-outs hold dense runs only (the MoE reference runs are predicted, never fitted): an
    expert-parallel estimate says so and takes the wider band (on the packaged MoE runs it holds 62% of them, the
    profiled band 38%: docs/uncertainty.md)."""
    run = next(r for r in load_runs("published_runs_moe.csv") if r.skipped_reason is None)
    e = evaluate(run.instance, run.placement, check=False)
    assert e.interval_group.startswith(intervals.NEW_SETUP)
    assert "no measured run of megatron with expert parallelism (ep > 1)" in e.interval_gaps


def test_a_chip_measured_only_in_fp8_is_a_new_setup_for_a_16_bit_estimate(monkeypatch):
    """Megatron's only timed B200 runs in the reference are FP8 (NeMo's long-sequence table): the evidence keeps the
    chips per precision group, so a 16-bit estimate on that chip names the missing 16-bit runs while an FP8 one
    stays profiled. Checked on a stored profile written here, and on the shipped file's B200 entry."""
    profile = {"megatron": {"runs": 1, "gpu_peak_tflops": {"h100-sxm-80gb": 989.0},
                            "gpu_peak_tflops_by_precision": {"fp8": {"h100-sxm-80gb": 989.0}},
                            "fabrics": [["NVLink", None], ["NVLink", 48.0]], "regimes": ["FP8 GEMMs"]}}
    monkeypatch.setattr(intervals, "stored", lambda: {"evidence": profile})
    data = small_instance_dict(1, 8, global_batch_size=64, seq_length=4096)
    groups = {}
    for precision in ("bf16", "fp8"):
        data["training"]["precision"] = precision
        instance = build_instance(data)
        p = default_placement(instance, tp=1, pp=1, micro_batch_size=1, recompute="full", zero_stage=1)
        gpu = instance.cluster.gpu_types["h100-sxm-80gb"]
        groups[precision] = intervals.evidence(instance.training, instance.model, instance.cluster, gpu, p)
    assert groups["fp8"] == (intervals.FP8, ())
    assert groups["bf16"] == (f"{intervals.NEW_SETUP}+16-bit",
                              ("no measured 16-bit run of megatron on h100-sxm-80gb",))
    shipped = STORED["evidence"]["megatron"]["gpu_peak_tflops_by_precision"]
    assert "b200" in shipped["fp8"] and "b200" not in shipped.get("16-bit", {})
