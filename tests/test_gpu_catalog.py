"""The GPU catalog against its sources (formulation/data/gpu_sources.json): every hardware figure of every type has a
source with the same value, the vendor relations between figures hold, and types without calibrated runs are
marked as such and keep the catalog's uncalibrated default."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import REPO
from formulation import instance_from_dict, load_instance
from formulation.data import DATA_DIR
from formulation.inputs.gpus import calibration_basis, gpu_catalog, gpu_type_from_dict
from solvers.search.baseline import best_default
from solvers.validation.calibrate import CHIPS

HARDWARE = ("memory_gib", "peak_tflops", "peak_fp8_tflops", "hbm_gb_per_s")
CATALOG = {k: v for k, v in json.loads((DATA_DIR / "gpu_types.json").read_text()).items() if not k.startswith("_")}
SOURCES = json.loads((DATA_DIR / "gpu_sources.json").read_text())
CALIBRATION = json.loads((DATA_DIR / "calibration.json").read_text())
NEW_TYPES = ("b300", "gb200", "gb300", "h20-96gb", "h200-nvl-141gb", "mi300x", "mi325x", "mi355x")
UNFITTED = ("mi300x", "mi325x", "mi355x")
SAMPLES = sorted((REPO / "instances" / "samples" / "catalog").glob("*.json"))


@pytest.mark.parametrize("name", sorted(CATALOG))
def test_every_hardware_figure_has_a_source_with_the_same_value(name):
    sourced = SOURCES["types"][name]
    for field in HARDWARE:
        if field not in CATALOG[name]:
            assert field not in sourced, f"{name}.{field}: a source for a figure the catalog lacks"
            continue
        entry = sourced[field]
        assert entry["value"] == CATALOG[name][field], f"{name}.{field}: catalog {CATALOG[name][field]}, source {entry}"
        assert entry["unit"] and entry["quote"], f"{name}.{field}: no unit or quote"
        doc = SOURCES["documents"][entry["doc"]]
        assert doc["url"] and doc["title"], f"{name}.{field}: document {entry['doc']} lacks url or title"


def test_every_sourced_type_is_in_the_catalog_and_has_its_scale_up_bandwidth():
    assert set(SOURCES["types"]) == set(CATALOG)
    for name, fields in SOURCES["types"].items():
        assert fields["scale_up_gb_per_s"]["unit"] == "GB/s per direction", name
    for conflict in SOURCES["conflicts"]:
        assert set(conflict["types"]) <= set(CATALOG) and conflict["field"] in HARDWARE, conflict
    assert set(NEW_TYPES) <= set(CATALOG)


@pytest.mark.parametrize("name", sorted(n for n in CATALOG if "peak_fp8_tflops" in CATALOG[n]))
def test_fp8_is_twice_the_dense_16_bit_peak(name):
    """Every FP8-capable part of the catalog (NVIDIA Hopper and Blackwell, AMD CDNA 3 and 4) prints FP8 at twice the
    BF16 tensor rate, dense and sparse alike; a half-sparse or FP16-vector figure typed in would break it."""
    entry = CATALOG[name]
    assert entry["peak_fp8_tflops"] == pytest.approx(2 * entry["peak_tflops"], rel=1e-3)


def test_sparse_figures_were_halved():
    """Where the quoted figure is NVIDIA's asterisked (2:4 sparse) one, the catalog holds half of it per GPU."""
    per_gpu = {"b200": 8, "b300": 8, "gb200": 72, "gb300": 72}  # HGX boards of 8, NVL72 racks
    for name, gpus in per_gpu.items():
        quote = SOURCES["types"][name]["peak_tflops"]["quote"]
        printed_pflops = float(quote.split("PFLOPS")[0].split()[-1])
        assert CATALOG[name]["peak_tflops"] == pytest.approx(printed_pflops * 1000 / gpus / 2)
    assert CATALOG["h200-nvl-141gb"]["peak_tflops"] == 1671 / 2  # "BF16 Tensor Core 1,671 TFLOPS*"


def test_the_same_die_at_another_power_limit():
    """GB200 is the B200 die (two reticle dies, NVLink 5) in a Grace superchip at 1,200 W instead of HGX's 1,000 W:
    10/9 the 16-bit and FP8 peaks, the same 8 TB/s, 186 GB instead of 180 GB of HBM3e. GB300 is B300 (Blackwell
    Ultra) at 1,400 W instead of 1,100 W, likewise 10/9. B300 gains dense FP4 and memory over B200, not BF16/FP8.
    H200 NVL is H200 SXM's die and memory at 600 W instead of 700 W. MI325X is MI300X's compute with HBM3E."""
    c = CATALOG
    for grace, hgx in (("gb200", "b200"), ("gb300", "b300")):
        assert c[grace]["peak_tflops"] / c[hgx]["peak_tflops"] == pytest.approx(10 / 9)
        assert c[grace]["peak_fp8_tflops"] / c[hgx]["peak_fp8_tflops"] == pytest.approx(10 / 9)
        assert c[grace]["hbm_gb_per_s"] == c[hgx]["hbm_gb_per_s"]
        assert c[grace]["memory_gib"] > c[hgx]["memory_gib"]
    assert (c["b300"]["peak_tflops"], c["b300"]["peak_fp8_tflops"]) == (c["b200"]["peak_tflops"], c["b200"]["peak_fp8_tflops"])
    assert c["b300"]["memory_gib"] > c["b200"]["memory_gib"]
    nvl, sxm = c["h200-nvl-141gb"], c["h200-sxm-141gb"]
    assert (nvl["memory_gib"], nvl["hbm_gb_per_s"]) == (sxm["memory_gib"], sxm["hbm_gb_per_s"])
    assert nvl["peak_tflops"] / sxm["peak_tflops"] == pytest.approx(1671 / 1979, rel=1e-3)
    for field in ("peak_tflops", "peak_fp8_tflops"):
        assert c["mi325x"][field] == c["mi300x"][field]
    assert c["mi325x"]["memory_gib"] > c["mi300x"]["memory_gib"] and c["mi325x"]["hbm_gb_per_s"] > c["mi300x"]["hbm_gb_per_s"]


def test_memory_is_below_the_nominal_capacity_read_as_gib():
    """The usable totals torch reports sit a little below the vendor's capacity read as GiB (HBM stacks are binary):
    a GB figure converted to GiB (x 0.931) or a physical 192 GB stack count would land outside this band."""
    nominal = {"b200": 180, "b300": 270, "gb200": 186, "gb300": 279, "h20-96gb": 96, "h200-nvl-141gb": 141,
               "mi300x": 192, "mi325x": 256, "mi355x": 288, "h200-sxm-141gb": 141}
    for name, gb in nominal.items():
        assert 0.98 * gb < CATALOG[name]["memory_gib"] < gb, name


@pytest.mark.parametrize("name", sorted(CATALOG))
def test_the_gemm_half_point_is_the_catalog_rule(name):
    """efficiency_half_gflop = 0.2 ms x peak x 0.75 (docs/physics.md), new types included."""
    assert CATALOG[name]["efficiency_half_gflop"] == pytest.approx(0.15 * CATALOG[name]["peak_tflops"], abs=0.051)


@pytest.mark.parametrize("name", UNFITTED)
@pytest.mark.parametrize("stack", ["megatron", "torchtitan"])
def test_a_type_without_calibrated_runs_is_marked_and_runs_at_the_default(name, stack):
    assert calibration_basis(name, stack) is None
    gpu = gpu_type_from_dict(name, {"preset": name}, "<test>", "cluster.gpu_types", stack)
    assert gpu.matmul_efficiency == CALIBRATION["default"]["matmul_efficiency"]


@pytest.mark.parametrize("chip, members", [("b200", ("b200", "gb200")), ("gb300", ("gb300", "b300"))])
def test_blackwell_parts_share_their_die_s_fit(chip, members):
    """Blackwell (B200, GB200) and Blackwell Ultra (GB300, B300) are fitted on Megatron-Bridge's and NeMo's
    published runs (docs/validation.md); every form factor of a die carries its fit, the stacks without runs of
    their own its Megatron fit."""
    assert CHIPS[chip] == members
    for name in members:
        assert CALIBRATION[name] == CALIBRATION[chip]
        assert calibration_basis(name, "torchtitan") == calibration_basis(name) == CALIBRATION[chip]["fitted_on"]
        assert CALIBRATION[name]["matmul_efficiency"] != CALIBRATION["default"]["matmul_efficiency"]


@pytest.mark.parametrize("name", ["h20-96gb", "h200-nvl-141gb"])
def test_hopper_parts_share_the_h100_fit_per_stack(name):
    """H20 and H200 NVL are the GH100 die: they join the H100 chip's fit, as H100 PCIe and H200 SXM do, and
    calibration.json holds exactly what `solve calibrate --write` writes for a member of that chip."""
    assert name in CHIPS["h100-sxm-80gb"]
    for suffix in ("", "+torchtitan", "+llm-foundry"):
        assert CALIBRATION[name + suffix] == CALIBRATION["h100-sxm-80gb" + suffix]
    assert "h100-sxm-80gb rows" in calibration_basis(name)
    assert calibration_basis("h100-sxm-80gb", "megatron-deepspeed") == calibration_basis("h100-sxm-80gb")


def test_every_new_preset_loads_through_an_instance_file():
    catalog = gpu_catalog()
    for name in NEW_TYPES:
        gpu = gpu_type_from_dict("x", {"preset": name}, "<test>", "cluster.gpu_types.x")
        assert (gpu.memory_gib, gpu.peak_tflops, gpu.peak_fp8_tflops) == (
            catalog[name]["memory_gib"], catalog[name]["peak_tflops"], catalog[name]["peak_fp8_tflops"])


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.name)
def test_the_catalog_samples_solve_with_the_baseline(path):
    instance = load_instance(path)
    best = best_default(instance).best[0]
    assert best.estimate.fits
    gpu = next(iter(instance.cluster.gpu_types.values()))
    assert best.estimate.peak_memory_gib <= gpu.memory_gib


def _best_time(path: Path, preset: str) -> float:
    data = json.loads(path.read_text())
    (name,) = data["cluster"]["gpu_types"]
    data["cluster"]["gpu_types"][name] = {"preset": preset}
    return best_default(instance_from_dict(data, str(path))).best[0].estimate.iteration_time_s


def test_more_of_every_resource_is_never_slower():
    """MI325X has MI300X's compute with more and faster memory; GB200 has more of everything than B200: the best
    default plan of the same job is no slower on the larger part."""
    mi = REPO / "instances" / "samples" / "catalog" / "mi300x_8.json"
    b = REPO / "instances" / "samples" / "catalog" / "b200_8.json"
    assert _best_time(mi, "mi325x") <= _best_time(mi, "mi300x")
    assert _best_time(b, "gb200") < _best_time(b, "b200")
