"""A sweep file and its cells: every combination of the axes applied to a base instance, each planned by the
ordinary library call and cached by a hash of what it was given.

Sweep file (YAML or JSON), paths relative to it:

    name: llama31-70b-capacity
    base: ../h100_1024.json          # or bases: [a.json, b.json]
    token_budget: 15.0e12            # tokens to train: iteration time -> days and cost
    time_limit_s: 60                 # per cell (omit for a deterministic search per seed)
    seed: 0
    axes:                            # each optional; a cell is one value of every axis given
      model: [{preset: llama3.1-70b}, {preset: llama3.1-405b}]   # replaces the model section
      gpu_type: [h100-sxm-80gb, h200-sxm-141gb]                   # catalog preset for every node
      nodes: [32, 64, 128, 256]                                   # node count (GPUs per node from the base)
      global_batch_size: [1024, 2048]
      seq_length: [8192]
      objective: [time]
    prices: {h100-sxm-80gb: 2.5, h200-sxm-141gb: 3.5}             # price per GPU-hour, for cost
"""

from __future__ import annotations

import copy
import functools
import hashlib
import itertools
import json
import time
from dataclasses import dataclass
from pathlib import Path

import formulation
from formulation import InfeasibleError, InputError, instance_from_dict
from formulation.errors import Section
from formulation.inputs.instance import read_document
from formulation.mfu_ceiling import mfu_check
from solvers.search.objectives import price_per_s
from solvers.search.driver import NoPlanInTime
from solvers.strategy import solve

AXES = ("model", "gpu_type", "nodes", "global_batch_size", "seq_length", "objective")
# Measured network details name nodes of the base cluster; a cell with another node count keeps the level
# figures (intra-/inter-node bandwidth, latencies) and drops what no longer applies.
NODE_SPECIFIC = ("nodes", "node_pairs", "node_matrix_gb_per_s", "gpu_matrix_gb_per_s", "gpu_pairs", "leaf_groups",
                 "nccl_tests", "sendrecv_logs", "nvidia_smi_topo")
CACHE_VERSION = 2  # bump when a cell's result format changes, so old cache entries are not reused


@functools.cache
def model_fingerprint() -> str:
    """A digest of the model a cell was planned with: the formulation package's code and data (cost and memory
    models, calibration, catalog), so that a resumed sweep re-plans its cells after a model change or a refit
    instead of reusing results priced by the old model."""
    root = Path(formulation.__file__).parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.suffix in (".py", ".json", ".csv", ".yaml"):
            digest.update(str(path.relative_to(root)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class Sweep:
    name: str
    file: str
    bases: tuple[tuple[str, dict], ...]  # (label, instance document with paths made absolute)
    axes: dict  # axis -> list of values
    token_budget: float | None
    time_limit_s: float | None
    seed: int
    prices: dict


@dataclass(frozen=True)
class Cell:
    index: int
    values: dict  # base label and one value per axis
    document: dict  # the cell's instance document
    time_limit_s: float | None
    seed: int
    objective: str

    @property
    def key(self) -> str:
        text = json.dumps([CACHE_VERSION, model_fingerprint(), self.document, self.time_limit_s, self.seed,
                           self.objective],
                          sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def load_sweep(path: str | Path) -> Sweep:
    """Read and validate a sweep file; any problem is an `InputError` naming the file and field."""
    path = Path(path)
    sec = Section(read_document(path), str(path), "")
    name = sec.string("name", default=path.stem)
    bases = sec.raw("bases", None) or [sec.string("base")]
    if not isinstance(bases, list) or not all(isinstance(b, str) for b in bases):
        raise sec.error("bases", "expected a list of instance file paths")
    sec.raw("base", None)
    documents = tuple((Path(b).stem, _absolute_paths(read_document(path.parent / b), (path.parent / b).parent))
                      for b in bases)
    axes_sec = Section(sec.raw("axes", {}), str(path), "axes")
    axes = {}
    for axis in AXES:
        values = axes_sec.raw(axis, None)
        if values is None:
            continue
        if not isinstance(values, list) or not values:
            raise axes_sec.error(axis, "expected a non-empty list of values")
        axes[axis] = values
    axes_sec.done()
    budget = sec.number("token_budget", default=None, positive=True, maximum=1e18)
    limit = sec.number("time_limit_s", default=None, positive=True)
    seed = sec.integer("seed", default=0, minimum=0, maximum=2**31 - 1)
    prices = sec.raw("prices", {})
    if not isinstance(prices, dict) or not all(isinstance(v, (int, float)) and v >= 0 for v in prices.values()):
        raise sec.error("prices", "expected a map of GPU type to a price per GPU-hour >= 0")
    sec.done()
    return Sweep(name, str(path), documents, axes, budget, limit, seed, prices)


def _absolute_paths(document: dict, base_dir: Path) -> dict:
    """Measurement files and HF configs are relative to their instance file; cells are built elsewhere."""
    document = copy.deepcopy(document)
    model = document.get("model")
    if isinstance(model, dict) and isinstance(model.get("hf_config"), str):
        model["hf_config"] = str((base_dir / model["hf_config"]).resolve())
    network = (document.get("cluster") or {}).get("network") or {}
    for key in ("nccl_tests", "sendrecv_logs", "nvidia_smi_topo"):
        for entry in network.get(key) or []:
            if isinstance(entry, dict) and isinstance(entry.get("file"), str):
                entry["file"] = str((base_dir / entry["file"]).resolve())
    return document


def cells(sweep: Sweep) -> list[Cell]:
    """Every combination of base and axis values, in a stable order."""
    names = list(sweep.axes)
    out = []
    for (label, base), combo in itertools.product(sweep.bases, itertools.product(*sweep.axes.values())):
        values = {"base": label, **dict(zip(names, combo))}
        document = _apply(base, values, sweep.prices)
        out.append(Cell(len(out), values, document, sweep.time_limit_s, sweep.seed, values.get("objective", "time")))
    return out


def _apply(base: dict, values: dict, prices: dict) -> dict:
    doc = copy.deepcopy(base)
    doc["name"] = f"{doc.get('name', values['base'])} [" + ", ".join(
        f"{k}={_short(v)}" for k, v in values.items() if k != "base") + "]"
    training, cluster = doc.setdefault("training", {}), doc.setdefault("cluster", {})
    if "model" in values:
        doc["model"] = copy.deepcopy(values["model"])
    for key in ("global_batch_size", "seq_length"):
        if key in values:
            training[key] = values[key]
    if isinstance(cluster.get("nodes"), dict):  # the compact form's single object, as a one-entry list
        cluster["nodes"] = [cluster["nodes"]]
    if "gpu_type" in values:
        cluster["gpu_types"] = {values["gpu_type"]: {"preset": values["gpu_type"]}}
        for node in cluster.get("nodes", []):
            node["gpu_type"] = values["gpu_type"]
    if "nodes" in values:
        first = cluster["nodes"][0]
        cluster["nodes"] = [{"count": values["nodes"], "prefix": "node-", "gpu_type": first["gpu_type"],
                             "gpus": first["gpus"]}]
        network = cluster.setdefault("network", {})
        for key in NODE_SPECIFIC:
            network.pop(key, None)
    for name, spec in cluster.get("gpu_types", {}).items():
        if name in prices or spec.get("preset") in prices:
            spec["price_per_hour"] = prices.get(name, prices.get(spec.get("preset")))
    return doc


def _short(value) -> str:
    if isinstance(value, dict):
        return str(value.get("preset") or value.get("hf_config") or value.get("name") or "custom")
    return str(value)


def run_cell(cell: Cell, token_budget: float | None) -> dict:
    """Plan one cell; never raises for the cell's own problems (bad input, infeasible, no plan in time): the
    row says what happened, so the sweep goes on."""
    start = time.perf_counter()
    row = {"cell": cell.index, "key": cell.key, **{k: _short(v) for k, v in cell.values.items()}}
    try:
        instance = instance_from_dict(copy.deepcopy(cell.document), f"cell {cell.index}")
        result = solve(instance, time_limit=cell.time_limit_s, seed=cell.seed, objective=cell.objective,
                       required_tokens_per_s=None)
    except InputError as exc:
        return {**row, "status": "bad input", "reason": str(exc), "wall_time_s": time.perf_counter() - start}
    except (InfeasibleError, NoPlanInTime) as exc:
        return {**row, "status": "infeasible" if isinstance(exc, InfeasibleError) else "timeout",
                "reason": str(exc), "wall_time_s": time.perf_counter() - start}
    return {**row, **plan_row(instance, result, token_budget), "reason": "",
            "wall_time_s": time.perf_counter() - start, "plan": result.to_dict(instance.cluster)}


def plan_row(instance, result, token_budget: float | None) -> dict:
    p, e, s = result.placement, result.estimate, result.solver
    gpus = p.world_size
    price = price_per_s(instance, p) * 3600  # per hour, all GPUs of the plan
    days = token_budget / e.tokens_per_s / 86400 if token_budget else None
    row = {"status": s.status, "gpus": gpus, "tp": p.tp, "pp": p.pp, "cp": p.cp, "dp": p.dp, "vpp": p.vpp,
           "micro_batch_size": p.micro_batch_size, "recompute": p.recompute, "zero_stage": p.zero_stage,
           "iteration_time_s": e.iteration_time_s, "tokens_per_s": e.tokens_per_s, "mfu": e.mfu,
           "peak_memory_gib": e.peak_memory_gib, "gap": s.gap, "days": days,
           "gpu_hours": days * 24 * gpus if days is not None else None,
           "cost": days * 24 * price if days is not None and price > 0 else None}
    check = mfu_check(instance.cluster, e)
    if check is not None:  # the highest MFU published for the GPU type and precision, and whether the cell is above
        row["mfu_ceiling"] = check.ceiling.mfu
        row["mfu_above_published"] = check.above
        row["mfu_ceiling_source"] = f"{check.ceiling.source['title']} ({check.ceiling.source['url']})"
    interval = e.to_dict().get("iteration_time_interval_s")
    if interval:  # the prediction interval, where the estimate carries one
        row["iteration_time_p10_s"], row["iteration_time_p90_s"] = interval[0], interval[-1]
    return row
