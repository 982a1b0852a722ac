"""(E4a) Grouped-GEMM efficiency against the expert GEMMs' shape: the packaged curve against the published kernel
measurements it was taken from (formulation/data/grouped_gemm.json), and its effect on MoE layers."""

import math
import statistics

import pytest
from conftest import build_instance, small_instance_dict

from formulation.evaluate import evaluate
from formulation.physics import cost, grouped_gemm
from formulation.placement import default_placement


def _points():
    data = grouped_gemm.kernel_data()
    return data, [(p, data["sources"][p["source"]]) for p in data["points"]]


def _log_errors(kappa_out: float, kappa_red: float, sources=None):
    """log(predicted / published) of every point (of `sources`, default all), each source's asymptotic rate e_inf
    at its best (the geometric mean that centres its residuals): only the shape dependence is compared."""
    data, points = _points()
    raw = {}
    for p, s in points:
        if sources is not None and p["source"] not in sources:
            continue
        # the ridge in elements: FP8 (1 byte) at its 1979 TFLOP/s peak has the bf16 ridge (2 bytes at 989)
        ridge = s["peak_tflops"] * s["bytes_per_element"] / 2
        c_out, c_red = (grouped_gemm.ridge_constant(k, ridge, s["hbm_gb_per_s"]) for k in (kappa_out, kappa_red))
        factor = grouped_gemm.forward_time_factor(c_out, c_red, p["m"], p["n"], p["k"])
        raw.setdefault(p["source"], []).append(-math.log(factor) - math.log(p["tflops"]))
    errors = []
    for values in raw.values():
        centre = statistics.fmean(values)
        errors += [v - centre for v in values]
    return errors


def _fit(sources=None) -> tuple[float, float]:
    """Least squares of the log errors over (kappa_out, kappa_red): Gauss-Seidel golden-section searches."""
    loss = lambda a, b: sum(e * e for e in _log_errors(a, b, sources))  # noqa: E731
    kappa = [1.0, 1.0]
    for _ in range(6):
        for i in (0, 1):
            lo, hi = 0.01, 5.0
            for _ in range(50):
                a, b = lo + 0.382 * (hi - lo), lo + 0.618 * (hi - lo)
                la = loss(*(kappa[:i] + [a] + kappa[i + 1:]))
                lb = loss(*(kappa[:i] + [b] + kappa[i + 1:]))
                lo, hi = (lo, b) if la < lb else (a, hi)
            kappa[i] = (lo + hi) / 2
    return kappa[0], kappa[1]


def _stored():
    data = grouped_gemm.kernel_data()
    return data["kappa_out"], data["kappa_red"]


def test_every_point_names_a_source_with_a_url():
    data, points = _points()
    assert len(points) >= 18 and {p["source"] for p, _ in points} == set(data["sources"])
    for source in data["sources"].values():
        assert source["url"].startswith("https://github.com/")


def test_the_stored_kappas_are_the_fit_of_the_published_points():
    data = grouped_gemm.kernel_data()
    assert _fit() == pytest.approx(_stored(), abs=0.01)
    assert data["kappa_step"] == pytest.approx((2 * data["kappa_out"] + data["kappa_red"]) / 3, abs=0.001)


def test_leave_one_source_out():
    """Fitted on DeepGEMM's points alone (pytorch/ao's held out), the two constants are the stored ones within 0.01,
    and they give pytorch/ao's two bf16 grouped GEMMs (512 rows per expert; 8192 x 5120 against 5120 x 8192) the
    published order: the one reducing over 5120 is slower, 1.7% by the curve, 4.0% measured. (pytorch/ao's two
    points alone cannot fix two constants and a level.)"""
    held_in = _fit({"deepgemm"})
    assert held_in == pytest.approx(_stored(), abs=0.01)
    c_out, c_red = (grouped_gemm.ridge_constant(k, 989, 3350) for k in held_in)
    ratio = (grouped_gemm.forward_time_factor(c_out, c_red, 512, 8192, 5120)
             / grouped_gemm.forward_time_factor(c_out, c_red, 512, 5120, 8192))
    published = 545.4 / 524.5  # time of the first over the second
    assert 1 < ratio < published and ratio == pytest.approx(published, abs=0.03)


def test_the_curve_reproduces_the_published_points():
    """Each published kernel throughput within 25% of the curve (its source's level free), half within 5%."""
    errors = [abs(math.expm1(e)) for e in _log_errors(*_stored())]
    assert max(errors) < 0.25
    assert statistics.median(errors) < 0.05


def test_the_published_orderings_hold():
    """DeepGEMM's masked layout: 256 rows per expert run 24% (N 4096, K 7168) and 12% (N 7168, K 2048) below 1024
    rows; its contiguous layout: K 2048 (an expert's narrow FFN as the reduction) 10% below K 7168. The curve
    gives the same signs and sizes within a factor of 2.5."""
    c_out, c_red = (grouped_gemm.ridge_constant(k, 1979 / 2, 3350) for k in _stored())
    for (small, large, published) in [((256, 4096, 7168), (1024, 4096, 7168), 1233 / 932),
                                      ((256, 7168, 2048), (1024, 7168, 2048), 925 / 815),
                                      ((4096, 7168, 2048), (4096, 4096, 7168), 1346 / 1214)]:
        slowdown = (grouped_gemm.forward_time_factor(c_out, c_red, *small)
                    / grouped_gemm.forward_time_factor(c_out, c_red, *large))
        assert 1 < slowdown and 0.4 < (slowdown - 1) / (published - 1) < 2.5


def test_the_step_factor_is_the_mean_of_forward_and_both_gradients():
    """Forward reduces over k, the input gradient over n, the weight gradient over m (the expert's tokens): the
    three published-form factors average to the symmetric step factor with kappa_step."""
    data = grouped_gemm.kernel_data()
    c_out, c_red, c_step = (grouped_gemm.ridge_constant(data[k], 989, 3350)
                            for k in ("kappa_out", "kappa_red", "kappa_step"))
    m, n, k = 640, 1536, 2048
    passes = [grouped_gemm.forward_time_factor(c_out, c_red, *dims) for dims in ((m, n, k), (m, k, n), (n, k, m))]
    assert statistics.fmean(passes) == pytest.approx(grouped_gemm.shape_time_factor(c_step, m, n, k), rel=1e-3)


def _instance(preset: str):
    data = small_instance_dict(2, 8, global_batch_size=64, seq_length=4096)
    data["model"] = {"preset": preset}
    data["training"].update({"zero_stage": [1], "context_parallel_sizes": [1]})
    return build_instance(data)


def test_fine_experts_slow_down_and_coarse_ones_do_not():
    """Qwen3-30B-A3B's experts (h 2048, f_e 768) at 640 rows each: (1 + c S) over the 4096-cube's, S = 1/m + 1/n
    + 1/k per GEMM, fc1 (640 x 1536 x 2048) and fc2 (640 x 2048 x 768) weighted 2 : 1. Mixtral's (h 4096, f_e
    14336) at 5120 rows: below the reference, kept at 1."""
    h100 = _instance("mixtral-8x7b").cluster.gpu_type_of(0)
    c = grouped_gemm.ridge_constant(grouped_gemm.kernel_data()["kappa_step"], h100.peak_tflops, h100.hbm_gb_per_s)
    fc1 = 1 + c * (1 / 640 + 1 / 1536 + 1 / 2048)
    fc2 = 1 + c * (1 / 640 + 1 / 2048 + 1 / 768)
    expected = (2 * fc1 + fc2) / 3 / (1 + c * 3 / 4096)
    assert grouped_gemm.expert_gemm_slowdown(h100, 640, 2048, 768, 3) == pytest.approx(expected)
    assert 1.40 < expected < 1.55
    assert grouped_gemm.expert_gemm_slowdown(h100, 5120, 4096, 14336, 3) == 1.0


def test_a_fine_grained_moe_estimate_is_slower_with_the_term(monkeypatch):
    """The same placement of Qwen3-30B-A3B (128 experts, top-8) scores slower with the kernel curve than at the
    large GEMM's efficiency; Mixtral-8x7B's does not move."""
    for preset, slower in (("qwen3-30b-a3b", True), ("mixtral-8x7b", False)):
        instance = _instance(preset)
        placement = default_placement(instance, tp=1, pp=2, dp=8, ep=8)
        on = evaluate(instance, placement).iteration_time_s
        monkeypatch.setitem(cost.PHYSICS_TERMS, "grouped_gemm_shape", False)
        off = evaluate(instance, placement).iteration_time_s
        monkeypatch.setitem(cost.PHYSICS_TERMS, "grouped_gemm_shape", True)
        assert on > off * 1.03 if slower else on == off
