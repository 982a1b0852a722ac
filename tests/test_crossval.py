"""Leave-one-source-out validation is honest (a source's own measurements never reach its prediction),
few-shot calibration moves the knobs the runs speak for, and every estimate carries its interval."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from conftest import REPO, build_instance, run_solve
from formulation import default_placement, evaluate
from formulation.inputs.user_calibration import UserCalibration, apply_user_calibration, load_user_calibration
from solvers.validation import crossval, fewshot

A100_FAMILIES = ("Megatron-LM SC21 paper", "Korthikanti et al. 2022", "Megatron-LM README 2024")


@pytest.fixture(scope="module")
def a100_runs():
    runs = [r for r in crossval.scored(crossval.reference_runs())
            if crossval.source_family(r.source) in A100_FAMILIES and r.gpu_type == "a100-sxm-80gb"]
    # four runs per source keep the folds' fits quick (one parameter below MIN_ROWS_FULL_FIT rows)
    return [r for family in A100_FAMILIES for r in [r for r in runs if crossval.source_family(r.source) == family][:4]]


def test_every_reference_source_has_a_named_family():
    names = {name for _, name in crossval.FAMILIES}
    assert {crossval.source_family(r.source) for r in crossval.reference_runs()} <= names


def test_ibm_fms_fsdp_runs_are_one_family_scored_as_published():
    """IBM's fms-fsdp tables (formulation/data/reference/README.md): sixteen FSDP runs of one family, numbered from
    1300 (1312-1315 the 7B runs, HSDP with a shard group of 8), every one scored with its recompute share (`block:r`
    = p x layers) and its published tokens/s per GPU: 13B eager at 1800 tokens/s on 128 A100 is 2 x 4096 / 1800 =
    4.55 s per step, one micro-batch of 2 per GPU; gradients reduced in bf16."""
    runs = {r.row: r for r in crossval.reference_runs() if crossval.source_family(r.source) == "IBM fms-fsdp"}
    assert sorted(runs) == list(range(1300, 1316))
    assert {r: runs[r].placement.dp_replicate for r in range(1312, 1316)} == {
        r: runs[r].placement.dp // 8 for r in range(1312, 1316)}
    assert all(r in crossval.scored(list(runs.values())) for r in runs.values())
    assert all(r.instance.training.software_stack == "torchtitan" and r.placement.zero_stage == 3 for r in runs.values())
    # fms-fsdp's bfSixteen MixedPrecision reduces gradients in bf16: 2 bytes per parameter on the wire, not 4
    assert {r.instance.training.grad_reduce_bytes for r in runs.values()} == {2.0}
    assert runs[1300].measured_iter_s == pytest.approx(2 * 4096 / 1800)
    assert runs[1300].placement.recomputed_layers(40) == 20 and runs[1301].placement.recomputed_layers(48) == 48
    assert [runs[r].instance.training.torch_compile for r in (1305, 1306)] == [False, True]
    assert not runs[1306].instance.training.compiled_loss  # the loss runs outside the compiled model


def test_a_held_out_source_never_reaches_its_own_prediction(a100_runs):
    base = {p.run.row: p.iteration_time_s for p in crossval.cross_validate(a100_runs)}
    # make one source's measurements absurd: its leave-one-source-out predictions must not move
    target = A100_FAMILIES[1]
    skewed = [dataclasses.replace(r, measured_iter_s=r.measured_iter_s * 3)
              if crossval.source_family(r.source) == target else r for r in a100_runs]
    moved = {p.run.row: p.iteration_time_s for p in crossval.cross_validate(skewed)}
    held = [r.row for r in a100_runs if crossval.source_family(r.source) == target]
    assert held and all(moved[row] == pytest.approx(base[row], rel=1e-9) for row in held)
    # ... while the other sources, whose folds did fit on the skewed rows, do move
    others = [r.row for r in a100_runs if crossval.source_family(r.source) != target]
    assert any(abs(moved[row] / base[row] - 1) > 0.01 for row in others)


def test_summary_counts_sources_and_pooled(a100_runs):
    summary = crossval.summarize(crossval.cross_validate(a100_runs, in_sample=True))
    assert sum(s["runs"] for s in summary["sources"].values()) == summary["pooled"]["runs"] == len(a100_runs)
    assert all(abs(s["median_error"]) <= s["median_abs_error"] for s in summary["sources"].values())


def test_spearman_against_known_values():
    assert crossval.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert crossval.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert crossval.spearman([1, 2, 3], [1, 1, 1]) is None and crossval.spearman([1], [2]) is None


def test_few_shot_recovers_a_slower_cluster(a100_runs):
    # a cluster 25 % slower in compute than the model thinks: two runs pin it, the rest are then predicted
    truth = UserCalibration(compute_scale=0.8)
    runs = sorted(a100_runs, key=lambda r: r.measured_iter_s)[:6]
    cases = [(r.instance, r.placement, evaluate(apply_user_calibration(r.instance, truth), r.placement,
                                                check=False).iteration_time_s) for r in runs]
    cal = fewshot.fit_user_calibration([cases[0], cases[-1]])
    assert cal.compute_scale == pytest.approx(0.8, abs=0.05)
    for inst, placement, measured in cases[1:-1]:
        predicted = evaluate(apply_user_calibration(inst, cal), placement, check=False).iteration_time_s
        assert predicted == pytest.approx(measured, rel=0.03)


def test_every_pair_of_a_uniformly_slower_cluster_calibrates_the_rest(a100_runs):
    """fewshot.every_pair_table (what `solve validate --few-shot` judges the two-run rule by): clusters that measure
    exactly what the model predicts stay at 0 over every pair; clusters 20% slower in compute (a common factor, what
    two runs can pin: 12-17% slower) come within 3% over every pair; one row per cluster (>= 4 runs), every pair."""
    predictions = crossval.cross_validate(a100_runs, in_sample=True)
    for scale, bound in ((1.0, 1e-3), (0.8, 0.03)):
        truth = UserCalibration(compute_scale=scale)
        synthetic = [dataclasses.replace(p, run=dataclasses.replace(p.run, measured_iter_s=evaluate(
            apply_user_calibration(p.instance, truth), p.run.placement, check=False).iteration_time_s))
            for p in predictions]
        table = fewshot.every_pair_table(synthetic)
        assert len(table) >= 2 and all(r["pairs"] == r["runs"] * (r["runs"] - 1) // 2 for r in table)
        for r in table:
            assert r["quartiles"][0] <= r["median_over_pairs"] <= r["quartiles"][1] and r["median_over_pairs"] < bound
    before = [abs(p.iteration_time_s / s.run.measured_iter_s - 1) for p, s in zip(predictions, synthetic)]
    assert min(before) > 0.1


def test_two_contradicting_runs_move_the_knob_less_than_their_midpoint(a100_runs):
    """Huber's loss on each run's log error: one run as the model predicts and one 40% slower pull the compute
    scale less far than least squares would (their midpoint, shrunk by the prior), and a pair that agrees is
    fitted exactly as before (both within the Huber scale)."""
    runs = sorted(a100_runs, key=lambda r: r.measured_iter_s)[:2]
    base = [(r.instance, r.placement, evaluate(r.instance, r.placement, check=False).iteration_time_s) for r in runs]
    contradicting = [base[0], (*base[1][:2], base[1][2] * 1.4)]
    robust = fewshot.fit_user_calibration(contradicting).compute_scale
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fewshot, "HUBER_RUNS", 1e9)
        mp.setattr(fewshot, "huber_residual", lambda r, scale=0.0: r)
        squares = fewshot.fit_user_calibration(contradicting).compute_scale
    assert squares < robust < 1.0
    assert 1 - robust < 0.75 * (1 - squares)
    agreeing = [(inst, p, t * 1.05) for inst, p, t in base]
    assert fewshot.fit_user_calibration(agreeing).compute_scale < 0.97


def test_calibrate_writes_knobs_that_solve_applies(tmp_path):
    runs_csv = tmp_path / "mine.csv"
    lines = (REPO / "formulation" / "data" / "reference" / "published_runs.csv").read_text().splitlines()
    runs_csv.write_text("\n".join([lines[0]] + [l for l in lines[1:] if "README_8b" in l][:3]) + "\n")
    out = run_solve("calibrate", "--runs", runs_csv, "--output", tmp_path / "cal.json")
    assert out.returncode == 0, out.stderr
    assert "leave-one-out" in out.stdout and "median |error|" in out.stdout
    cal = load_user_calibration(tmp_path / "cal.json")
    assert cal.leave_one_out_error is not None and len(cal.fitted_on) >= 2
    slow = tmp_path / "slow.json"
    slow.write_text(json.dumps({"compute_scale": 0.5}))
    instance = REPO / "instances" / "small_2x4.json"
    base = json.loads(run_solve("--instance", instance, "--method", "baseline", "--json").stdout)
    slowed = json.loads(run_solve("--instance", instance, "--method", "baseline", "--json",
                                  "--calibration", slow).stdout)
    assert slowed["estimate"]["iteration_time_s"] > 1.5 * base["estimate"]["iteration_time_s"]


def _runs_file(tmp_path, rows: list[int]):
    """A user's runs CSV of these rows of the packaged reference (row k is line k + 1, after the header)."""
    lines = (REPO / "formulation" / "data" / "reference" / "published_runs.csv").read_text().splitlines()
    path = tmp_path / "mine.csv"
    path.write_text("\n".join([lines[0]] + [lines[k + 1] for k in rows]) + "\n")
    return path


def test_calibrate_warns_when_its_runs_disagree(tmp_path):
    """llm-foundry's MPT-70B on 128 and on 64 A100-40GB (rows 121 and 122) disagree: each predicts the other
    about 20% off, beyond sqrt(2) x RUN_SPREAD, and both `solve calibrate` and `solve --calibration` say so. Two
    DGX Cloud Llama-3.1-70B runs (row 61 in bf16 at dp 16, row 68 in FP8 at dp 32) predict each other within 3%:
    no warning."""
    instance = REPO / "instances" / "small_2x4.json"
    for rows, disagree in (([121, 122], True), ([61, 68], False)):
        cal_path = tmp_path / f"cal_{rows[0]}.json"
        out = run_solve("calibrate", "--runs", _runs_file(tmp_path, rows), "--output", cal_path)
        assert out.returncode == 0, out.stderr
        assert ("warning: the calibration runs disagree" in out.stderr) == disagree, out.stderr
        cal = load_user_calibration(cal_path)
        assert (cal.leave_one_out_error > fewshot.DISAGREEMENT) == disagree
        planned = run_solve("--instance", instance, "--method", "baseline", "--calibration", cal_path)
        assert planned.returncode == 0, planned.stderr
        assert ("calibration runs disagree" in planned.stderr) == disagree, planned.stderr


@pytest.mark.parametrize("loo, warns", [(None, False), (0.05, False), (0.2, True), ("0.2", False), (True, False)])
def test_disagreement_warning_reads_only_a_number(loo, warns):
    """The threshold is sqrt(2) x RUN_SPREAD (8.1%); a hand-edited calibration file's non-number is no warning
    and no crash."""
    assert math.isclose(fewshot.DISAGREEMENT, math.sqrt(2) * fewshot.RUN_SPREAD)
    assert (fewshot.disagreement_warning(UserCalibration(leave_one_out_error=loo)) is not None) == warns


def test_validate_handles_a_one_row_file(tmp_path):
    lines = (REPO / "formulation" / "data" / "reference" / "published_runs.csv").read_text().splitlines()
    one = tmp_path / "one.csv"
    one.write_text(lines[0] + "\n" + lines[1] + "\n")
    out = run_solve("validate", "--runs", one)
    assert out.returncode == 0 and "Traceback" not in out.stderr and "pooled" in out.stdout


def _estimate_as(precision: str, gpu_type: str = "h100-sxm-80gb"):
    """small_2x4's default plan, trained in `precision` on GPUs of `gpu_type` (its own: H100)."""
    data = json.loads((REPO / "instances" / "small_2x4.json").read_text())
    data["training"]["precision"] = precision
    data["cluster"]["gpu_types"] = {gpu_type: {"preset": gpu_type}}
    for node in data["cluster"]["nodes"]:
        node["gpu_type"] = gpu_type
    instance = build_instance(data)
    return evaluate(instance, default_placement(instance, tp=1, pp=1, micro_batch_size=1, recompute="none",
                                                zero_stage=1))


@pytest.mark.parametrize("precision, gpu_type, group", [("bf16", "h100-sxm-80gb", "16-bit"), ("fp8", "h100-sxm-80gb", "fp8"),
                                                        ("fp8", "a100-sxm-80gb", "16-bit")])
def test_every_estimate_carries_the_stored_interval_of_its_precision(precision, gpu_type, group):
    """An FP8 run's interval comes from the FP8 runs' residuals, a 16-bit run's from the others'; an FP8 job on
    GPUs without FP8 tensor cores runs its GEMMs in bf16 and takes the 16-bit band."""
    estimate = _estimate_as(precision, gpu_type)
    stored = json.loads((REPO / "formulation" / "data" / "intervals.json").read_text())["by_precision"][group]
    out = estimate.to_dict()
    lo, hi = out["iteration_time_interval_s"]
    t = estimate.iteration_time_s
    assert out["iteration_time_interval_basis"] == group
    assert lo == pytest.approx(t * math.exp(-stored["log_residual_p90"]))
    assert hi == pytest.approx(t * math.exp(-stored["log_residual_p10"])) and lo < t < hi


def test_the_fp8_band_reaches_further_to_the_slow_side():
    """The stored bands differ as the residuals do: FP8 predictions were optimistic across sources (median signed
    error about -7%), so their band's slow end lies further above the estimate than the 16-bit band's."""
    bf16, fp8 = _estimate_as("bf16"), _estimate_as("fp8")
    slow_end = {name: e.iteration_time_interval_s[1] / e.iteration_time_s for name, e in (("bf16", bf16), ("fp8", fp8))}
    assert slow_end["fp8"] > slow_end["bf16"] * 1.05


def test_a_group_with_too_few_runs_takes_the_pooled_band(tmp_path, monkeypatch):
    from formulation import intervals
    stored = {"log_residual_p10": -0.1, "log_residual_p90": 0.05, "runs": 30,
              "by_precision": {"fp8": {"log_residual_p10": -0.3, "log_residual_p90": 0.0, "runs": 5},
                               "16-bit": {"log_residual_p10": -0.02, "log_residual_p90": 0.04, "runs": 25}}}
    path = tmp_path / "intervals.json"
    path.write_text(json.dumps(stored))
    monkeypatch.setattr(intervals, "INTERVALS_PATH", path)
    intervals._quantiles.cache_clear()
    try:
        assert intervals.interval_basis("fp8") == "pooled" and intervals.interval_basis("16-bit") == "16-bit"
        assert intervals.prediction_interval(1.0, "fp8") == pytest.approx((math.exp(-0.05), math.exp(0.1)))
        assert intervals.prediction_interval(1.0, "16-bit") == pytest.approx((math.exp(-0.04), math.exp(0.02)))
    finally:
        intervals._quantiles.cache_clear()


def test_ablation_flips_each_term_once_and_restores_it(a100_runs):
    from formulation.physics.cost import PHYSICS_TERMS
    before = dict(PHYSICS_TERMS)
    rows = crossval.ablation(a100_runs[:4], PHYSICS_TERMS)
    assert PHYSICS_TERMS == before
    assert [r["term"] for r in rows] == ["(defaults)", *before]
    assert all(r["flipped_to"] == (not before[r["term"]]) for r in rows[1:])
    assert all(r["pooled_median_abs_error"] is not None for r in rows)


def test_the_stored_calibration_never_reaches_a_fold(a100_runs, monkeypatch):
    """The stored calibration was fitted on every source, the held-out one included: a fold must not start
    from it (with four runs per source only the GEMM efficiency is fitted, so the start's other values
    would be used as they are). Absurd stored values leave every prediction where it was."""
    base = {p.run.row: p.iteration_time_s for p in crossval.cross_validate(a100_runs)}
    real = crossval.gpu_catalog

    def absurd(stack="megatron"):
        catalog = dict(real(stack))
        for name, entry in catalog.items():
            if name != "__default__":
                catalog[name] = dict(entry, efficiency_half_gflop=5000.0, attention_efficiency=0.05)
        return catalog

    monkeypatch.setattr(crossval, "gpu_catalog", absurd)
    moved = {p.run.row: p.iteration_time_s for p in crossval.cross_validate(a100_runs)}
    assert moved.keys() == base.keys()
    assert all(moved[row] == pytest.approx(base[row], rel=1e-9) for row in base)


def test_interval_coverage_scores_each_source_against_the_other_sources_bands(monkeypatch):
    """Synthetic residuals on five sources: a quarter of the runs (FP8) predicted 20% optimistic, the rest right,
    each +-1%. Per precision each source's runs fall inside the band of the other sources' runs of their group
    (up to its own p10/p90 tails); one pooled band, set mostly by the 16-bit runs, leaves several times the
    nominal 10% of the FP8 runs slower than its slow end."""
    from types import SimpleNamespace
    runs = []
    for k in range(40):
        group = "fp8" if k % 4 == 0 else "16-bit"
        ratio = (0.80 if group == "fp8" else 1.0) * (1 + 0.001 * (k % 20 - 10))  # predicted / measured
        stack = "torchtitan" if k % 2 else "megatron"
        runs.append(SimpleNamespace(family=f"source {k % 5}", timed=True, iteration_time_s=ratio, group=group,
                                    run=SimpleNamespace(measured_iter_s=1.0),
                                    instance=SimpleNamespace(training=SimpleNamespace(software_stack=stack))))
    monkeypatch.setattr(crossval, "residual_group", lambda p: p.group)
    monkeypatch.setattr(crossval, "MIN_GROUP_RUNS", 5)
    coverage = crossval.interval_coverage(runs)
    grouped, pooled = coverage["by_precision"], coverage["pooled"]
    assert (grouped["fp8"]["runs"], grouped["16-bit"]["runs"]) == (10, 30)
    for c in grouped.values():
        assert c["faster_than_p10"] + c["inside"] + c["slower_than_p90"] == pytest.approx(1.0)
        assert c["inside"] >= 0.6
    assert pooled["fp8"]["slower_than_p90"] >= 0.3
    # the same per-precision bands, counted by stack kind: every run once, half of them on a PyTorch stack
    by_stack = coverage["by_stack"]
    assert (by_stack["pytorch"]["runs"], by_stack["megatron"]["runs"]) == (20, 20)
    assert by_stack["pytorch"]["inside"] >= 0.6 and by_stack["megatron"]["inside"] >= 0.6
