"""Capacity sweeps: every cell an ordinary plan; failures recorded, not fatal; cached so a rerun recomputes
nothing; the local pool and Ray give the same table."""

from __future__ import annotations

import json

import pytest
import yaml

from conftest import REPO, small_instance_dict, write_instance
from solvers.sweep import cells as sweep_cells
from solvers.sweep import run as sweep_run
from solvers.sweep.cells import cells, load_sweep
from solvers.sweep.tables import pareto_front

# Fields that depend on the machine's speed, not on the plan.
TIMING = ("wall_time_s",)


def _sweep_file(tmp_path, **extra) -> object:
    base = small_instance_dict(2, 4, global_batch_size=16)
    base["training"].update(recompute=["none", "full"], zero_stage=[1], context_parallel_sizes=[1],
                            virtual_pipeline_sizes=[1], max_micro_batch_size=2)
    write_instance(tmp_path, base, "base.json")
    spec = {"name": "tiny", "base": "base.json", "token_budget": 1.0e9, "seed": 0,
            "axes": {"nodes": [1, 2], "gpu_type": ["h100-sxm-80gb", "a100-sxm-80gb", "no-such-gpu"]},
            "prices": {"h100-sxm-80gb": 2.5, "a100-sxm-80gb": 1.2}, **extra}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _table(rows):
    """The rows without wall-clock times (the plan's solver report has its own)."""
    out = []
    for r in rows:
        row = {k: v for k, v in r.items() if k not in TIMING}
        if "plan" in row:
            row["plan"] = {**row["plan"], "solver": {k: v for k, v in row["plan"]["solver"].items()
                                                     if k not in TIMING}}
        out.append(row)
    return out


def test_cells_cover_every_combination_and_a_failing_cell_does_not_stop_the_sweep(tmp_path):
    sweep = load_sweep(_sweep_file(tmp_path))
    assert len(cells(sweep)) == 6
    rows = sweep_run.run_sweep(sweep, tmp_path / "out", workers=1)
    bad = [r for r in rows if r["gpu_type"] == "no-such-gpu"]
    assert len(bad) == 2 and all(r["status"] == "bad input" and "no-such-gpu" in r["reason"] for r in bad)
    good = [r for r in rows if r["gpu_type"] != "no-such-gpu"]
    assert all(r["status"] == "optimal" and r["days"] > 0 and r["cost"] > 0 for r in good)
    # days follow from the predicted throughput: token budget / tokens per second
    assert all(r["days"] == pytest.approx(1.0e9 / r["tokens_per_s"] / 86400) for r in good)
    written = sweep_run.write_tables(sweep, rows, tmp_path / "out")
    assert set(written) == {"table.csv", "table.json", "pareto.png", "index.html"}
    table = json.loads((tmp_path / "out" / "table.json").read_text())
    assert {c["cell"] for c in table["cells"]} == set(range(6)) and table["pareto"]
    assert len(list((tmp_path / "out" / "plans").glob("*.json"))) == 4


def test_a_resumed_sweep_recomputes_nothing(tmp_path, monkeypatch):
    sweep = load_sweep(_sweep_file(tmp_path))
    first = sweep_run.run_sweep(sweep, tmp_path / "out", workers=1)

    def refuse(*_):
        raise AssertionError("a cached cell was planned again")
    monkeypatch.setattr(sweep_run, "run_cell", refuse)
    assert _table(sweep_run.run_sweep(sweep, tmp_path / "out", workers=1)) == _table(first)


def test_a_model_change_plans_the_cells_again(tmp_path, monkeypatch):
    """The cache is keyed by the model too (cells.model_fingerprint: the formulation package's code and data), so
    a sweep resumed after a refit or a cost-model change does not reuse cells priced by the old model."""
    sweep = load_sweep(_sweep_file(tmp_path))
    sweep_run.run_sweep(sweep, tmp_path / "out", workers=1)
    planned = []
    real_run_cell = sweep_run.run_cell
    monkeypatch.setattr(sweep_run, "run_cell", lambda *a: planned.append(1) or real_run_cell(*a))
    monkeypatch.setattr(sweep_cells, "model_fingerprint", lambda: "another model")
    sweep_run.run_sweep(sweep, tmp_path / "out", workers=1)
    assert planned and len(planned) == len(cells(sweep))


def test_the_process_pool_gives_the_same_table_as_one_process(tmp_path):
    sweep = load_sweep(_sweep_file(tmp_path))
    serial = sweep_run.run_sweep(sweep, tmp_path / "serial", workers=1)
    pooled = sweep_run.run_sweep(sweep, tmp_path / "pooled", workers=2)
    assert _table(pooled) == _table(serial)


def test_ray_gives_the_same_table_as_the_local_pool(tmp_path):
    ray = pytest.importorskip("ray")
    sweep = load_sweep(_sweep_file(tmp_path))
    local = sweep_run.run_sweep(sweep, tmp_path / "local", workers=1)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        remote = sweep_run.run_sweep(sweep, tmp_path / "ray", engine="ray")
    finally:
        ray.shutdown()
    assert _table(remote) == _table(local)


def test_pareto_front_keeps_only_undominated_cells():
    rows = [{"cell": 0, "days": 1.0, "cost": 9.0}, {"cell": 1, "days": 2.0, "cost": 5.0},
            {"cell": 2, "days": 2.5, "cost": 6.0}, {"cell": 3, "days": 3.0, "cost": 5.0},
            {"cell": 4, "days": None, "cost": None}]
    assert [r["cell"] for r in pareto_front(rows)] == [0, 1, 3]


def test_a_bad_sweep_file_is_one_line_and_exit_2(tmp_path, capsys):
    path = _sweep_file(tmp_path, axes={"nodes": []})
    assert sweep_run.main([str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "axes.nodes" in err and "non-empty list" in err and err.count("\n") == 1


def test_a_base_in_the_compact_nodes_form_is_swept(tmp_path):
    """cluster.nodes as one {"count", "prefix", ...} object (no list, docs/instance-format.md): the gpu_type and
    nodes axes rewrote it as a list and crashed (TypeError, KeyError)."""
    from formulation import instance_from_dict
    base = json.loads((REPO / "instances" / "small_2x4.json").read_text())
    first = base["cluster"]["nodes"][0]
    base["cluster"]["nodes"] = {"count": 2, "prefix": "n", "gpu_type": first["gpu_type"], "gpus": first["gpus"]}
    base["cluster"]["network"].pop("node_matrix_gb_per_s")  # names the base's two nodes
    (tmp_path / "compact.json").write_text(json.dumps(base))
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump({"base": "compact.json",
                                                         "axes": {"gpu_type": ["h100-sxm-80gb", "h200-sxm-141gb"],
                                                                  "nodes": [1, 2]}}))
    built = cells(load_sweep(tmp_path / "sweep.yaml"))
    assert len(built) == 4
    sizes = sorted(instance_from_dict(c.document, "<cell>", tmp_path).cluster.num_gpus for c in built)
    assert sizes == [4, 4, 8, 8]  # 1 or 2 nodes of 4 GPUs
