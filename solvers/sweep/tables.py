"""What a sweep writes: one table (CSV and JSON), the best plan of each cell, the Pareto front of days against
cost as a picture, and an HTML page with both."""

from __future__ import annotations

import csv
import html
import io
from pathlib import Path

from solvers.outputs.files import save_figure_atomic, write_json_atomic, write_text_atomic
from solvers.sweep.cells import Sweep

COLUMNS = ["cell", "base", "model", "gpu_type", "nodes", "global_batch_size", "seq_length", "objective", "status",
           "gpus", "tp", "pp", "cp", "dp", "vpp", "micro_batch_size", "recompute", "zero_stage", "iteration_time_s",
           "iteration_time_p10_s", "iteration_time_p90_s", "tokens_per_s", "mfu", "mfu_ceiling", "mfu_above_published",
           "peak_memory_gib", "gap", "days",
           "gpu_hours", "cost", "wall_time_s", "mfu_ceiling_source", "reason", "key"]


def pareto_front(rows: list[dict]) -> list[dict]:
    """Cells no other cell beats in both days and cost (ties kept), by increasing days."""
    points = sorted((r for r in rows if r.get("days") is not None and r.get("cost") is not None),
                    key=lambda r: (r["days"], r["cost"]))
    front, best_cost = [], float("inf")
    for r in points:
        if r["cost"] <= best_cost:
            front.append(r)
            best_cost = r["cost"]
    return front


def write_tables(sweep: Sweep, rows: list[dict], out: Path) -> dict[str, Path]:
    columns = [c for c in COLUMNS if any(c in r for r in rows)]
    text = io.StringIO()
    writer = csv.DictWriter(text, columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    written = {"table.csv": write_text_atomic(out / "table.csv", text.getvalue())}
    table = [{k: v for k, v in r.items() if k != "plan"} for r in rows]
    front = pareto_front(rows)
    written["table.json"] = write_json_atomic(out / "table.json", {"name": sweep.name, "token_budget": sweep.token_budget,
                                                                   "cells": table,
                                                                   "pareto": [r["cell"] for r in front]})
    for r in rows:
        if "plan" in r:
            write_json_atomic(out / "plans" / f"cell{r['cell']:04d}.json", r["plan"])
    if front:
        written["pareto.png"] = pareto_picture(sweep, rows, front, out / "pareto.png")
    written["index.html"] = write_text_atomic(out / "index.html", _page(sweep, columns, table, front, "pareto.png"
                                                                         in written))
    return written


def _label(r: dict) -> str:
    parts = [str(r[k]) for k in ("model", "gpu_type") if k in r] + [f"{r['gpus']} GPUs"]
    return " ".join(parts)


def _count(n: float) -> str:
    """15e12 -> '15T': token budgets read as people say them."""
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:.3g}"


def pareto_picture(sweep: Sweep, rows: list[dict], front: list[dict], path: Path) -> Path:
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter
    fig = Figure(figsize=(9, 5.5), dpi=110, layout="constrained")
    ax = fig.subplots()
    priced = [r for r in rows if r.get("days") is not None and r.get("cost") is not None]
    ax.scatter([r["days"] for r in priced], [r["cost"] for r in priced], color="#8E9AAF", label="cells")
    ax.plot([r["days"] for r in front], [r["cost"] for r in front], "o-", color="#C44E52", label="Pareto front")
    on_front = {id(r) for r in front}
    for r in priced:  # every cell named: the ones off the front are the answer to "why not that one?"
        ax.annotate(_label(r), (r["days"], r["cost"]), textcoords="offset points", xytext=(6, 4), fontsize=7,
                    color="black" if id(r) in on_front else "#5A6272")
    # Costs are millions: print them so instead of matplotlib's detached "1e7" offset.
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v / 1e6:,.2f} M"))
    ax.set_xlabel(f"days to {_count(sweep.token_budget)} tokens")
    ax.set_ylabel("cost (GPU-hours x price per GPU-hour, millions)")
    ax.set_title(f"{sweep.name}: time against cost, {len(priced)} of {len(rows)} cells with a price")
    ax.legend(fontsize=8)
    return save_figure_atomic(fig, path)


def _page(sweep: Sweep, columns: list[str], table: list[dict], front: list[dict], picture: bool) -> str:
    def cell(v) -> str:
        return html.escape(f"{v:.4g}" if isinstance(v, float) else "" if v is None else str(v))
    on_front = {r["cell"] for r in front}
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    def row_class(r: dict) -> str:
        names = (["front"] if r["cell"] in on_front else []) + (["flag"] if r.get("mfu_above_published") else [])
        return f' class="{" ".join(names)}"' if names else ""
    body = "".join("<tr" + row_class(r) + ">"
                   + "".join(f"<td>{cell(r.get(c))}</td>" for c in columns) + "</tr>" for r in table)
    image = '<p><img src="pareto.png" alt="Pareto front of days against cost"></p>' if picture else \
        "<p>No cell has both a token budget and a price: no Pareto picture.</p>"
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(sweep.name)}</title><style>"
            "body{font-family:sans-serif} table{border-collapse:collapse;font-size:12px} td,th{border:1px solid #ccc;"
            "padding:2px 6px;text-align:right} tr.front{background:#fde8e8} tr.flag td{color:#9a3412;font-weight:bold}"
            "</style></head><body>"
            f"<h1>{html.escape(sweep.name)}</h1>{image}<p>Rows on the Pareto front are shaded. Rows in bold "
            "(mfu_above_published) predict an MFU above the highest published for their GPU type and precision "
            "(mfu_ceiling, its source in mfu_ceiling_source): treat them as optimistic.</p>"
            f"<table><tr>{head}</tr>{body}</table></body></html>\n")
