"""(C2) The attention core against published kernel figures: H100's causal attention efficiency from
FlashAttention-2's forward and backward, context parallelism's ring steps as non-causal calls
(`noncausal_ring_steps`, docs/physics.md), checked against NeMo's long-sequence runs, and calls shorter than 2k
tokens below the catalog figure (`short_attention_calls`)."""

from __future__ import annotations

import dataclasses
import statistics
from types import SimpleNamespace

import pytest

from conftest import build_instance, small_instance_dict
from formulation import evaluate
from formulation.physics import cost
from solvers.validation.runs import load_runs


@pytest.fixture(scope="module")
def runs():
    return {r.row: r for r in load_runs()}


def predicted(run) -> float:
    return evaluate(run.instance, run.placement, check=False).iteration_time_s


def test_h100_attention_efficiency_is_fa2_forward_and_backward():
    """(C2) H100's causal attention efficiency from FlashAttention-2's kernel throughput on H100 SXM5 at head dim
    128 (FlashAttention-3's paper): causal forward 298 / 319 TFLOP/s at 2k / 4k tokens, backward 291 / 310. FA2
    counts the backward as 2.5 forward passes and the model as 2, so the model's rate is 3 / (1/fwd + 2.5/bwd):
    0.254 and 0.271 of the 989 TFLOP/s peak, and the catalog's 0.26 lies between (0.29 had taken the 16k forward
    figure alone)."""
    h100 = build_instance(small_instance_dict()).cluster.gpu_types["h100-sxm-80gb"]
    low, high = (3 / (1 / fwd + 2.5 / bwd) / h100.peak_tflops for fwd, bwd in ((298, 291), (319, 310)))
    assert low < h100.attention_efficiency < high


@pytest.mark.parametrize("cp", [1, 2, 8])
def test_noncausal_ring_steps_run_at_the_noncausal_rate(cp):
    """(C2) With context parallelism a rank's local causal call is 1/cp of its attention work and the ring steps
    against the other ranks' chunks are non-causal calls, 1.10 times faster (FA2 370 against 335 and cuDNN 595
    against 539 TFLOP/s at 16k tokens on H100). Term off: the causal rate throughout; cp = 1: unchanged. At 16k
    tokens every call is 2k tokens or longer, so `short_attention_calls` leaves them alone."""
    instance = build_instance(small_instance_dict(seq_length=16384))
    gpu = instance.cluster.gpu_types["h100-sxm-80gb"]
    p = SimpleNamespace(cp=cp, tp=1, micro_batch_size=1)
    on = cost.attention_time(1e12, instance.training, p, gpu)
    cost.PHYSICS_TERMS["noncausal_ring_steps"] = False
    try:
        off = cost.attention_time(1e12, instance.training, p, gpu)
    finally:
        cost.PHYSICS_TERMS["noncausal_ring_steps"] = True
    assert off == pytest.approx(1e12 / (gpu.peak_tflops * 1e12 * gpu.attention_efficiency), rel=1e-12)
    assert on == pytest.approx(off * (1 / cp + (1 - 1 / cp) / 1.10), rel=1e-12)


def test_noncausal_ring_steps_level_the_long_sequence_rows(runs):
    """NeMo's long-sequence table of LLAMA2-7B on H100 (rows 88-96): the runs with context parallelism and those
    without sit within 5 points of each other (median error) with the term; without it the runs with cp came out
    11.8 points slower than those without. The B200 table (rows 97-104) no longer levels since B200 has a fit of
    its own (Megatron-Bridge's rows): its cp runs are predicted about 15 points faster than its cp = 1 runs, which
    the term widens; whether that page counts attention as causal (Megatron-Bridge's does) is open
    (docs/validation.md, Blackwell and AMD)."""
    def gap(rows) -> float:
        errors = {k: predicted(runs[k]) / runs[k].measured_iter_s - 1 for k in rows}
        with_cp = [e for k, e in errors.items() if runs[k].placement.cp > 1]
        without = [e for k, e in errors.items() if runs[k].placement.cp == 1]
        return statistics.median(with_cp) - statistics.median(without)

    assert abs(gap(range(88, 97))) < 0.05
    cost.PHYSICS_TERMS["noncausal_ring_steps"] = False
    try:
        assert gap(range(88, 97)) > 0.10
    finally:
        cost.PHYSICS_TERMS["noncausal_ring_steps"] = True


@pytest.mark.parametrize("tokens, fwd, bwd", [(512, 191, 214), (1024, 260, 260)])
def test_short_calls_follow_fa2_throughput_by_length(tokens, fwd, bwd):
    """(C2) `short_attention_calls`: FA2's causal forward and backward on H100 SXM5 at head dim 128 (FlashAttention-3's
    paper; batch x tokens fixed at 16k, so the same work per point) run at 191 / 260 TFLOP/s forward and 214 / 260
    backward at 512 / 1k tokens against 298 and 291 at 2k. In the model's count (3 / (1/fwd + 2.5/bwd)) that is
    0.706 and 0.888 of the 2k rate; the factor reproduces both within 0.01."""
    rate = lambda f, b: 3 / (1 / f + 2.5 / b)  # noqa: E731
    assert cost.short_call_factor(tokens) == pytest.approx(rate(fwd, bwd) / rate(298, 291), abs=0.01)


def test_short_calls_scale_attention_only_below_2k_tokens_per_call():
    """A flash call of seq / cp tokens: at 4k tokens and cp 2 (2k per call) the catalog figure holds; at cp 4 (1k
    per call) the attention core takes 1 / short_call_factor(1024) as long; the term off, or unfused attention
    (no flash kernel to ramp up), restores the catalog rate."""
    instance = build_instance(small_instance_dict(seq_length=4096))
    gpu = instance.cluster.gpu_types["h100-sxm-80gb"]
    job = instance.training

    def time(cp: int, training=job) -> float:
        return cost.attention_time(1e12, training, SimpleNamespace(cp=cp, tp=1, micro_batch_size=1), gpu)

    cost.PHYSICS_TERMS["short_attention_calls"] = False
    try:
        off = {cp: time(cp) for cp in (2, 4)}
    finally:
        cost.PHYSICS_TERMS["short_attention_calls"] = True
    assert time(2) == off[2]
    assert time(4) == pytest.approx(off[4] / cost.short_call_factor(1024), rel=1e-12)
    assert cost.short_call_factor(1024) < 0.9 and cost.short_call_factor(2048) == cost.short_call_factor(1e6) == 1.0
    unfused = dataclasses.replace(job, flash_attention=False)
    assert time(4, unfused) == pytest.approx(1e12 / (gpu.peak_tflops * 1e12 * gpu.attention_efficiency), rel=1e-12)
