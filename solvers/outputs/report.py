"""Readable terminal output of estimates and plans (rich tables, units everywhere)."""

from __future__ import annotations

import csv
import functools
import textwrap

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from formulation.data import REFERENCE_DIR
from formulation.evaluate import Estimate
from formulation.inputs.gpus import gpu_catalog
from formulation.inputs.job import PYTORCH_STACKS
from formulation.intervals import interval_basis, interval_note, intervals_overlap, slow_tail_share
from formulation.placement import Placement


def comment_lines(notes: list[str], prefix: str = "") -> list[str]:
    """Notes as shell/TOML comments wrapped at 110 columns."""
    return [line for note in notes
            for line in textwrap.wrap(note, 110, initial_indent="# " + prefix, subsequent_indent="#   ",
                                       break_on_hyphens=False)]


@functools.cache
def _published_mfu() -> dict[tuple[str, str], tuple[float, str]]:
    """The highest MFU published per (catalog GPU type, precision) in the packaged reference runs."""
    best: dict[tuple[str, str], tuple[float, str]] = {}
    for name in ("published_runs.csv", "published_runs_torchtitan.csv"):
        with (REFERENCE_DIR / name).open(newline="") as handle:
            for row in csv.DictReader(handle):
                try:
                    mfu = float(row["mfu"])
                except (KeyError, ValueError):
                    continue
                key = (row["gpu_type"], row["precision"] or "bf16")
                if mfu > best.get(key, (0.0, ""))[0]:
                    best[key] = (mfu, row["source"].split(" (")[0])
    return best


def _mfu_note(instance, e: Estimate) -> str:
    """A prediction above every published run of its GPU type is more likely the model's optimism than a record."""
    catalog = gpu_catalog()
    published = []
    for stage in e.stages:
        gpu = instance.cluster.gpu_types[stage.gpu_type]
        names = [n for n, c in catalog.items() if c.get("peak_tflops") == gpu.peak_tflops
                 and c.get("memory_gib") == gpu.memory_gib]
        published += [_published_mfu()[(n, instance.training.precision)] for n in names
                      if (n, instance.training.precision) in _published_mfu()]
    if not published:
        return ""
    ceiling, source = max(published)
    if e.mfu <= ceiling:
        return ""
    return (f" (above the highest MFU published for this GPU type and precision, {100 * ceiling:.1f} % in "
            f"{source}: treat as optimistic)")


def folding_table(title: str, columns, left=("GPU", "part")) -> Table:
    """Columns that fold rather than cut (a narrow terminal wraps a number, never hides it), right-aligned
    except the text columns named in `left`."""
    table = Table(title=title)
    for name in columns:
        table.add_column(escape(name), justify="left" if name in left else "right", overflow="fold",
                         min_width=max(len(word) for word in name.split()))
    return table


def stack_note(job) -> str:
    """Which stack (and precision) the prediction assumes, with a warning when the instance did not say."""
    compile_note = f", torch.compile {'on' if job.torch_compile else 'off'}" if job.software_stack in PYTORCH_STACKS else ""
    if job.software_stack == "llm-foundry":
        compile_note += f", backward prefetch {job.fsdp_backward_prefetch}"
    modules = "" if tuple(job.recompute_modules) == ("core_attn",) else (
        f"; selective recompute modules: {' '.join(job.recompute_modules)}")
    note = f"{job.software_stack} ({job.precision}{compile_note}{modules})"
    if job.unmodelled_stack:
        note = f"{job.unmodelled_stack}: not a modelled stack, planned as {note}"
    if job.software_stack_defaulted:
        note += " - WARNING: training.software_stack not set, assumed megatron; set it to the stack you run"
    return note


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


def estimate_tables(instance, p: Placement, e: Estimate) -> list[Table]:
    head = Table(title=f"{instance.name}: {instance.model.name} on {p.world_size} GPUs", show_header=False)
    head.add_column(style="bold", overflow="fold")
    head.add_column(overflow="fold")
    head.add_row("configuration", p.summary())
    head.add_row("software stack", stack_note(instance.training))
    head.add_row("micro-batches per iteration", str(e.num_micro_batches))
    interval = e.iteration_time_interval_s
    basis = {"fp8": "other sources' published FP8 runs", "16-bit": "other sources' published 16-bit runs",
             "new-setup": "published runs of other clusters", "unprofiled-stack": "published runs of other stacks"}.get(
        interval_basis(e.interval_group), "other sources' published runs")
    slow_tail = slow_tail_share(e.stack_kind)
    head.add_row("iteration time", f"{e.iteration_time_s:.3f} s" + (
        f" (p10-p90 {interval[0]:.3f}-{interval[1]:.3f} s, from the model's errors on {basis})" if interval else "") + (
        f"; held out by source, {100 * slow_tail:.0f} % of the published runs on "
        f"{'the PyTorch stacks' if e.stack_kind == 'pytorch' else 'this stack'} measured slower than "
        f"their band's slow end (10 % nominal)" if interval and slow_tail and slow_tail >= 0.2 else ""))
    if interval:
        head.add_row("interval basis", interval_note(e.interval_group, e.interval_gaps))
    head.add_row("throughput", f"{e.tokens_per_s:,.0f} tokens/s")
    head.add_row("model TFLOP/s per GPU", f"{e.model_tflops_per_gpu:.1f} (Megatron-LM FLOP count)")
    head.add_row("MFU", f"{100 * e.mfu:.1f} %" + _mfu_note(instance, e))
    head.add_row("peak memory", f"{e.peak_memory_gib:.1f} GiB ({'fits' if e.fits else 'DOES NOT FIT'})")

    crit = folding_table(f"critical path (slowest stage: {e.critical_stage})", ("part", "time [s]", "share"))
    for key, value in e.breakdown.items():
        part = key.removesuffix("_s") + (" (exposed)" if key.startswith("dp_comm") else "")
        crit.add_row(part, f"{value:.3f}", f"{100 * value / e.iteration_time_s:.1f} %")
    crit.add_row("total", f"{sum(e.breakdown.values()):.3f}", "100.0 %", style="bold")

    times = folding_table("per stage: time per micro-batch", ("stage", "layers", "GPU", "fwd [ms]", "bwd [ms]",
                                                         "dp sync, whole [ms]"))
    mem = folding_table("per stage: memory per GPU [GiB] (runtime: CUDA context, NCCL, allocator)",
                 ("stage", "weights", "grads", "optim", "activ.", "buffers", "runtime", "total", "limit"))
    for s in e.stages:
        m = s.memory
        style = None if m.fits else "bold red"
        times.add_row(str(s.stage), str(s.layers), s.gpu_type, f"{1e3 * s.forward_s:.1f}",
                      f"{1e3 * s.backward_s:.1f}", f"{1e3 * s.dp_sync_s:.1f}", style=style)
        mem.add_row(str(s.stage), f"{m.weights_gib:.1f}", f"{m.gradients_gib:.1f}", f"{m.optimizer_gib:.1f}",
                    f"{m.activations_gib:.1f}", f"{m.buffers_gib:.1f}", f"{m.overhead_gib:.1f}",
                    f"{m.total_gib:.1f}", f"{m.limit_gib:.1f}", style=style)
    return [head, crit, times, mem]


def gpu_grid_table(instance, p: Placement) -> Table:
    """Node x GPU grid with each GPU's (pp, dp, cp, tp) coordinate; '-' marks an idle GPU."""
    cluster = instance.cluster
    coord = {}
    for rank, gpu in enumerate(p.gpus):
        tp_i = rank % p.tp
        cp_i = (rank // p.tp) % p.cp
        dp_i = (rank // (p.tp * p.cp)) % p.dp
        pp_i = rank // (p.tp * p.cp * p.dp)
        coord[gpu] = f"s{pp_i} d{dp_i}" + (f" c{cp_i}" if p.cp > 1 else "") + (f" t{tp_i}" if p.tp > 1 else "")
    width = max(n.num_gpus for n in cluster.nodes)
    table = Table(title="GPU map: stage s, data-parallel replica d, context c, tensor t")
    table.add_column("node", no_wrap=True, min_width=max(len(n.name) for n in cluster.nodes))
    for g in range(width):
        table.add_column(f"gpu{g}", overflow="fold")
    for i, node in enumerate(cluster.nodes):
        start = int(cluster.node_offset[i])
        table.add_row(node.name, *[coord.get(start + g, "-") for g in range(node.num_gpus)])
    return table


def print_tables(tables, console: Console | None = None) -> None:
    console = console or Console()
    for table in tables:
        console.print(table)


def islands_table(islands: list[dict]) -> Table:
    """Mixed clusters: what each island of identical GPUs hosts, and why any of its GPUs stay idle."""
    table = Table(title="islands (identical GPU type and links)")
    for col in ("island", "GPUs", "stages", "layers", "idle", "why idle"):
        table.add_column(col, justify="right" if col in ("GPUs", "layers", "idle") else "left", overflow="fold")
    for r in islands:
        stages = r["stages"]
        span = "none" if not stages else (f"{stages[0]}" if len(stages) == 1 else f"{stages[0]}-{stages[-1]}")
        table.add_row(escape(r["island"]), str(r["gpus"]), span, str(r["layers"]), str(r["idle_gpus"]),
                      escape(r["why_idle"]) or "-")
    return table
