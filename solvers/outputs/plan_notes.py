"""What is said beside a plan's tables, as lines that the terminal prints and report.html lists alike: the input
warnings, the solver's report, the comparison with the Megatron-style default, hints, the runners-up and their
ties, and what the launch files change from the plan."""

from __future__ import annotations

import dataclasses

from formulation import evaluate
from formulation.evaluate import Estimate
from formulation.intervals import intervals_overlap
from solvers.search.islands import UNITS
from solvers.search.objectives import objective_value


def calibration_text(cal) -> str:
    """A user calibration's knobs, as the labels that say it was applied name them."""
    runs = f", fitted on {len(cal.fitted_on)} runs" if cal.fitted_on else ""
    loo = cal.leave_one_out_error
    loo = f", leave-one-out error {100 * loo:.1f} %" if isinstance(loo, (int, float)) and not isinstance(loo, bool) \
        else ""
    return (f"compute x{cal.compute_scale:.3f}, network x{cal.network_scale:.3f}, "
            f"+{cal.iteration_overhead_s:.3f} s per iteration{runs}{loo}")


def input_warnings(instance) -> list[str]:
    """What the instance and the calibration applied to it give cause to doubt (the CLI prints these on stderr
    before planning): likely unit mistakes, and a calibration whose runs disagree."""
    out = list(instance.warnings)
    if instance.calibration is not None:
        from solvers.validation.fewshot import disagreement_warning  # the validation stack only when used
        disagreement = disagreement_warning(instance.calibration)
        if disagreement:
            out.append(f"--calibration: {disagreement}")
    return out


def tie_note(best: Estimate, other: Estimate) -> str:
    """For a runner-up: whether its p10-p90 interval overlaps the plan's (then the two are a tie: their
    difference is within what the model gets wrong across sources), and the parts of the critical-path
    breakdown that separate them (largest differences first). The intervals are one cluster's error band: plans
    on the same cluster and stack share most of it, so the breakdown says where the ranking comes from."""
    mine, theirs = best.iteration_time_interval_s, other.iteration_time_interval_s
    if not intervals_overlap(mine, theirs):
        return ""
    parts = sorted(((other.breakdown.get(k, 0.0) - v, k) for k, v in best.breakdown.items()),
                   key=lambda dv: -abs(dv[0]))
    reasons = ", ".join(f"{k.removesuffix('_s').replace('_', ' ')} {d:+.3f} s" for d, k in parts[:3] if abs(d) >= 5e-4)
    return (f"  TIE with #1 within the prediction interval (p10-p90 {theirs[0]:.3f}-{theirs[1]:.3f} s against "
            f"{mine[0]:.3f}-{mine[1]:.3f} s); it differs by {reasons or 'nothing on the critical path'}")


def solver_lines(result) -> list[str]:
    """The solver's report: method, status, objective, bound, gap, time; its note; a non-time objective."""
    s = result.solver
    lines = [f"solver: {s.method}, status {s.status}, objective {s.objective_s:.4f} s, "
             f"bound {'n/a' if s.bound_s is None else f'{s.bound_s:.4f} s'}, "
             f"gap {'n/a' if s.gap is None else f'{100 * s.gap:.2f} %'}, wall time {s.wall_time_s:.2f} s, "
             f"seed {s.seed}"]
    if s.note:
        lines.append(f"  ({s.note})")
    if s.objective != "time":
        lines.append(f"objective {s.objective}: {s.objective_value:.6g} {UNITS[s.objective]} "
                     f"(bound {s.bound_value:.6g})")
    return lines


def default_comparison(instance, result) -> str:
    """The plan against the best Megatron-style default placement, in the objective's own unit, and (for time)
    the share of the gain that the GPU assignment alone brings (the plan's configuration and partition with
    ranks filled node by node); "" when the search had no default to compare with."""
    if not result.default:
        return ""
    objective = result.solver.objective
    default_v = objective_value(instance, objective, *result.default)
    plan_v = objective_value(instance, objective, result.placement, result.estimate)
    unit = {"time": "s", "cost": "per million tokens", "gpus": "GPUs"}[objective]
    text = f"Megatron-style default (best over configurations): {default_v:.4f} {unit}; this plan {plan_v:.4f} {unit}"
    if default_v <= plan_v * 1.001:
        return f"{text}: no better than the default (within 0.1 %)"
    share = ""
    if result.solver.islands:  # mixed types: the map and the split go together (stages sit on islands)
        share = "; stages composed on islands of identical GPUs, layers sized by each type's speed and memory"
    elif objective == "time":
        filled = dataclasses.replace(result.placement, gpus=tuple(range(result.placement.world_size)))
        filled_s = evaluate(instance, filled, check=False).iteration_time_s
        share = f"; the GPU assignment alone brings {100 * (filled_s - plan_v) / (default_v - plan_v):.0f} % of it"
    return f"{text}, {default_v / plan_v:.3f}x better{share}"


def framework_line(instance) -> str:
    """Which framework and software stack the plan is for, and where each came from (flag, instance, default)."""
    from formulation.inputs.frameworks import describe
    job = instance.training
    if job.framework:
        return (f"planned for {job.framework} ({job.framework_origin}): software stack {job.software_stack}; "
                f"{describe(job)}")
    stack_origin = "default: training.software_stack not set" if job.software_stack_defaulted else \
        "the instance's training.software_stack"
    stack = (f"{job.unmodelled_stack} (not a modelled stack: planned as {job.software_stack})" if job.unmodelled_stack
             else job.software_stack)
    return (f"planned for no particular framework: software stack {stack} ({stack_origin}); "
            f"--framework megatron|torchtitan plans for the framework you launch")


def schedule_line(instance, placement, estimate) -> str:
    """The pipeline schedule a pipelined plan runs (docs/schedules.md), the ones the job allowed, and what it
    gains over the 1F1B family at the same placement; "" without pipeline parallelism or when the job allows
    the 1F1B family alone (the plans of Megatron-LM, whose lines stay as they were)."""
    if placement.pp == 1 or set(instance.training.pipeline_schedules) <= {"1F1B", "Interleaved1F1B"}:
        return ""
    allowed = ", ".join(instance.training.pipeline_schedules)
    text = f"pipeline schedule: {placement.schedule_name} (allowed: {allowed})"
    if placement.schedule == "1f1b":
        return text
    base = dataclasses.replace(placement, schedule="1f1b")
    one = evaluate(instance, base, check=False)
    gain = one.iteration_time_s / estimate.iteration_time_s - 1
    return (f"{text}; {100 * gain:.1f} % faster than {base.schedule_name} at the same placement "
            f"({one.iteration_time_s:.4f} s, bubble {one.breakdown['bubble_s']:.4f} s against "
            f"{estimate.breakdown['bubble_s']:.4f} s), peak memory {estimate.peak_memory_gib:.1f} GiB against "
            f"{one.peak_memory_gib:.1f}")


def result_lines(instance, result) -> list[str]:
    """Everything printed after a plan's summary: the framework it is for; for a searched plan the solver, the
    default comparison, hints, runners-up (a scored placement, `solve --evaluate`, has no solver)."""
    if getattr(result, "solver", None) is None:
        return [framework_line(instance)]
    lines = [framework_line(instance)] + solver_lines(result)
    schedule = schedule_line(instance, result.placement, result.estimate)
    lines += [schedule] if schedule else []
    comparison = default_comparison(instance, result)
    lines += [comparison] if comparison else []
    lines += [f"hint: {hint['note']}" for hint in getattr(result, "hints", [])]
    lines += [f"#{rank}: {e.iteration_time_s:.4f} s  {p.describe()}" + tie_note(result.estimate, e)
              for rank, (p, e) in enumerate(getattr(result, "alternatives", []), start=2)]
    return lines


def launch_notes(instance, plan) -> list[str]:
    """What the launch files change from the plan or leave to the user, as their NOTE comments say it: the
    Megatron-LM arguments' notes and what torchtitan runs instead (a zero stage it cannot run, and its cost)."""
    from solvers.outputs.export import megatron_arguments
    from solvers.outputs.torchtitan import torchtitan_run
    notes = [f"megatron_args.sh: {note}" for note in megatron_arguments(instance, plan.placement)[1]]
    by_release = {release: torchtitan_run(instance, plan, release).notes for release in ("0.3", "0.2")}
    for note in by_release["0.3"]:
        both = note in by_release["0.2"]
        notes.append(f"torchtitan_args.sh{' and torchtitan-0.2.toml' if both else ''}: {note}")
    notes += [f"torchtitan-0.2.toml: {note}" for note in by_release["0.2"] if note not in by_release["0.3"]]
    return notes
