"""Readable terminal output of estimates and plans (rich tables, units everywhere)."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from formulation.evaluate import Estimate
from formulation.placement import Placement


def placement_summary(p: Placement) -> str:
    return (f"tp={p.tp} pp={p.pp} cp={p.cp} dp={p.dp} vpp={p.vpp} micro_batch_size={p.micro_batch_size} "
            f"recompute={p.recompute} zero_stage={p.zero_stage} layers_per_stage={list(p.layers_per_stage)}")


def estimate_tables(instance, p: Placement, e: Estimate) -> list[Table]:
    head = Table(title=f"{instance.name}: {instance.model.name} on {p.world_size} GPUs", show_header=False)
    head.add_column(style="bold")
    head.add_column()
    head.add_row("configuration", placement_summary(p))
    head.add_row("micro-batches per iteration", str(e.num_micro_batches))
    head.add_row("iteration time", f"{e.iteration_time_s:.3f} s")
    head.add_row("throughput", f"{e.tokens_per_s:,.0f} tokens/s")
    head.add_row("model TFLOP/s per GPU", f"{e.model_tflops_per_gpu:.1f} (Megatron-LM FLOP count)")
    head.add_row("MFU", f"{100 * e.mfu:.1f} %")
    head.add_row("peak memory", f"{e.peak_memory_gib:.1f} GiB ({'fits' if e.fits else 'DOES NOT FIT'})")

    crit = Table(title=f"critical path (slowest stage: {e.critical_stage})")
    crit.add_column("part")
    crit.add_column(escape("time [s]"), justify="right")
    crit.add_column("share", justify="right")
    for key, value in e.breakdown.items():
        crit.add_row(key.removesuffix("_s"), f"{value:.3f}", f"{100 * value / e.iteration_time_s:.1f} %")
    crit.add_row("total", f"{sum(e.breakdown.values()):.3f}", "100.0 %", style="bold")

    mem = Table(title="per stage: time per micro-batch and memory per GPU [GiB]")
    for col in ("stage", "layers", "GPU", "fwd [ms]", "bwd [ms]", "dp sync [ms]", "weights", "grads", "optim",
                "activ.", "buffers", "overhead", "total", "limit"):
        mem.add_column(escape(col), justify="right")
    for s in e.stages:
        m = s.memory
        mem.add_row(str(s.stage), str(s.layers), s.gpu_type, f"{1e3 * s.forward_s:.1f}", f"{1e3 * s.backward_s:.1f}",
                    f"{1e3 * s.dp_sync_s:.1f}", f"{m.weights_gib:.1f}", f"{m.gradients_gib:.1f}",
                    f"{m.optimizer_gib:.1f}", f"{m.activations_gib:.1f}", f"{m.buffers_gib:.1f}",
                    f"{m.overhead_gib:.1f}", f"{m.total_gib:.1f}", f"{m.limit_gib:.1f}",
                    style=None if m.fits else "bold red")
    return [head, crit, mem]


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
    table.add_column("node")
    for g in range(width):
        table.add_column(f"gpu{g}")
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
        table.add_column(col, justify="right" if col in ("GPUs", "layers", "idle") else "left")
    for r in islands:
        stages = r["stages"]
        span = "none" if not stages else (f"{stages[0]}" if len(stages) == 1 else f"{stages[0]}-{stages[-1]}")
        table.add_row(escape(r["island"]), str(r["gpus"]), span, str(r["layers"]), str(r["idle_gpus"]),
                      escape(r["why_idle"]) or "-")
    return table
