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


# Critical-path parts that are communication: what an error in the network figures moves (docs/collectives.md).
COMMUNICATION_PARTS = ("tp_comm_s", "cp_comm_s", "pp_comm_s", "dp_comm_s", "ep_comm_s")


def exposed_communication_s(estimate: Estimate) -> float:
    """Seconds of an iteration's critical path spent in communication not hidden by compute."""
    return sum(estimate.breakdown.get(part, 0.0) for part in COMMUNICATION_PARTS)


def network_basis(instance) -> str:
    """Whether the inter-node figures were measured (nccl-tests logs) or are a fabric's nominal speed, and on what
    the fabric's share of line rate rests (formulation/data/fabrics.json)."""
    from formulation.physics.collectives import fabrics
    cluster = instance.cluster
    if len(cluster.nodes) > 1 and not cluster.nominal_levels[1]:
        return "inter-node figures measured (nccl-tests)"
    entry = fabrics()["inter"][cluster.inter_fabric]
    basis = "published nccl-tests figures" if entry["basis"] == "measured" else "no published figure, assumed"
    return (f"inter-node figures nominal on {cluster.inter_fabric} (share of line rate "
            f"{entry['line_rate_fraction']:g}: {basis})")


def least_exposed_line(instance, result) -> str:
    """Among #1 and the runners-up tied with it (`tie_note`), the plan least exposed to the terms the model knows
    least: the one with the least exposed communication on its critical path (an error in the network figures,
    NCCL's efficiency at scale or the overlap shares moves it least); #1 on equal exposure. A report-level choice:
    the objective stays the predicted time. "" without ties."""
    ties = [(rank, p, e) for rank, (p, e) in enumerate(getattr(result, "alternatives", []), start=2)
            if tie_note(result.estimate, e)]
    if not ties:
        return ""
    rank, placement, estimate = min([(1, result.placement, result.estimate)] + ties,
                                    key=lambda c: (round(exposed_communication_s(c[2]), 4), c[0]))
    mine = exposed_communication_s(result.estimate)
    theirs = exposed_communication_s(estimate)
    basis = network_basis(instance)
    if rank == 1:
        return (f"least exposed among the {len(ties) + 1} tied plans: #1 itself (exposed communication {mine:.3f} s, "
                f"{100 * mine / result.estimate.iteration_time_s:.1f} % of its iteration; {basis})")
    return (f"least exposed among the {len(ties) + 1} tied plans: #{rank} {placement.describe()}: exposed "
            f"communication {theirs:.3f} s ({100 * theirs / estimate.iteration_time_s:.1f} % of its iteration) "
            f"against {mine:.3f} s for #1; {basis}: prefer #{rank} where the network is what you doubt")


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


def overlap_line(instance, placement, estimate) -> str:
    """Whether an MoE plan overlaps its all-to-all with the other micro-batch's compute (docs/moe.md (E10)) and
    what that changes: the exposed expert communication, the iteration time and the peak memory with and without
    it, or why it is off; "" for a plan without expert parallelism."""
    if instance.model.moe is None or placement.ep < 2:
        return ""
    from formulation.physics import moe_overlap
    job = instance.training
    flags = "Megatron-Core --overlap-moe-expert-parallel-comm --delay-wgrad-compute"
    other = evaluate(instance, dataclasses.replace(placement, moe_a2a_overlap=not placement.moe_a2a_overlap),
                     check=False) if placement.moe_a2a_overlap or not moe_overlap.problem(
        instance.model, job, placement) else None
    if placement.moe_a2a_overlap:
        return (f"MoE all-to-all overlap: on ({flags}): expert communication exposed "
                f"{estimate.breakdown['ep_comm_s']:.3f} s per iteration, {other.breakdown['ep_comm_s']:.3f} s without; "
                f"iteration {other.iteration_time_s:.4f} s -> {estimate.iteration_time_s:.4f} s, peak memory "
                f"{other.peak_memory_gib:.1f} -> {estimate.peak_memory_gib:.1f} GiB")
    if other is None:
        return f"MoE all-to-all overlap: off ({moe_overlap.problem(instance.model, job, placement)})"
    why = "training.moe_a2a_overlap excludes it; " if True not in job.moe_a2a_overlap else ""
    fits = "" if other.fits else ", does not fit"
    return (f"MoE all-to-all overlap: off ({why}with it this placement: {other.iteration_time_s:.4f} s, "
            f"{other.peak_memory_gib:.1f} GiB{fits})")


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
    """Everything printed after a plan's summary: the framework it is for, the MoE all-to-all overlap; for a
    searched plan the solver, the default comparison, hints, runners-up (a scored placement, `solve --evaluate`,
    has no solver)."""
    overlap = overlap_line(instance, result.placement, result.estimate)
    head = [framework_line(instance)] + ([overlap] if overlap else [])
    if getattr(result, "solver", None) is None:
        return head
    lines = head + solver_lines(result)
    schedule = schedule_line(instance, result.placement, result.estimate)
    lines += [schedule] if schedule else []
    comparison = default_comparison(instance, result)
    lines += [comparison] if comparison else []
    lines += [f"hint: {hint['note']}" for hint in getattr(result, "hints", [])]
    lines += [f"#{rank}: {e.iteration_time_s:.4f} s  {p.describe()}" + tie_note(result.estimate, e)
              for rank, (p, e) in enumerate(getattr(result, "alternatives", []), start=2)]
    least = least_exposed_line(instance, result)
    return lines + ([least] if least else [])


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
