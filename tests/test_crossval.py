"""Leave-one-source-out protocol, the term registry and few-shot calibration."""

import dataclasses
import subprocess
import sys

import pytest

from formulation import terms
from solvers.crossval import cross_validate, spearman
from solvers.runs import DEFAULT_RUNS, DEFAULT_TORCHTITAN, load_run_files, load_runs, source_key
from solvers.user_calibration import apply_calibration, fit_knobs, predicted_time


def test_source_keys_group_tables_of_one_document():
    runs = load_run_files()
    keys = {r.source_key for r in runs}
    sc21 = {r.source_key for r in runs if "SC21" in r.source}
    assert sc21 == {"megatron-sc21"}  # Table 1 and Table 2 are one source
    assert {r.source_key for r in runs if "dgxc-benchmarking" in r.source} == {"dgxc-benchmarking"}
    assert {r.source_key for r in runs if r.file == DEFAULT_TORCHTITAN.name} == {"torchtitan"}
    assert "nemo-perf-summary" in keys and "nemo-long-sequence" in keys
    assert source_key("Someone et al. 2030 (arXiv 1) Table 9") == "Someone et al. 2030"


def test_held_out_source_is_never_in_the_fit():
    runs = load_run_files()
    seen = []

    def fit(train):
        seen.append({r.source_key for r in train})
        return {}

    def predict(run, params):
        return _Fake(run.measured_iter_s or 1.0)

    result = cross_validate(runs, fit=fit, predict=predict)
    assert len(seen) == len(result["sources"]) >= 6
    for fold, train_sources in zip(sorted(result["sources"]), seen):
        assert fold not in train_sources
    assert result["pooled"]["median_abs_error"] == 0.0


@dataclasses.dataclass
class _Fake:
    iteration_time_s: float
    peak_memory_gib: float = 1.0

    @property
    def stages(self):
        return [dataclasses.make_dataclass("S", ["memory"])(dataclasses.make_dataclass("M", ["capacity_gib"])(80.0))]


def test_spearman_undefined_cases_and_ties():
    assert spearman([1.0], [2.0]) is None
    assert spearman([1.0, 1.0], [1.0, 2.0]) is None
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)


def test_single_row_runs_file_validates(tmp_path):
    lines = DEFAULT_RUNS.read_text().splitlines()
    one = tmp_path / "one.csv"
    one.write_text("\n".join(lines[:2]) + "\n")
    for extra in ([], ["--in-sample"]):
        done = subprocess.run([sys.executable, "-m", "solvers.cli", "validate", "--runs", str(one), *extra],
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        assert "POOLED" in done.stdout


def test_terms_switch_off_inside_block_only():
    name = terms.register("test_only_term", "a term used by this test")
    assert terms.enabled(name)
    with terms.disabled(name):
        assert not terms.enabled(name)
    assert terms.enabled(name)
    with pytest.raises(KeyError):
        with terms.disabled("no_such_term"):
            pass
    del terms.TERMS[name]


def test_calibration_knobs_act_in_the_right_direction():
    run = next(r for r in load_runs(DEFAULT_RUNS) if r.skipped_reason is None and r.placement.world_size > 8)
    base = predicted_time(run, {})
    assert predicted_time(run, {"compute_scale": 0.5}) > base
    assert predicted_time(run, {"network_scale": 0.25}) > base
    assert predicted_time(run, {"iteration_overhead_s": 0.5}) == pytest.approx(base + 0.5, rel=1e-9)
    assert apply_calibration(run.instance, {}).cluster.inter_gb_per_s.tolist() == \
        run.instance.cluster.inter_gb_per_s.tolist()


def test_two_runs_recover_a_known_compute_scale():
    """Runs 'measured' as the model with 20 % less compute efficiency: two of them recover the factor."""
    runs = [dataclasses.replace(r) for r in load_runs(DEFAULT_RUNS)
            if r.skipped_reason is None and r.source_key == "megatron-readme-2020"][:2]
    for r in runs:
        r.measured_iter_s = predicted_time(r, {"compute_scale": 0.8})
    cal = fit_knobs(runs)
    assert cal["fitted_knobs"] == ["compute_scale"]
    assert cal["compute_scale"] == pytest.approx(0.8, rel=0.03)  # the weak prior pulls slightly to 1
