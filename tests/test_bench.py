"""`solve bench` on a small instance: its files, and annealing never reported better than the proven optimum."""

from __future__ import annotations

import csv
import json

from solvers.validation.bench import _write, run_bench


def test_bench_on_a_small_instance_writes_its_files_and_never_beats_the_optimum(tmp_path):
    result = run_bench(["small_2x4"], seeds=2, budget=1.0, methods=["default", "cpsat", "anneal@budget"])
    rows = {(s["method"]): s for s in result["summary"]}
    assert rows["cpsat"]["optimal"] == 1 and rows["cpsat"]["gap"] == 0.0
    optimum = rows["cpsat"]["objective_s"]
    for run in result["runs"]:
        assert run["objective_s"] >= optimum * (1 - 1e-9), run  # nothing beats a proven optimum
        assert run["time_to_1pct_s"] is None or run["time_to_1pct_s"] <= run["wall_s"] + 1e-6
    assert rows["default"]["objective_s"] >= optimum * (1 - 1e-9)
    written = _write(result, tmp_path)
    assert [p.name for p in written] == ["bench.csv", "bench.json", "bench.png"]
    with open(tmp_path / "bench.csv") as f:
        assert len(list(csv.DictReader(f))) == len(result["runs"]) == 1 + 1 + 2
    assert json.loads((tmp_path / "bench.json").read_text())["budget_s"] == 1.0
    assert (tmp_path / "bench.png").stat().st_size > 10_000


def test_mixed_bench_compares_with_single_islands_and_the_type_blind_default(tmp_path):
    from conftest import write_instance
    from test_islands import mixed_dict

    path = write_instance(tmp_path, mixed_dict(9))
    result = run_bench([str(path)], seeds=1, budget=1.0,
                       methods=["default", "largest-island", "best-island", "auto"])
    rows = {s["method"]: s for s in result["summary"]}
    assert rows["auto"]["optimal"] == 1
    composed = rows["auto"]["objective_s"]
    # adding the other type never makes the plan slower than any island alone or the type-blind split
    assert composed <= rows["best-island"]["objective_s"] * (1 + 1e-9)
    assert rows["best-island"]["objective_s"] <= rows["largest-island"]["objective_s"] * (1 + 1e-9)
    assert composed <= rows["default"]["objective_s"] * (1 + 1e-9)
    assert all(s["tokens_per_s"] > 0 for s in result["summary"])
