"""Pipeline schedules as a decision (docs/schedules.md): which schedule families the planner scores, the name each
framework gives them, their closed-form time (S1)-(S3) from each stage's forward F, input-gradient backward B and
weight-gradient backward W, and the activations each keeps in flight (S4).

A configuration's `schedule` is a family: "1f1b" (1F1B, or Megatron's interleaved 1F1B with vpp > 1, as before)
or "zero_bubble" (ZB-H1 with vpp = 1, torch's InterleavedZeroBubble with vpp > 1: the backward split into B and
W, W deferred into the bubble), or one of torchtitan's V-shaped schedules with two chunks per rank (vpp = 2, rank r
holding virtual stages r and 2 pp - 1 - r): "zbv" (ZBVZeroBubble) and "dualpipev" (DualPipeV), whose time (S3) is
the maximum of a few linear forms of F, B, W (formulation/physics/v_schedules.py).
"""

from __future__ import annotations

import math

from formulation.physics import cost, moe_cost, schedule_orders, v_schedules

FAMILIES = ("1f1b", "zero_bubble") + v_schedules.V_FAMILIES
# the schedule names torch.distributed.pipelining (torchtitan's parallelism.pipeline_parallel_schedule) uses,
# by (family, interleaved); ZB-H1 (one chunk per rank) has no torchtitan name: torchtitan runs its multi-stage
# schedules with at least two stages per rank
NAMES = {("1f1b", False): "1F1B", ("1f1b", True): "Interleaved1F1B",
         ("zero_bubble", False): "ZBH1", ("zero_bubble", True): "InterleavedZeroBubble",
         ("zbv", True): "ZBVZeroBubble", ("dualpipev", True): "DualPipeV"}
def schedule_name(family: str, vpp: int) -> str:
    """torch's name of the family at this vpp (a V family's name whatever vpp: check_placement refuses vpp != 2)."""
    return NAMES.get((family, vpp > 1)) or NAMES.get((family, True), family)


def allowed_families(names, vpp: int) -> list[str]:
    """The families whose schedule at this vpp is among `names` (training.pipeline_schedules); the V-shaped ones
    at vpp = 2 only (two chunks per rank)."""
    return [f for f in FAMILIES if (f, vpp > 1) in NAMES and NAMES[(f, vpp > 1)] in names
            and (f not in v_schedules.V_FAMILIES or vpp == 2)]


def bubble_share(family: str, forward: float, backward_input: float, weight: float, vpp: int) -> float:
    """(S2) What a stage adds to the bubble of the pipeline, per stage it is not the slowest: 1F1B its whole
    micro-batch F + B + W; zero bubble max(F, B, F + B - W) (Qi et al. 2024: W fills the rest), which is
    F + B - W whenever W <= min(F, B), as it always is here (W is the weight-gradient GEMMs, a part of both the
    forward's and the backward's time); interleaved: 1 / vpp of it."""
    if family == "1f1b":
        return (forward + backward_input + weight) / vpp
    return max(forward, backward_input, forward + backward_input - weight) / vpp


def pipeline_time(family: str, times, forward, backward_input, weight, num_micro_batches: int,
                  vpp: int) -> tuple[float, int]:
    """(S1) The schedule without sends: max over stages k of m t_k + sum_{j != k} bubble_share_j, t_k = F + B + W
    the stage's time per micro-batch (`times`). For 1F1B this is (C9), m max t + (sum t - max t) / vpp
    (cost.pipeline_time, the same floats); returns the time and the critical stage k."""
    if family == "1f1b":
        return cost.pipeline_time(list(times), num_micro_batches, vpp)
    if family in v_schedules.V_FAMILIES:
        return v_schedules.pipeline_time(family, times, forward, weight, num_micro_batches)
    shares = [bubble_share(family, f, b, w, vpp) for f, b, w in zip(forward, backward_input, weight)]
    bubble = sum(shares)
    totals = [num_micro_batches * t + bubble - s for t, s in zip(times, shares)]
    k = max(range(len(totals)), key=lambda i: (totals[i], -i))
    return totals[k], k


def in_flight_chunks(family: str, stage: int, pp: int, vpp: int, m: int) -> int:
    """(S4) Model chunks whose activations a rank holds at its peak: the most forwards it has run whose weight
    gradient (the end of their backward) has not, along its op order. 1F1B: min(pp - i, m); interleaved:
    min(2 (pp - i - 1) + (vpp - 1) pp + 1, m vpp), as (M5). Zero bubble counts a micro-batch until its W has
    run (W needs the layers' inputs and output gradients, most of what the forward kept): an upper bound."""
    if family == "1f1b":
        if vpp == 1:
            return min(pp - stage, m)
        return min((pp - stage - 1) * 2 + (vpp - 1) * pp + 1, m * vpp)
    if family in v_schedules.V_FAMILIES:
        return v_schedules.in_flight_chunks(family, stage, pp, m)
    return schedule_orders.peak_held(schedule_orders.looped(stage, pp, m, vpp, zero_bubble=True))


def in_flight_layer_microbatches(stage: int, pp: int, vpp: int, num_micro_batches: int, layers: int,
                                 schedule: str = "1f1b", extra: int = 0) -> float:
    """(M5) Layer activations held at the peak, in units of one layer for one micro-batch.

    1F1B: stage i holds min(pp - i, m) micro-batches of its layers. Interleaved (vpp = v): Megatron-LM warms
    up (pp - i - 1) * 2 + (v - 1) * pp chunks and keeps one more in flight, each chunk layers / v layers;
    `extra` more warm-up steps (micro-batches, or chunks with vpp) under the MoE all-to-all overlap (EM5), which
    runs on Megatron's 1F1B family only. Zero-bubble schedules: (S4) of docs/schedules.md, chunks held until their
    weight gradient has run.
    """
    if schedule != "1f1b":
        return in_flight_chunks(schedule, stage, pp, vpp, num_micro_batches) * layers / vpp
    if vpp == 1:
        return min(pp - stage + extra, num_micro_batches) * layers
    chunks = min((pp - stage - 1) * 2 + (vpp - 1) * pp + 1 + extra, num_micro_batches * vpp)
    return chunks * layers / vpp


def in_flight_micro_batches(stage: int, pp: int, vpp: int, num_micro_batches: int, schedule: str = "1f1b",
                            extra: int = 0) -> float:
    """Micro-batches whose first-stage extras (embedding output) are alive at the peak."""
    if vpp == 1 and schedule == "1f1b":
        return min(pp - stage + extra, num_micro_batches)
    return math.ceil(in_flight_layer_microbatches(stage, pp, vpp, num_micro_batches, vpp, schedule, extra) / vpp)


def weight_grad_ceiling(instance, p) -> float:
    """(C15) At least the weight-gradient time of all stages together, W_total = sum_j W_j: every layer at the
    largest GEMM forward of any GPU type and layer kind, plus the largest output layer's."""
    model, job = instance.model, instance.training
    kinds = (None,) if model.moe is None else ("dense", "moe")
    types = list(instance.cluster.gpu_types.values())
    layer = max(moe_cost.layer_compute(model, job, p, g, kind).matmul_fwd for g in types for kind in kinds)
    return model.num_layers * layer + max(cost.output_layer_forward(model, job, p, g) for g in types)
