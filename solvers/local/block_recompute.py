"""A hint beyond the searched space: Megatron-LM's block recompute for a plan that recomputes every layer.

The search's recompute choices are none, selective and full (docs/model.md (C4b) says why block recompute is not
among them yet). When the plan recomputes every layer, the same placement with only the first r layers of each
model chunk recomputed may still fit, and is faster. Memory falls with r (each recomputed layer keeps only its
input) and compute rises with it (each adds its forward to the backward), so the fastest fitting r is the
smallest that fits: found by bisection over r with the evaluator, which scores it like any placement. Reported as
a hint beside the plan, never as the plan: no bound covers it.
"""

from __future__ import annotations

import dataclasses

from formulation.evaluate import evaluate


def block_recompute_hint(instance, placement, estimate) -> dict | None:
    """The fastest fitting `recompute_num_layers` for a full-recompute plan on the megatron stack (dense models),
    as a dict for the plan file and the report; None where it does not apply or gains nothing."""
    if (placement.recompute != "full" or placement.recompute_num_layers or instance.model.moe is not None
            or instance.training.software_stack != "megatron"):
        return None
    whole = max(placement.layers_per_stage) // placement.vpp  # r >= a chunk's layers recomputes all of it

    def scored(r: int):
        return evaluate(instance, dataclasses.replace(placement, recompute_num_layers=r), check=False)

    low, high = 1, whole  # invariant: r = high fits (it is the plan itself); find the smallest r that fits
    if whole <= 1:
        return None
    while low < high:
        middle = (low + high) // 2
        if scored(middle).fits:
            high = middle
        else:
            low = middle + 1
    if high >= whole:
        return None
    found = scored(high)
    if not found.fits or found.iteration_time_s >= estimate.iteration_time_s:
        return None
    return {"recompute_num_layers": high, "iteration_time_s": found.iteration_time_s,
            "peak_memory_gib": found.peak_memory_gib, "speedup": estimate.iteration_time_s / found.iteration_time_s,
            "note": (f"Megatron-LM's block recompute (--recompute-method block --recompute-num-layers {high}: the "
                     f"first {high} of each chunk's layers recompute, the others keep their activations) fits at "
                     f"{found.peak_memory_gib:.1f} GiB peak and takes {found.iteration_time_s:.4f} s per iteration, "
                     f"{100 * (1 - found.iteration_time_s / estimate.iteration_time_s):.1f} % less than the plan; "
                     f"outside the searched space, no bound covers it: add \"recompute_num_layers\": {high} to the "
                     f"placement and check it with --evaluate")}
