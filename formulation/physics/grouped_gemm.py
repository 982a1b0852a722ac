"""Grouped-GEMM efficiency against the shape of each expert's GEMMs (docs/moe.md (E4a)), from published kernel
measurements (formulation/data/grouped_gemm.json, each point with its source).

A GEMM of m x n x k moves 2 (mn + nk + mk) bytes for 2 mnk FLOPs: per FLOP, 1/m + 1/n + 1/k bytes. Its time is
taken as the work at the kernel's best rate plus that traffic at a share of the chip's bandwidth,
t = F / (P e_inf) x (1 + c_out (1/m + 1/n) + c_red / k) (m, n the output's dimensions, k the reduced one), each c
= kappa x P / HBM (the ridge point in FLOP per byte, the same for bf16 and FP8 on Hopper); the two kappas are
what is taken from the kernel data. A training step runs each matrix forward (reduce k), for the input gradient
(reduce n) and for the weight gradient (reduce m, the expert's tokens): together 3 + (2 c_out + c_red)
(1/m + 1/n + 1/k), so the step's factor is symmetric, c = kappa_step x ridge, and the cost model's forward and
backward (2 x forward) both take it. The calibrated efficiency e_max of (C1) holds at the reference shape
m = n = k = `reference_dim`; an expert's GEMMs are slowed by the ratio of the two (never sped up: coarse
experts keep today's cost).
"""

from __future__ import annotations

import functools
import json

from formulation.data import DATA_DIR

GROUPED_GEMM_PATH = DATA_DIR / "grouped_gemm.json"


@functools.lru_cache(maxsize=1)
def kernel_data() -> dict:
    """The packaged kernel measurements and the fitted kappa."""
    with GROUPED_GEMM_PATH.open() as handle:
        return json.load(handle)


def bytes_per_flop(m: float, n: float, k: float) -> float:
    """1/m + 1/n + 1/k: bytes a GEMM of m x n x k moves per FLOP, in units of the element size / 2."""
    return 1.0 / m + 1.0 / n + 1.0 / k


def shape_time_factor(c: float, m: float, n: float, k: float) -> float:
    """Time of a training step's m x n x k GEMMs (forward and both gradients) over their time at the kernel's
    asymptotic rate: 1 + c (1/m + 1/n + 1/k)."""
    return 1.0 + c * bytes_per_flop(m, n, k)


def forward_time_factor(c_out: float, c_red: float, m: float, n: float, k: float) -> float:
    """One GEMM's time (output m x n, reducing over k) over its time at the asymptotic rate: 1 + c_out (1/m + 1/n)
    + c_red / k: the form of the published kernel points."""
    return 1.0 + c_out * (1.0 / m + 1.0 / n) + c_red / k


def ridge_constant(kappa: float, peak_tflops: float, hbm_gb_per_s: float) -> float:
    """c = kappa x (dense 16-bit peak / HBM bandwidth), in elements."""
    return kappa * peak_tflops * 1e12 / (hbm_gb_per_s * 1e9)


def expert_gemm_slowdown(gpu_type, rows: float, hidden: int, ffn: float, matrices: int) -> float:
    """Time of one expert's GEMMs (rows tokens, hidden h, its FFN width ffn after etp) over their time at the
    calibrated efficiency: FLOP-weighted over fc1 (rows x (matrices - 1) ffn x h: gate and up fused for SwiGLU)
    and fc2 (rows x h x ffn), each 1 + c (1/m + 1/n + 1/k) over the reference shape's, at least 1."""
    data = kernel_data()
    c = ridge_constant(data["kappa_step"], gpu_type.peak_tflops, gpu_type.hbm_gb_per_s)
    ref = shape_time_factor(c, *(3 * (data["reference_dim"],)))
    fc1 = shape_time_factor(c, rows, (matrices - 1) * ffn, hidden)
    fc2 = shape_time_factor(c, rows, hidden, ffn)
    mean = ((matrices - 1) * fc1 + fc2) / matrices
    return max(1.0, mean / ref)
