"""MXFP8: FP8 training with one scale per block of 32 consecutive elements, as Transformer Engine runs it on
Blackwell (`training.fp8_recipe: mxfp8`, Megatron-LM `--fp8-recipe mxfp8`; docs/physics.md (M6')).

Transformer Engine's MXFP8BlockScaling recipe (Transformer Engine 2.1 and later; Megatron-Core's
TransformerConfig.fp8_recipe "mxfp8 for Blackwell architecture only") quantizes every GEMM operand to E4M3 with an
E8M0 scale (1 byte) per 32 elements along the GEMM's reduction dimension (the OCP Microscaling format). Because the
blocks run along the reduction dimension, an operand used in two GEMMs that reduce over different dimensions is
quantized twice: the weight row-wise for the forward and column-wise for the data gradient, the saved input
column-wise for the weight gradient. So per element:
- a weight's FP8 copies: 1 + 1 byte (as delayed scaling's FP8 weight and its cached transpose) plus 2 / 32 byte
  of scales;
- a saved GEMM input: 1 byte plus 1 / 32 of scales.
The GEMMs run at the FP8 peak of the data sheet (Blackwell prints one dense FP8 figure for FP8 and its MX form).
Delayed scaling's amax history (1,024 floats per tensor) is gone: negligible either way, not modelled.
"""

from __future__ import annotations

from formulation.errors import InputError

BLOCK = 32  # elements per E8M0 scale
SCALE_BYTES_PER_ELEMENT = 1.0 / BLOCK
# Tensor cores with the microscaling formats (MXFP8, MXFP6, MXFP4): NVIDIA Blackwell (compute capability 10.x),
# the catalog's b200, b300, gb200 and gb300. A type of another name says so with `"mxfp8": true`.
MXFP8_PRESETS = frozenset({"b200", "b300", "gb200", "gb300"})
RECIPES = ("delayed", "mxfp8")


def check_mxfp8(training, cluster, file: str) -> None:
    """`training.fp8_recipe: mxfp8` needs the megatron stack and tensor cores with the MX formats on every GPU
    type of the cluster."""
    if training.fp8_recipe != "mxfp8":
        return
    if training.software_stack != "megatron":
        raise InputError(file, "training.fp8_recipe", f"mxfp8 is Transformer Engine's recipe as Megatron-LM runs it; "
                                                      f"the {training.software_stack} stack is not planned with it")
    without = sorted(name for name, gpu in cluster.gpu_types.items() if not gpu.mxfp8)
    if without:
        raise InputError(file, "training.fp8_recipe", f"mxfp8 runs on Blackwell tensor cores ({', '.join(sorted(MXFP8_PRESETS))}"
                                                      f"); GPU type {without[0]!r} has none (set its \"mxfp8\": true if it does)")
