"""report.html: the plan's tables and pictures on one self-contained page (pictures referenced next to it).

It says what the terminal says: the same tables (solvers/outputs/report.py), the same warnings and the same lines
beside them (solvers/outputs/plan_notes.py), and what the launch files change from the plan."""

from __future__ import annotations

import html
from pathlib import Path

from solvers.outputs.plan_notes import input_warnings, launch_notes, result_lines
from solvers.outputs.report import TableData, detail_tables, estimate_warnings, gpu_map, islands_table, summary_table

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 24px; color: #222; max-width: 1700px; }
h1 { font-size: 22px; } h2 { font-size: 17px; margin-top: 28px; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 13px; margin: 8px 0; }
caption { text-align: left; font-weight: bold; padding: 4px 0; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
th { background: #f3f3f3; } td.l, th.l { text-align: left; }
tr.bad td { color: #b00; font-weight: bold; } tr.total td { font-weight: bold; }
img { max-width: 100%; border: 1px solid #ddd; margin: 6px 0; }
.row { display: flex; gap: 16px; flex-wrap: wrap; align-items: flex-start; }
.warn { color: #a40; } code { background: #f5f5f5; padding: 1px 4px; }
"""


def _table(t: TableData) -> str:
    def cell(tag: str, column: str, value: str) -> str:
        left = (column in t.left) or not t.header
        return f"<{tag}{' class=l' if left else ''}>{html.escape(value)}</{tag}>"

    out = [f"<table><caption>{html.escape(t.title)}</caption>"]
    if t.header:
        out.append("<tr>" + "".join(cell("th", c, c) for c in t.columns) + "</tr>")
    for k, row in enumerate(t.rows):
        flag = " class=bad" if t.bad and t.bad[k] else " class=total" if t.total and k == len(t.rows) - 1 else ""
        out.append(f"<tr{flag}>" + "".join(cell("td", c, v) for c, v in zip(t.columns, row)) + "</tr>")
    return "\n".join(out + ["</table>"])


def _items(lines: list[str], css: str = "") -> str:
    if not lines:
        return ""
    return (f"<ul{f' class={css}' if css else ''}>" + "".join(f"<li>{html.escape(line.strip())}</li>" for line in lines)
            + "</ul>")


def report_html(instance, plan, files: dict[str, Path]) -> str:
    p, e = plan.placement, plan.estimate
    solver = getattr(plan, "solver", None)
    tables = detail_tables(e)
    if solver is not None and solver.islands:
        tables.append(islands_table(solver.islands))
    links = "".join(f"<li><a href='{html.escape(name)}'><code>{html.escape(name)}</code></a></li>"
                    for name in files if not name.endswith(".png"))
    pictures = {name: f"<img src='{name}' alt='{name}'>" for name in ("schedule.png", "memory.png", "cluster.png")
                if name in files}
    warnings = [f"warning: {w}" for w in input_warnings(instance)] + [
        f"WARNING: {w}" for w in estimate_warnings(instance, e)]
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>Plan: {html.escape(instance.name)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>Training plan for {html.escape(instance.name)}</h1>",
        f"<p>{html.escape(instance.description)}</p>",
        _table(summary_table(instance, p, e)), _items(warnings, "warn"), _items(result_lines(instance, plan)),
        "<h2>Critical path, time and memory per stage</h2><div class=row>",
        *(f"<div>{_table(t)}</div>" for t in tables), "</div>",
        "<h2>Pipeline schedule</h2>", pictures.get("schedule.png", ""),
        "<h2>Memory and GPU map</h2><div class=row>", pictures.get("memory.png", ""), "</div>",
        pictures.get("cluster.png", ""), _table(gpu_map(instance, p)),
        "<h2>Launch files</h2>", _items([f"note: {n}" for n in launch_notes(instance, plan)], "warn"),
        "<ul>", links, "</ul></body></html>"]
    return "\n".join(parts) + "\n"
