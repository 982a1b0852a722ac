"""The schedule terms against published runs (docs/schedules.md, "Against published runs"): every run scored as
1F1B without the MoE all-to-all overlap (`solve validate --as-1f1b`, the figures before the terms), and the paired
speed-ups: runs of one source that differ only in their pipeline schedule (zero bubble, interleaving) or in the
all-to-all overlap, the measured ratio of their times against the predicted one.

The ratio is what the schedule term claims on its own: whatever else the model gets wrong about a configuration
(the GEMM efficiency, the overhead, the links) is common to both runs of a pair and cancels.
"""

from __future__ import annotations

import dataclasses
import statistics

from solvers.validation.runs import Run

BASELINE = {"schedule": "1f1b", "moe_a2a_overlap": False}
# each schedule term a run may have, and the placement fields that turn it off
TERMS = {"zero_bubble": {"schedule": "1f1b"}, "interleaved": {"vpp": 1}, "a2a-overlap": {"moe_a2a_overlap": False}}


def as_1f1b(runs: list[Run]) -> list[Run]:
    """The runs with every placement's schedule terms off: 1F1B (interleaved at the run's vpp) and the all-to-all
    exposed. The run as measured is unchanged; only what the model is told it ran."""
    return [run if run.placement is None else dataclasses.replace(
        run, placement=dataclasses.replace(run.placement, **BASELINE)) for run in runs]


def terms_of(placement) -> list[str]:
    """The schedule terms a placement runs beyond plain 1F1B with the all-to-all exposed."""
    return [name for name, off in TERMS.items()
            if any(getattr(placement, field) != value for field, value in off.items())]


def _key(p, placement) -> tuple:
    run = p.run
    job = run.instance.training
    return (p.family, run.name, run.gpu_type, job.seq_length, job.global_batch_size, run.flags,
            placement.config_key())


def paired_speedups(predictions: list) -> list[dict]:
    """Per run and schedule term it runs, where its source has the same run without that term alone (same model,
    job, configuration and unmodelled features): the measured speed-up (time without / time with) against the
    predicted one, and the predicted one's error."""
    timed = [p for p in predictions if p.timed]
    index: dict[tuple, list] = {}
    for p in timed:
        index.setdefault(_key(p, p.run.placement), []).append(p)
    out = []
    for p in timed:
        for term in terms_of(p.run.placement):
            base_placement = dataclasses.replace(p.run.placement, **TERMS[term])
            for base in index.get(_key(p, base_placement), []):
                measured = base.run.measured_iter_s / p.run.measured_iter_s
                predicted = base.iteration_time_s / p.iteration_time_s
                out.append({"family": p.family, "model": p.run.name,
                            "variant": f"interleaved vpp {p.run.placement.vpp}" if term == "interleaved" else term,
                            "baseline_row": base.run.row, "row": p.run.row, "measured_speedup": measured,
                            "predicted_speedup": predicted, "error": predicted / measured - 1})
    return out


def speedup_summary(pairs: list[dict]) -> dict:
    """Per source and variant: pairs, median measured and predicted speed-up, median and largest |error|."""
    groups: dict[tuple, list[dict]] = {}
    for pair in pairs:
        groups.setdefault((pair["family"], pair["variant"]), []).append(pair)
    return {f"{family}: {variant}": {
        "pairs": len(items), "median_measured": statistics.median(x["measured_speedup"] for x in items),
        "median_predicted": statistics.median(x["predicted_speedup"] for x in items),
        "median_signed_error": statistics.median(x["error"] for x in items),
        "median_abs_error": statistics.median(abs(x["error"]) for x in items),
        "largest_abs_error": max(abs(x["error"]) for x in items)} for (family, variant), items in sorted(groups.items())}
