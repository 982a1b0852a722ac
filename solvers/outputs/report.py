"""Readable terminal output of estimates and plans (rich tables, units everywhere)."""

from __future__ import annotations

import math
import os
import sys
import textwrap
from dataclasses import dataclass

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from formulation.evaluate import Estimate
from formulation.inputs.job import PYTORCH_STACKS
from formulation.intervals import interval_basis, interval_note, slow_tail_share
from formulation.mfu_ceiling import mfu_warning
from formulation.placement import Placement
from solvers.outputs.plan_notes import calibration_text, result_lines


def comment_lines(notes: list[str], prefix: str = "") -> list[str]:
    """Notes as shell/TOML comments wrapped at 110 columns."""
    return [line for note in notes
            for line in textwrap.wrap(note, 110, initial_indent="# " + prefix, subsequent_indent="#   ",
                                       break_on_hyphens=False)]


def folding_table(title: str, columns, left=("GPU", "part")) -> Table:
    """Columns that fold rather than cut (a narrow terminal wraps a number, never hides it), right-aligned
    except the text columns named in `left`."""
    table = Table(title=title)
    for name in columns:
        table.add_column(escape(name), justify="left" if name in left else "right", overflow="fold",
                         min_width=max(len(word) for word in name.split()))
    return table


def terminal_console(stderr: bool = False) -> Console:
    """The console the tables go to: a terminal's own width; piped or redirected, `COLUMNS` when it is set (as
    for a terminal), else 160 columns rather than rich's 80-column fallback."""
    stream = sys.stderr if stderr else sys.stdout
    columns = os.environ.get("COLUMNS", "").strip()
    width = None if stream.isatty() else int(columns) if columns.isdigit() and int(columns) > 0 else 160
    return Console(stderr=stderr, width=width)


@dataclass(frozen=True)
class TableData:
    """One table of a plan's report, as text: the terminal (rich) and report.html render the same rows."""
    title: str
    columns: tuple[str, ...]
    rows: list[tuple[str, ...]]
    left: tuple[str, ...] = ()  # text columns (left-aligned)
    bad: tuple[bool, ...] = ()  # rows over their memory limit
    total: bool = False  # the last row is the total of the others
    header: bool = True


def stack_note(job) -> str:
    """Which stack (and precision) the prediction assumes (a defaulted stack is among `estimate_warnings`)."""
    compile_note = f", torch.compile {'on' if job.torch_compile else 'off'}" if job.software_stack in PYTORCH_STACKS else ""
    if job.software_stack == "llm-foundry":
        compile_note += f", backward prefetch {job.fsdp_backward_prefetch}"
    modules = "" if tuple(job.recompute_modules) == ("core_attn",) else (
        f"; selective recompute modules: {' '.join(job.recompute_modules)}")
    assumed = ", assumed: not set" if job.software_stack_defaulted else ""
    note = f"{job.software_stack} ({job.precision}{compile_note}{modules}{assumed})"
    return f"{job.unmodelled_stack}: not a modelled stack, planned as {note}" if job.unmodelled_stack else note


def band_text(instance, e: Estimate) -> str:
    """The p10-p90 band after the iteration time, and where it comes from (with a user calibration, that the
    calibration moved the estimate and the band is the stored model's spread around it)."""
    interval = e.iteration_time_interval_s
    if not interval:
        return ""
    basis = {"fp8": "other sources' published FP8 runs", "16-bit": "other sources' published 16-bit runs",
             "new-setup": "published runs of other clusters", "unprofiled-stack": "published runs of other stacks"}.get(
        interval_basis(e.interval_group), "other sources' published runs")
    band = f"p10-p90 {interval[0]:.3f}-{interval[1]:.3f} s"
    if instance.calibration is None:
        return f" ({band}, from the model's errors on {basis})"
    return (f" (with your calibration applied: {calibration_text(instance.calibration)}; {band}: the spread of the "
            f"stored model's errors on {basis}, around this calibrated estimate)")


def estimate_warnings(instance, e: Estimate) -> list[str]:
    """Every caveat on an estimate, in one list: the terminal prints it under the summary and report.html lists
    it, so a warning added here reaches both."""
    out = []
    if instance.training.software_stack_defaulted:
        out.append("training.software_stack not set, assumed megatron; set it to the stack you run")
    slow_tail = slow_tail_share(e.stack_kind)
    if e.iteration_time_interval_s and slow_tail and slow_tail >= 0.2:
        where = "the PyTorch stacks" if e.stack_kind == "pytorch" else "this stack"
        out.append(f"held out by source, {100 * slow_tail:.0f} % of the published runs on {where} measured slower "
                   f"than their band's slow end (10 % nominal)")
    # a prediction above the highest MFU published for its GPU type and precision is more likely the model's
    # optimism than a record (formulation/mfu_ceiling.py)
    mfu = mfu_warning(instance.cluster, e)
    if mfu:
        out.append(f"{mfu}; treat as optimistic" if "optimistic" not in mfu else mfu)
    return out


def summary_table(instance, p: Placement, e: Estimate) -> TableData:
    cluster, model = instance.cluster, instance.model
    rows = [("model", f"{model.name} ({model.num_layers} layers, hidden {model.hidden_size})"),
            ("GPUs", f"{p.world_size:,} of {cluster.num_gpus:,} ({len(cluster.nodes):,} nodes)"),
            ("configuration", p.summary()), ("software stack", stack_note(instance.training)),
            ("micro-batches per iteration", str(e.num_micro_batches)),
            ("iteration time", f"{e.iteration_time_s:.3f} s" + band_text(instance, e)),
            *([("interval basis", interval_note(e.interval_group, e.interval_gaps) or "")]
              if e.iteration_time_interval_s else []),
            ("throughput", f"{e.tokens_per_s:,.0f} tokens/s"),
            ("model TFLOP/s per GPU", f"{e.model_tflops_per_gpu:.1f} (Megatron-LM FLOP count)"),
            ("MFU", f"{100 * e.mfu:.1f} %"),
            ("peak memory", f"{e.peak_memory_gib:.1f} GiB ({'fits' if e.fits else 'DOES NOT FIT'})")]
    return TableData(f"{instance.name}: {instance.model.name} on {p.world_size} GPUs", ("", ""), rows,
                     left=("",), header=False)


def rounded_parts(parts: list[float], digits: int) -> list[str]:
    """Parts rounded to `digits` decimals so that they add up to their rounded sum (largest remainders round
    up), the sum last: a table's parts and its total then agree on the page. Each part is within one unit of
    the last digit."""
    scale = 10 ** digits
    target = round(sum(parts) * scale)
    floors = [math.floor(v * scale) for v in parts]
    order = sorted(range(len(parts)), key=lambda i: floors[i] - parts[i] * scale)  # largest remainder first
    for i in order[:max(0, target - sum(floors))]:
        floors[i] += 1
    return [f"{v / scale:.{digits}f}" for v in floors] + [f"{target / scale:.{digits}f}"]


def detail_tables(e: Estimate) -> list[TableData]:
    """The critical path's parts, and per stage its time and its memory, the parts adding up to the totals."""
    keys = list(e.breakdown)
    times = rounded_parts([e.breakdown[k] for k in keys], 3)
    total = sum(e.breakdown.values())
    crit = [(k.removesuffix("_s") + (" (exposed)" if k.startswith("dp_comm") else ""), t,
             f"{100 * e.breakdown[k] / total:.1f} %") for k, t in zip(keys, times)]
    crit.append(("total", times[-1], "100.0 %"))
    bad = tuple(not s.memory.fits for s in e.stages)
    per_stage = [(str(s.stage), str(s.layers), s.gpu_type, f"{1e3 * s.forward_s:.1f}", f"{1e3 * s.backward_s:.1f}",
                  f"{1e3 * s.dp_sync_s:.1f}") for s in e.stages]
    memory = []
    for s in e.stages:
        m = s.memory
        parts = rounded_parts([m.weights_gib, m.gradients_gib, m.optimizer_gib, m.activations_gib, m.buffers_gib,
                               m.overhead_gib], 1)
        memory.append((str(s.stage), *parts, f"{m.limit_gib:.1f}"))
    return [
        TableData(f"critical path (slowest stage: {e.critical_stage})", ("part", "time [s]", "share"), crit,
                  left=("part",), total=True),
        TableData("per stage: time per micro-batch", ("stage", "layers", "GPU", "fwd [ms]", "bwd [ms]",
                                                      "dp sync, whole [ms]"), per_stage, left=("GPU",), bad=bad),
        TableData("per stage: memory per GPU [GiB] (runtime: CUDA context, NCCL, allocator)", ("stage", "weights", "grads", "optim", "activ.", "buffers", "runtime", "total",
                                    "limit"), memory, bad=bad)]


# A cluster of more nodes prints the first and last FOLD_KEEP rows of its GPU map (the full map is in the files)
FOLD_ABOVE_NODES, FOLD_KEEP = 32, 8


def gpu_map(instance, p: Placement, fold: bool = True) -> TableData:
    """Node x GPU grid with each GPU's (pp, dp, cp, tp) coordinate; '-' marks an idle GPU. More than
    FOLD_ABOVE_NODES nodes: the first and last FOLD_KEEP rows and a row saying how many are folded."""
    cluster = instance.cluster
    coord = {}
    for rank, gpu in enumerate(p.gpus):
        tp_i = rank % p.tp
        cp_i = (rank // p.tp) % p.cp
        dp_i = (rank // (p.tp * p.cp)) % p.dp
        pp_i = rank // (p.tp * p.cp * p.dp)
        coord[gpu] = f"s{pp_i} d{dp_i}" + (f" c{cp_i}" if p.cp > 1 else "") + (f" t{tp_i}" if p.tp > 1 else "")
    width = max(n.num_gpus for n in cluster.nodes)
    count = len(cluster.nodes)
    shown: list = list(range(count))
    if fold and count > FOLD_ABOVE_NODES:
        shown = [*range(FOLD_KEEP), None, *range(count - FOLD_KEEP, count)]
    rows = []
    for i in shown:
        if i is None:
            rows.append(("...", f"{count - 2 * FOLD_KEEP:,} rows folded", *[""] * (width - 1)))
            continue
        node, start = cluster.nodes[i], int(cluster.node_offset[i])
        rows.append((node.name, *[coord.get(start + g, "-") for g in range(node.num_gpus)],
                     *[""] * (width - node.num_gpus)))
    folded = "" if len(shown) == count else (
        f" (first and last {FOLD_KEEP} of {count:,} nodes; the full map is the plan's gpus: --json, --output, "
        "or plan.json in --output-dir)")
    return TableData(f"GPU map: stage s, data-parallel replica d, context c, tensor t{folded}",
                     ("node", *[f"gpu{g}" for g in range(width)]), rows, left=("node",))


def estimate_tables(instance, p: Placement, e: Estimate) -> list[TableData]:
    """The summary, then the critical path, per-stage times and memory (the GPU map is `gpu_map`)."""
    return [summary_table(instance, p, e), *detail_tables(e)]


def gpu_grid_table(instance, p: Placement) -> TableData:
    return gpu_map(instance, p)


def rich_table(t: TableData) -> Table:
    """A table of the report as rich renders it on the terminal."""
    if not t.header:
        table = Table(title=escape(t.title), show_header=False)
        table.add_column(style="bold", overflow="fold")
        table.add_column(overflow="fold")
    elif t.columns[0] == "node":  # the GPU map: node names whole
        table = Table(title=escape(t.title))
        table.add_column("node", no_wrap=True, min_width=max(len(r[0]) for r in t.rows))
        for name in t.columns[1:]:
            table.add_column(name, overflow="fold")
    else:
        table = folding_table(t.title, t.columns, left=t.left)
    for k, row in enumerate(t.rows):
        style = "bold red" if t.bad and t.bad[k] else "bold" if t.total and k == len(t.rows) - 1 else None
        table.add_row(*map(escape, row), style=style)
    return table


def print_tables(tables, console: Console | None = None) -> None:
    console = console or Console()
    for table in tables:
        console.print(rich_table(table) if isinstance(table, TableData) else table)


def print_report(instance, plan, console: Console) -> None:
    """A plan (or a scored placement) on the terminal: the summary and its warnings, the solver's report, the
    comparison with the default and the runners-up first; then the critical path, the per-stage tables, the
    islands and the GPU map (folded on large clusters)."""
    p, e = plan.placement, plan.estimate
    print_tables([summary_table(instance, p, e)], console)
    for warning in estimate_warnings(instance, e):
        console.print(f"WARNING: {warning}", highlight=False)
    for line in result_lines(instance, plan):
        console.print(line, highlight=False)
    solver = getattr(plan, "solver", None)
    islands = [islands_table(solver.islands)] if solver is not None and solver.islands else []
    print_tables(detail_tables(e) + islands + [gpu_map(instance, p)], console)


def islands_table(islands: list[dict]) -> TableData:
    """Mixed clusters: what each island of identical GPUs hosts, and why any of its GPUs stay idle."""
    rows = []
    for r in islands:
        stages = r["stages"]
        span = "none" if not stages else (f"{stages[0]}" if len(stages) == 1 else f"{stages[0]}-{stages[-1]}")
        rows.append((r["island"], str(r["gpus"]), span, str(r["layers"]), str(r["idle_gpus"]), r["why_idle"] or "-"))
    return TableData("islands (identical GPU type and links)", ("island", "GPUs", "stages", "layers", "idle",
                                                               "why idle"), rows, left=("island", "stages", "why idle"))
