"""`solve sweep SWEEP.yaml --out DIR`: every cell of a sweep planned in a local process pool (default) or as
Ray tasks (`--engine ray`), cached by the hash of each cell's inputs so that an interrupted sweep resumes
where it stopped, with one table (CSV, JSON), the Pareto front of time against cost, and an HTML page.

Ray does the distribution, retries and scaling; the driver holds only the rows (a few hundred bytes per cell)
and writes each finished cell to the cache at once."""

from __future__ import annotations

import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from formulation import InputError
from solvers.outputs.arguments import OneLineParser, count
from solvers.outputs.files import write_json_atomic
from solvers.sweep.cells import Cell, Sweep, cells, load_sweep, run_cell
from solvers.sweep.tables import write_tables


def cached(out: Path, cell: Cell) -> dict | None:
    path = out / "cells" / f"{cell.key}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _store(out: Path, cell: Cell, row: dict) -> dict:
    write_json_atomic(out / "cells" / f"{cell.key}.json", row)
    return row


def _local(todo: list[Cell], budget, workers: int):
    """Yield (cell, row) as cells finish, on a pool of worker processes (a cell is CPU-bound Python)."""
    if workers <= 1:
        for cell in todo:
            yield cell, run_cell(cell, budget)
        return
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(run_cell, cell, budget): cell for cell in todo}
        for future in as_completed(futures):
            yield futures[future], future.result()


def _ray(todo: list[Cell], budget, address: str | None):
    """Yield (cell, row) as Ray tasks finish; Ray retries a task whose worker died."""
    try:
        import ray
    except ImportError:
        raise InputError(None, "--engine", "ray is not installed: pip install 'llm-train-planner[ray]'") from None
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False)
    task = ray.remote(max_retries=2)(run_cell)
    pending = {task.remote(cell, budget): cell for cell in todo}
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1)
        for ref in done:
            yield pending.pop(ref), ray.get(ref)


def run_sweep(sweep: Sweep, out: Path, engine: str = "local", workers: int | None = None,
              ray_address: str | None = None, progress: bool = False) -> list[dict]:
    """Plan every cell not yet in `out`'s cache; return the rows of all cells in cell order."""
    todo_cells = cells(sweep)
    rows = {c.index: row for c in todo_cells if (row := cached(out, c)) is not None}
    todo = [c for c in todo_cells if c.index not in rows]
    workers = workers or os.cpu_count() or 1
    stream = _ray(todo, sweep.token_budget, ray_address) if engine == "ray" else \
        _local(todo, sweep.token_budget, workers)
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn()]
    from_cache, planned, failed = len(rows), 0, 0
    with Progress(*columns, disable=not progress, transient=True) as bar:
        task = bar.add_task(_progress_text(planned, from_cache, failed), total=len(todo_cells), completed=from_cache)
        for cell, row in stream:
            rows[cell.index] = _store(out, cell, row)
            planned += 1
            failed += "plan" not in row
            bar.update(task, advance=1, description=_progress_text(planned, from_cache, failed))
    return [rows[c.index] for c in todo_cells]


def _progress_text(done: int, cached_cells: int, failed: int) -> str:
    return f"sweep: {done} planned, {cached_cells} from cache, {failed} failed"


def main(argv: list[str]) -> int:
    parser = OneLineParser(prog="solve sweep", description="Plan every cell of a what-if sweep (models, "
                                     "GPU types, node counts, batch, sequence) and tabulate days and cost")
    parser.add_argument("sweep", metavar="SWEEP.yaml")
    parser.add_argument("--out", required=True, metavar="DIR", help="table.csv, table.json, pareto.png, "
                        "index.html, plans/ and the cell cache (re-running resumes from it)")
    parser.add_argument("--engine", choices=["local", "ray"], default="local",
                        help="local: a process pool on this machine (default); ray: each cell a Ray task")
    parser.add_argument("--workers", type=count, default=None, help="local pool size (default: all cores)")
    parser.add_argument("--ray-address", default=None, help="an existing Ray cluster (default: start one here)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    try:
        sweep = load_sweep(args.sweep)
        out = Path(args.out)
        rows = run_sweep(sweep, out, args.engine, args.workers, args.ray_address,
                         progress=not args.quiet and sys.stderr.isatty())
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    written = write_tables(sweep, rows, out)
    ok = sum("plan" in r for r in rows)
    print(f"{sweep.name}: {len(rows)} cells, {ok} planned, {len(rows) - ok} without a plan; "
          + ", ".join(str(p) for p in written.values()))
    flagged = [r for r in rows if r.get("mfu_above_published")]
    if flagged:
        which = "1 cell predicts" if len(flagged) == 1 else f"{len(flagged)} cells predict"
        print(f"WARNING: {which} an MFU above the highest published for their GPU type and precision (cell "
              f"{', '.join(str(r['cell']) for r in flagged)}; mfu_ceiling and its source in the table): treat as "
              "optimistic")
    return 0
