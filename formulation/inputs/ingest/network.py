"""Measurement files referenced from an instance's `cluster.network`, turned into bandwidth model inputs.

Keys (paths relative to the instance file's directory):
- `nccl_tests`: `[{"file", "level": "intra" | "inter", "nodes": [...] (default all), "collective", "ranks",
  "ranks_per_node"}]`. The fit (see `nccl.fit_nccl_log`) replaces that level's nominal bandwidth for the listed
  nodes, and the level's latency. With NCCL's tuning model (docs/collectives.md) the latency figure is the one at
  which that model gives the log's zero-size time (alpha) back; otherwise (one ring at alpha per step):
  intra: bandwidth = fitted busbw, step latency = alpha / steps(n);
  inter (n ranks on N nodes, k per node): a multi-node ring uses the k NICs of a node in parallel, so its busbw
  is k x the per-NIC bandwidth when the NICs are the bottleneck (DGX H100: ~370 GB/s = 8 x ~46), hence
  bandwidth = busbw / k (sendrecv: busbw, one flow per NIC); step latency = alpha / steps(N), the whole alpha
  charged to the inter-node steps (conservative: the intra-node steps are charged again by the model).
  Several logs of one level: the largest step latency (the model has one alpha per level).
  `collective` is needed only when neither the file name nor the log names the test; `ranks` only when the log
  lists no `# Rank` lines; `ranks_per_node` only for such an inter-node log.
- `sendrecv_logs`: `[{"nodes": [a, b], "file"}]`: measured node-pair bandwidths, as `node_pairs`.
- `nvidia_smi_topo`: `[{"file", "nodes" (default all), "gpu_generation" (default from the GPU type's name),
  "table": {overrides}}]`: the intra-node GPU-pair matrix of those nodes (see `topo`).
Errors name the instance file and field path, then the measurement file and its line.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from formulation.errors import InputError, Section
from formulation.inputs.ingest.nccl import COLLECTIVES, RING_STEPS, LinkFit, fit_nccl_log, parse_nccl_log, sendrecv_bandwidth
from formulation.inputs.ingest.topo import GENERATIONS, gpu_bandwidth_matrix, is_table_key, parse_topology
from formulation.physics.collectives import latency_figure_us
from formulation.physics.cost import term


@dataclass
class LevelFits:
    """Per-node level bandwidths from nccl-tests logs (None: no log) and the level latencies in seconds."""

    intra_gb_per_s: list[float | None]
    inter_gb_per_s: list[float | None]
    intra_latency_s: float | None = None
    inter_latency_s: float | None = None


def _read(parse, sec: Section, key: str = "file"):
    """Run a parser; its error (naming the measurement file and line) is re-raised at the instance's field."""
    try:
        return parse()
    except InputError as exc:
        where = exc.file if exc.field == "<root>" else f"{exc.file}: {exc.field}"
        raise sec.error(key, f"{where}: {exc.problem}") from None


def level_figures(fit: LinkFit, level: str, ranks_per_node: int | None = None,
                  intra_hw: str = "nvlink", intra_us: float | None = None) -> tuple[float, float]:
    """(GB/s per GPU, latency figure in us) of a fitted log (with known collective and ranks) used as the `intra`
    or `inter` level figure (module docstring); `ranks_per_node` is needed for `inter`. With NCCL's tuning model
    (`nccl_algorithms`) a collective's latency figure is the one at which that model gives the log's own zero-size
    time back (collectives.latency_figure_us); a sendrecv log's alpha is one step either way."""
    steps = RING_STEPS[fit.collective]
    nodes = 1 if level == "intra" else fit.n_ranks // ranks_per_node
    per_node = fit.n_ranks if level == "intra" else ranks_per_node
    if fit.collective != "sendrecv" and term("nccl_algorithms") and term("rail_ring"):
        latency = latency_figure_us(fit.collective, fit.n_ranks, nodes, per_node, fit.latency_us, level, intra_hw,
                                    intra_us)
    else:
        latency = fit.latency_us / steps(fit.n_ranks if level == "intra" else nodes)
    if level == "intra":
        return fit.gb_per_s, latency
    per_nic = fit.gb_per_s if fit.collective == "sendrecv" else fit.gb_per_s / ranks_per_node
    return per_nic, latency


def _node_list(sec: Section, index: dict[str, int]) -> list[int]:
    if not sec.has("nodes"):
        return list(index.values())
    names = sec.items("nodes")
    for i, name in enumerate(names):
        if not isinstance(name, str) or name not in index:
            raise sec.error(f"nodes[{i}]", f"unknown node {name!r}")
    return [index[name] for name in names]


def nccl_level_fits(net: Section, nodes, base_dir: Path, intra_hw: str = "nvlink") -> LevelFits:
    """`nccl_tests` entries -> per-node level bandwidths and level latencies (module docstring); `intra_hw`: NCCL's
    hardware class of the nodes' fabric (collectives.fabrics)."""
    index = {node.name: i for i, node in enumerate(nodes)}
    fits = LevelFits([None] * len(nodes), [None] * len(nodes))
    latencies: dict[str, list[float]] = {"intra": [], "inter": []}
    logs = []
    for i, item in enumerate(net.items("nccl_tests", default=[], non_empty=False)):
        es = Section(item, net.file, f"cluster.network.nccl_tests[{i}]")
        path = base_dir / es.string("file")
        level = es.string("level", choices=("intra", "inter"))
        targets = _node_list(es, index)
        collective = es.string("collective", default=None, choices=COLLECTIVES)
        ranks = es.integer("ranks", default=None, minimum=2)
        per_node = es.integer("ranks_per_node", default=None)
        es.done()
        log = _read(lambda: parse_nccl_log(path), es)
        collective = collective or log.collective
        if collective is None:
            raise es.error("collective", f"{path}: cannot tell which test the log is from (no all_reduce_perf-style "
                                         f"name in the file name or text); give one of {', '.join(COLLECTIVES)}")
        if ranks is not None and log.n_ranks is not None and ranks != log.n_ranks:
            raise es.error("ranks", f"{path}: the log lists {log.n_ranks} ranks, not {ranks}")
        n = ranks or log.n_ranks
        if n is None:
            raise es.error("ranks", f"{path}: the log lists no '# Rank' lines; give the number of ranks it ran")
        fit = _read(lambda: fit_nccl_log(log, collective=collective, n_ranks=n), es)
        per_host = set(Counter(log.hosts).values())
        if level == "intra":
            if len(set(log.hosts)) > 1:
                raise es.error("level", f"{path}: the log's ranks run on {len(set(log.hosts))} hosts; an intra-node "
                                        "log runs on one")
            if per_node is not None:
                raise es.error("ranks_per_node", "applies to inter-node logs only")
        else:
            if len(per_host) > 1:
                raise es.error("level", f"{path}: the hosts run different numbers of ranks ({sorted(per_host)})")
            if per_host and per_node not in (None, *per_host):
                raise es.error("ranks_per_node", f"{path}: the log runs {per_host.pop()} ranks per host")
            per_node = per_node or (per_host.pop() if per_host else None)
            if per_node is None:
                raise es.error("ranks_per_node", f"{path}: the log lists no hosts; give the ranks per node")
            if n % per_node or n // per_node < 2:
                raise es.error("level", f"{path}: {n} ranks at {per_node} per node do not span several nodes")
        logs.append((fit, level, per_node, targets))
    # intra-node logs first: an inter-node log's latency figure is solved with the intra-node figure they give
    for fit, level, per_node, targets in sorted(logs, key=lambda entry: entry[1] != "intra"):
        intra_us = None if fits.intra_latency_s is None else fits.intra_latency_s * 1e6
        bandwidth, step_latency = level_figures(fit, level, per_node, intra_hw, intra_us)
        level_values = fits.intra_gb_per_s if level == "intra" else fits.inter_gb_per_s
        for node in targets:
            level_values[node] = bandwidth
        latencies[level].append(step_latency * 1e-6)
        if level == "intra":
            fits.intra_latency_s = max(latencies["intra"])
    fits.inter_latency_s = max(latencies["inter"], default=None)
    return fits


def sendrecv_pairs(net: Section, index: dict[str, int], base_dir: Path) -> list[tuple[int, int, float]]:
    """`sendrecv_logs` entries -> (node a, node b, GB/s)."""
    out = []
    for i, item in enumerate(net.items("sendrecv_logs", default=[], non_empty=False)):
        es = Section(item, net.file, f"cluster.network.sendrecv_logs[{i}]")
        pair = es.items("nodes")
        if len(pair) != 2 or any(not isinstance(p, str) or p not in index for p in pair) or pair[0] == pair[1]:
            raise es.error("nodes", f"expected two different known node names, got {pair!r}")
        path = base_dir / es.string("file")
        es.done()
        out.append((index[pair[0]], index[pair[1]], _read(lambda: sendrecv_bandwidth(path), es)))
    return out


def topo_matrices(net: Section, nodes, gpu_types: dict, base_dir: Path) -> dict[int, np.ndarray]:
    """`nvidia_smi_topo` entries -> {node index: g x g GB/s matrix}; later entries win for a node."""
    index = {node.name: i for i, node in enumerate(nodes)}
    out: dict[int, np.ndarray] = {}
    for i, item in enumerate(net.items("nvidia_smi_topo", default=[], non_empty=False)):
        es = Section(item, net.file, f"cluster.network.nvidia_smi_topo[{i}]")
        path = base_dir / es.string("file")
        targets = _node_list(es, index)
        generation = es.string("gpu_generation", default=None, choices=tuple(GENERATIONS))
        if generation is None:
            generation = _generation_of(es, {nodes[k].gpu_type for k in targets})
        table = es.section("table", default={})
        overrides = {}
        for key in list(table.data):
            if not isinstance(key, str) or not is_table_key(key):
                raise table.error(str(key), "expected a link class: NV (per link), NV<k>, PIX, PXB, PHB, NODE or SYS")
            overrides[key] = table.bandwidth(key)
        es.done()
        topology = _read(lambda: parse_topology(path), es)
        matrix = gpu_bandwidth_matrix(topology, generation, overrides)
        for k in targets:
            if nodes[k].num_gpus != topology.num_gpus:
                raise es.error("file", f"{path}: the topology has {topology.num_gpus} GPUs, node {nodes[k].name!r} "
                                       f"has {nodes[k].num_gpus}")
            out[k] = matrix.copy()
    return out


def _generation_of(es: Section, gpu_types: set[str]) -> str:
    found = {g for t in gpu_types for g in GENERATIONS if g in t.lower()}
    if len(found) != 1:
        raise es.error("gpu_generation", f"cannot tell the GPU generation from GPU type(s) "
                                         f"{', '.join(sorted(gpu_types))}; give one of {', '.join(GENERATIONS)}")
    return found.pop()
