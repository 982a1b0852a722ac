"""GPU types: hardware facts from the catalog (`formulation/data/gpu_types.json`), achieved-efficiency
parameters from the calibration (`calibration.json`, per chip and software stack), and instance overrides."""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from pathlib import Path

from formulation.inputs.mxfp8 import MXFP8_PRESETS
from formulation.data import DATA_DIR
from formulation.errors import Section
from formulation.physics.cost import term

CATALOG_PATH = DATA_DIR / "gpu_types.json"
CALIBRATION_PATH = DATA_DIR / "calibration.json"


@dataclass(frozen=True)
class GpuType:
    """Hardware facts and achieved-efficiency parameters of one GPU type (see docs/model.md (C1)-(C3))."""

    name: str
    memory_gib: float
    peak_tflops: float  # dense, at the training precision (bf16/fp16)
    hbm_gb_per_s: float
    matmul_efficiency: float  # achieved fraction of peak for large GEMMs
    efficiency_half_gflop: float  # per-GPU forward GFLOP of one layer at which the GEMM efficiency halves
    attention_efficiency: float  # achieved fraction of peak of the attention core (flash attention)
    runtime_overhead_gib: float  # CUDA context, NCCL buffers, framework workspace
    fragmentation_fraction: float  # allocator fragmentation, fraction of the allocated bytes
    iteration_overhead_s: float  # fixed per-iteration cost (data loading, logging, launch)
    price_per_hour: float = 0.0
    peak_fp8_tflops: float = 0.0  # dense FP8 peak (data sheet); 0: the GPU has no FP8 tensor cores
    fp8_matmul_efficiency: float = 1.0  # FP8 GEMM efficiency relative to the bf16 curve (docs/physics.md)
    mxfp8: bool = False  # tensor cores with the MX formats (Blackwell): training.fp8_recipe mxfp8 runs here

    def matmul_time(self, flops: float, layer_gflop: float, fp8: bool = False) -> float:
        """(C1) t = F / (peak * e_max * W / (W + W_half)), W = per-GPU forward GFLOP of one layer; FP8 GEMMs run
        against the FP8 peak at `fp8_matmul_efficiency` times that curve (GPUs without FP8 run them in bf16).

        The curve is t = (W + W_half) / (peak e_max): a layer's GEMMs pay a fixed time W_half / (peak e_max)
        (launch, tile ramp-up, the last partial wave) on top of their work. That time does not shrink with the FP8
        peak, so FP8 GEMMs take W_half x peak_fp8 / peak (`fp8_small_gemms`, docs/physics.md): small FP8 GEMMs
        gain less."""
        fp8 = fp8 and self.peak_fp8_tflops > 0
        half = self.efficiency_half_gflop
        if fp8 and term("fp8_small_gemms"):
            half *= self.peak_fp8_tflops / self.peak_tflops
        efficiency = self.matmul_efficiency * layer_gflop / (layer_gflop + half)
        if fp8:
            return flops / (self.peak_fp8_tflops * 1e12 * efficiency * self.fp8_matmul_efficiency)
        return flops / (self.peak_tflops * 1e12 * efficiency)


_GPU_FIELDS = ("memory_gib", "peak_tflops", "hbm_gb_per_s", "matmul_efficiency", "efficiency_half_gflop",
               "attention_efficiency", "runtime_overhead_gib", "fragmentation_fraction", "iteration_overhead_s",
               "price_per_hour", "peak_fp8_tflops", "fp8_matmul_efficiency")


def _load_json(path: Path) -> dict:
    with path.open() as handle:
        return {k: v for k, v in json.load(handle).items() if not k.startswith("_")}


def gpu_catalog(software_stack: str = "megatron") -> dict[str, dict]:
    """Catalog facts merged with calibrated parameters: `default`, then the type's Megatron-LM fit, then a
    stack-specific fit (`name+torchtitan`, `name+megatron-deepspeed`) where one exists."""
    catalog = _load_json(CATALOG_PATH)
    calibration = _load_json(CALIBRATION_PATH)
    default = {k: v for k, v in calibration.get("default", {}).items() if k in _GPU_FIELDS}
    merged = {}
    for name, facts in catalog.items():
        fitted = {k: v for k, v in calibration.get(name, {}).items() if k in _GPU_FIELDS}
        stack = {k: v for k, v in calibration.get(f"{name}+{software_stack}", {}).items() if k in _GPU_FIELDS}
        merged[name] = {**default, **facts, **fitted, **stack}
    merged["__default__"] = default
    return merged


def calibration_basis(name: str, software_stack: str = "megatron") -> str | None:
    """What a catalog type's GEMM efficiency was fitted on (calibration.json's `fitted_on`: the stack's own fit, else
    the type's Megatron-LM fit, as gpu_catalog merges them); None for a type with no fit, which runs at the
    uncalibrated `default` (MI300X, MI325X, MI355X: no published run of theirs is fitted)."""
    calibration = _load_json(CALIBRATION_PATH)
    fit = calibration.get(f"{name}+{software_stack}") or calibration.get(name) or {}
    return fit.get("fitted_on")


def gpu_type_from_dict(name: str, data: dict, file: str, path: str, software_stack: str = "megatron") -> GpuType:
    """A GPU type: `{"preset": catalog-name}` and/or explicit fields; catalog and calibration fill the rest."""
    sec = Section(data, file, path)
    catalog = gpu_catalog(software_stack)
    preset = sec.string("preset", default=name if name in catalog else None)
    if preset is not None and preset not in catalog:
        raise sec.error("preset", f"unknown GPU preset {preset!r}; expected one of "
                                  f"{', '.join(k for k in sorted(catalog) if not k.startswith('__'))}")
    base = dict(catalog["__default__"])
    if preset is not None:
        base.update(catalog[preset])
    values = {}
    for key in _GPU_FIELDS:
        positive = key not in ("fragmentation_fraction", "iteration_overhead_s", "runtime_overhead_gib", "price_per_hour",
                               "peak_fp8_tflops")
        maximum = 1.0 if key in ("matmul_efficiency", "attention_efficiency", "fragmentation_fraction",
                                 "fp8_matmul_efficiency") else None
        if key in base or sec.has(key):
            values[key] = sec.number(key, default=base.get(key), positive=positive, minimum=0.0, maximum=maximum)
        else:
            names = sorted(k for k in catalog if not k.startswith("__"))
            closest = ([n for n in names if name.lower() in n]
                       or difflib.get_close_matches(name.lower(), names, n=1, cutoff=0.5))
            hint = f" (closest: {', '.join(closest)})" if closest else ""
            raise sec.error(key, f"required field is missing: {name!r} is not a catalog GPU type{hint}; give "
                                 f"`preset` (one of {', '.join(names)}) or every field")
    values["mxfp8"] = sec.boolean("mxfp8", default=preset in MXFP8_PRESETS)
    sec.done()
    return GpuType(name=name, **values)
