"""Warnings (not errors) for the usual unit mistakes; a plausible instance gets none."""

from __future__ import annotations

import pytest

from conftest import REPO, build_instance, run_solve, small_instance_dict, write_instance
from formulation import load_instance


def _with(**changes) -> dict:
    data = small_instance_dict(2, 4)
    for path, value in changes.items():
        *parents, leaf = path.split("__")
        node = data
        for key in parents:
            node = node[key]
        node[leaf] = value
    return data


MISTAKES = {  # what the user typed -> a phrase the warning must contain
    "bits for bytes": (_with(cluster__network__inter_node_gb_per_s=400), "400 Gb/s = 50 GB/s"),
    "swapped levels": (_with(cluster__network__intra_node_gb_per_s=40, cluster__network__inter_node_gb_per_s=48),
                       "swapped"),
    "both directions": (_with(cluster__network__intra_node_gb_per_s=900), "bidirectional"),
    "algorithm bandwidth": (_with(cluster__network__intra_node_gb_per_s=150), "algorithm bandwidth"),
    "GB for GiB": (_with(cluster__gpu_types={"h100-sxm-80gb": {"preset": "h100-sxm-80gb", "memory_gib": 85.9}}),
                   "a GB figure"),
    "sparse TFLOP/s": (_with(cluster__gpu_types={"h100-sxm-80gb": {"preset": "h100-sxm-80gb", "peak_tflops": 1979}}),
                       "sparsity"),
}


@pytest.mark.parametrize("mistake", sorted(MISTAKES))
def test_each_unit_mistake_is_named(mistake):
    data, phrase = MISTAKES[mistake]
    warnings = build_instance(data).warnings
    assert len(warnings) == 1 and phrase in warnings[0], warnings


def test_plausible_instances_get_no_warning():
    assert build_instance(small_instance_dict(2, 4)).warnings == ()
    for path in sorted((REPO / "instances").glob("*.json")):
        assert load_instance(path).warnings == (), path.name


def test_the_cli_prints_warnings_and_still_plans(tmp_path):
    path = write_instance(tmp_path, MISTAKES["bits for bytes"][0])
    out = run_solve("--instance", path, "--quiet", "--method", "baseline")
    assert out.returncode == 0
    assert "warning:" in out.stderr and "inter_node_gb_per_s" in out.stderr


def test_an_unknown_gpu_type_name_lists_the_catalog_and_the_closest(tmp_path):
    data = small_instance_dict(1, 8)
    data["cluster"]["gpu_types"] = {"H100": {}}
    data["cluster"]["nodes"][0]["gpu_type"] = "H100"
    out = run_solve("--instance", write_instance(tmp_path, data), "--quiet")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "closest: h100-pcie-80gb, h100-sxm-80gb" in out.stderr and "a100-sxm-80gb" in out.stderr
