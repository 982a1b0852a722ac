"""report.html: the plan's tables and pictures on one self-contained page (pictures referenced next to it)."""

from __future__ import annotations

import html
from pathlib import Path

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 24px; color: #222; max-width: 1700px; }
h1 { font-size: 22px; } h2 { font-size: 17px; margin-top: 28px; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 13px; margin: 8px 0; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
th { background: #f3f3f3; } td.l, th.l { text-align: left; }
tr.bad td { color: #b00; font-weight: bold; }
img { max-width: 100%; border: 1px solid #ddd; margin: 6px 0; }
.row { display: flex; gap: 16px; flex-wrap: wrap; align-items: flex-start; }
code { background: #f5f5f5; padding: 1px 4px; }
"""


def _table(header: list[str], rows: list[list], left: int = 1, bad: list[bool] | None = None) -> str:
    def cell(tag: str, i: int, value) -> str:
        return f"<{tag}{' class=l' if i < left else ''}>{html.escape(str(value))}</{tag}>"

    out = ["<table><tr>" + "".join(cell("th", i, h) for i, h in enumerate(header)) + "</tr>"]
    for k, row in enumerate(rows):
        flag = " class=bad" if bad and bad[k] else ""
        out.append(f"<tr{flag}>" + "".join(cell("td", i, v) for i, v in enumerate(row)) + "</tr>")
    return "\n".join(out + ["</table>"])


def report_html(instance, plan, files: dict[str, Path]) -> str:
    p, e = plan.placement, plan.estimate
    solver = getattr(plan, "solver", None)
    summary = [
        ["model", f"{instance.model.name} ({instance.model.num_layers} layers, hidden {instance.model.hidden_size})"],
        ["GPUs", f"{p.world_size} of {instance.cluster.num_gpus} ({len(instance.cluster.nodes)} nodes)"],
        ["parallel sizes", f"{p.sizes()} vpp={p.vpp}"],
        ["micro-batch, recompute, zero", f"{p.micro_batch_size}, {p.recompute_text}, {p.zero_stage}"],
        ["layers per stage", ", ".join(map(str, p.layers_per_stage))],
        ["micro-batches per iteration", e.num_micro_batches],
        ["iteration time", f"{e.iteration_time_s:.3f} s"],
        ["throughput", f"{e.tokens_per_s:,.0f} tokens/s"],
        ["model TFLOP/s per GPU, MFU", f"{e.model_tflops_per_gpu:.1f}, {100 * e.mfu:.1f} %"],
        ["peak memory", f"{e.peak_memory_gib:.1f} GiB ({'fits' if e.fits else 'DOES NOT FIT'})"],
    ]
    if solver is not None:
        gap = "n/a" if solver.gap is None else f"{100 * solver.gap:.2f} %"
        summary.append(["solver", f"{solver.method}, {solver.status}, gap {gap}, {solver.wall_time_s:.2f} s"])
    breakdown = [[k.removesuffix("_s"), f"{v:.3f}", f"{100 * v / e.iteration_time_s:.1f} %"]
                 for k, v in e.breakdown.items()]
    stages = [[s.stage, s.layers, s.gpu_type, f"{1e3 * s.forward_s:.1f}", f"{1e3 * s.backward_s:.1f}",
               f"{s.memory.weights_gib:.1f}", f"{s.memory.gradients_gib:.1f}", f"{s.memory.optimizer_gib:.1f}",
               f"{s.memory.activations_gib:.1f}", f"{s.memory.total_gib:.1f}", f"{s.memory.limit_gib:.1f}"]
              for s in e.stages]
    links = "".join(f"<li><a href='{html.escape(name)}'><code>{html.escape(name)}</code></a></li>"
                    for name in files if not name.endswith(".png"))
    pictures = {name: f"<img src='{name}' alt='{name}'>" for name in ("schedule.png", "memory.png", "cluster.png")
                if name in files}
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>Plan: {html.escape(instance.name)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>Training plan for {html.escape(instance.name)}</h1>",
        f"<p>{html.escape(instance.description)}</p>",
        "<div class=row><div>", _table(["", ""], summary), "</div><div>",
        _table(["critical path", "time [s]", "share"], breakdown), "</div></div>",
        "<h2>Per stage: time per micro-batch and memory per GPU [GiB]</h2>",
        _table(["stage", "layers", "GPU", "fwd [ms]", "bwd [ms]", "weights", "grads", "optim", "activ.", "total",
                "limit"], stages, left=0, bad=[not s.memory.fits for s in e.stages]),
        "<h2>Pipeline schedule</h2>", pictures.get("schedule.png", ""),
        "<h2>Memory and GPU map</h2><div class=row>", pictures.get("memory.png", ""), "</div>",
        pictures.get("cluster.png", ""),
        "<h2>Launch files</h2><ul>", links, "</ul></body></html>"]
    return "\n".join(parts) + "\n"
