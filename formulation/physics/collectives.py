"""NCCL's choice of algorithm and protocol and their times (docs/collectives.md (C5a)-(C5d)), after NCCL's own tuning
model (NVIDIA/nccl src/graph/tuning.cc, `ncclTopoTuneModel` and `ncclTopoGetAlgoTime`), and the fabric table
(formulation/data/fabrics.json): the share of line rate NCCL reaches on each fabric kind.

Each option (algorithm, protocol) costs latency(shape) + bus bytes x max(cap, efficiency x level part), the level
parts being those of the rail ring (C5): (k - 1) / (k E_i B_i) over NVLink and 1 / (k E_e B_e) over the NICs. NCCL
picks the option of least time; the model picks it at the cluster's fastest links (`reference_links`), so that the
choice is fixed by the group's shape (nodes N, members per node k, ranks n) and the message, and the time at the
group's own links keeps the form latency + max(intra part, inter part) the exact programs encode (P6, P9).
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from importlib import resources

INF = float("inf")

# NCCL's tuner constants (src/graph/tuning.cc, ncclTunerConstantsDefaults), in microseconds. Protocols LL, LL128,
# Simple.
PROTOCOLS = ("LL", "LL128", "Simple")
BASE_LATENCY_US = {"tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4)}
HW_LATENCY_US = {
    "nvlink": {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4)},
    "pci": {"tree": (1.0, 1.9, 4.0), "ring": (1.0, 2.5, 5.7)},
    "net": {"tree": (5.0, 8.5, 14.0), "ring": (2.7, 4.0, 14.0)},
}
NET_OVERHEAD_US = 1.0  # getNetOverhead on an Intel x86 host (2.0 on AMD), x3 for Simple: an inter-node ring step's floor
# llMaxBws (GB/s of bus bandwidth): one node by GPU generation; across nodes by node count (2, more), Intel hosts
LL_MAX_ONE_NODE = {"volta": 39.0, "ampere": 87.7, "hopper": 141.0, "blackwell": 282.0}
LL_MAX_NODES = (39.0, 20.4)
RING_PLATEAU = {"volta": 1.9}  # ring Simple all-reduce across nodes: latency x 1.4 (x 1.9 before Ampere)
TREE_BUS_SHARE = 0.92  # tree all-reduce: busBw x 0.92
LL_BUS_SHARE = {"ring": 0.5, "tree": 1 / 3.8}  # LL moves 8 bytes per 4 of data; the tree's LL at 1/3.8
LL128_BUS_SHARE = {"ring": 0.92, "tree": 120 / 128}
# The cluster's latency figures (instance fields, nccl-tests fits) scale NCCL's constants: at the defaults (5 us inside
# a node, 15 us across) NCCL's constants hold as they are.
DEFAULT_INTRA_LATENCY_S, DEFAULT_INTER_LATENCY_S = 5e-6, 15e-6
# (C5e) Across NVLink domains (a cluster with `nvlink_domains`: NCCL with MNNVL fuses a rack's trays into one node of
# 72 GPUs and 72 NICs): a ring channel enters and leaves that node through one NIC each (NCCL's ncclTopoPreset:
# ringRecv / ringSend are the first and last GPU of the channel's chain inside the node), so the NICs that carry a
# ring between domains are those of its channels, not every member's. Fitted on the one published multi-rack curve
# (CoreWeave's 20 GB200 NVL72 racks, 1,440 ranks, docs/racks.md: 12 NICs of 45 GB/s give 0.92-1.09 of its bus
# bandwidth at 0.5-4 GiB; 8 give 0.79-0.82, 16 0.99-1.34); up to 8 members per rack every member's NIC carries the
# ring (NVIDIA/nccl issue 1801: 4 and 8 GPUs per GB200 rack over 3 racks reach 4 and 8 x 49 GB/s).
CROSS_DOMAIN_RING_NICS = 12


@lru_cache(maxsize=1)
def fabrics() -> dict:
    """The fabric table (package data), aliases resolved."""
    data = json.loads(resources.files("formulation.data").joinpath("fabrics.json").read_text())
    out = {}
    for level in ("intra", "inter"):
        table = data[level]
        out[level] = {name: table[entry["same_as"]] if "same_as" in entry else entry for name, entry in table.items()}
    return out


def line_rate_fraction(level: str, fabric: str) -> float:
    return float(fabrics()[level][fabric]["line_rate_fraction"])


def generation(gpu_type) -> str:
    """NCCL's compute-capability bucket of a GPU type, from its peaks (V100 125 TFLOP/s, A100 312 without FP8,
    H100/H200 about 1000 with FP8, Blackwell 2250 and up)."""
    if gpu_type.peak_tflops < 200:
        return "volta"
    if gpu_type.peak_fp8_tflops <= 0:
        return "ampere"
    return "blackwell" if gpu_type.peak_tflops >= 1500 else "hopper"


def cluster_generation(cluster) -> str:
    """The oldest generation among the cluster's GPU types (NCCL tunes on the communicator's minimum)."""
    order = ("volta", "ampere", "hopper", "blackwell")
    return min((generation(g) for g in getattr(cluster, "gpu_types", {}).values()), key=order.index, default="hopper")


def reference_links(cluster, links) -> tuple[float, float]:
    """The cluster's fastest intra- and inter-node figures: the links NCCL's choice is made at (a stand-in cluster
    without a network: the group's own)."""
    return getattr(cluster, "fastest_links", (links.intra_gb_per_s, links.inter_gb_per_s))


def _intra_hw(cluster) -> str:
    return fabrics()["intra"][getattr(cluster, "intra_fabric", "nvlink")]["nccl_hw"]


def crosses_domains(links, cluster) -> bool:
    """Whether a group spans several NVLink domains of a cluster that declares them (C5e)."""
    return links.nodes > 1 and bool(getattr(cluster, "has_domains", False))


def inter_nics(links, cluster) -> int:
    """The NICs per node (per domain, where the cluster declares them) that carry a ring's inter-node bytes in
    parallel: the group's fewest members on one node, each on its own NIC (C5); across NVLink domains at most
    CROSS_DOMAIN_RING_NICS (C5e)."""
    return min(links.per_node, CROSS_DOMAIN_RING_NICS) if crosses_domains(links, cluster) else links.per_node


def _options(kind: str, nodes: int, intra_hw: str, domains: bool = False) -> list[tuple[str, int]]:
    """The (algorithm, protocol index) pairs NCCL may run: ring for every collective, the tree for an all-reduce
    across nodes (NVLS and CollNet need switch support the fabric table does not describe); LL128 only over NVLink.
    Across NVLink domains (`domains`, C5e) the ring alone: the published multi-rack curve's fixed cost, about 5 ms at
    1,440 ranks, is the ring's (NCCL's ring LL128 latency there is 5.6 ms, its tree's 0.26 ms)."""
    algorithms = ["ring"] + (["tree"] if kind == "all_reduce" and nodes > 1 and not domains else [])
    protocols = [0, 1, 2] if intra_hw == "nvlink" else [0, 2]
    return [(a, p) for a in algorithms for p in protocols]


def option_latency_s(algorithm: str, protocol: int, kind: str, n: int, nodes: int, per_node: int, cluster,
                     intra_hw: str) -> float:
    """(C5b) NCCL's latency of one option: base + per-step hardware latencies. Ring: nsteps = 2 (n - 1) for an
    all-reduce, n - 1 for a gather or scatter, of which 2 (N - 1) (N - 1) cross nodes; an intra-node step costs at
    least the network's post overhead when the ring spans nodes, an inter-node step with one rank per node the tree's
    network latency; a ring Simple all-reduce across nodes x 1.4 (NCCL's plateau). Tree (all-reduce across nodes):
    2 ((n / N - 1) intra + floor(log2 N) inter)."""
    plateau = kind == "all_reduce" and PROTOCOLS[protocol] == "Simple" and nodes > 1 and algorithm == "ring"
    return _latency_s(algorithm, protocol, kind, n, nodes, per_node == 1, cluster.intra_latency_s,
                      cluster.inter_latency_s, intra_hw, RING_PLATEAU.get(cluster_generation(cluster), 1.4)
                      if plateau else 1.0)


@lru_cache(maxsize=65536)
def _latency_s(algorithm: str, protocol: int, kind: str, n: int, nodes: int, one_per_node: bool,
               intra_latency_s: float, inter_latency_s: float, intra_hw: str, plateau: float) -> float:
    """`option_latency_s` by the values it reads (memoised: the bounds price thousands of group shapes)."""
    intra_scale = intra_latency_s / DEFAULT_INTRA_LATENCY_S
    inter_scale = inter_latency_s / DEFAULT_INTER_LATENCY_S
    base = BASE_LATENCY_US[algorithm][protocol]
    intra = HW_LATENCY_US[intra_hw][algorithm][protocol] * intra_scale
    if algorithm == "tree":
        inter = HW_LATENCY_US["net"]["tree"][protocol] * inter_scale
        return 1e-6 * (base + 2 * ((n // nodes - 1) * intra + int(math.log2(nodes)) * inter))
    steps = 2 * (n - 1) if kind == "all_reduce" else n - 1
    if nodes == 1:
        return 1e-6 * (base + steps * intra)
    overhead = NET_OVERHEAD_US * (3 if PROTOCOLS[protocol] == "Simple" else 1)
    intra = max(intra, overhead)
    inter = HW_LATENCY_US["net"]["tree" if one_per_node else "ring"][protocol] * inter_scale
    inter_steps = 2 * (nodes - 1) if kind == "all_reduce" else nodes - 1
    latency = base + (steps - inter_steps) * intra + inter_steps * inter
    if plateau != 1.0:
        latency *= plateau
    return 1e-6 * latency


def level_part(links, cluster, efficiency: tuple[float, float], nics: int | None = None) -> float:
    """(C5), (C5e) Seconds per bus byte of the rail ring's slower level at `links`: (k - 1) / (k E_i B_i) over
    NVLink against 1 / (nics E_e B_e) over the NICs, 1 / (E_i B_i) on one node. Every option's time is latency +
    bus bytes x max(cap, part / share), its latency independent of k but for k = 1: so over the k of one node count
    the least time of any option is at the k of least part (solvers/bounds/parts.py relies on it)."""
    N, k = links.nodes, links.per_node
    intra_eff, inter_eff = efficiency
    if N == 1:
        return 1.0 / (intra_eff * links.intra_gb_per_s * 1e9)
    intra = (k - 1) / k / (intra_eff * links.intra_gb_per_s * 1e9) if k > 1 else 0.0
    nics = inter_nics(links, cluster) if nics is None else nics
    return max(intra, 1.0 / (nics * inter_eff * links.inter_gb_per_s * 1e9))


def option_time(algorithm: str, protocol: int, kind: str, message_bytes: float, factor: float, links, cluster,
                efficiency: tuple[float, float], intra_hw: str, nics: int | None = None) -> float:
    """(C5c) One option's time at `links`: latency + bus bytes x max(LL's bandwidth cap, level part / share).
    Bus bytes: factor(n) S on the ring, 2 S on the tree (algbw = busbw / 2). Level part: the rail ring's (C5),
    1 / (E_i B_i) on one node. `nics`: `inter_nics(links, cluster)` when the caller has it."""
    n, N, k = links.size, links.nodes, links.per_node
    part = level_part(links, cluster, efficiency, nics)
    name = PROTOCOLS[protocol]
    share = {"LL": LL_BUS_SHARE[algorithm], "LL128": LL128_BUS_SHARE[algorithm], "Simple": 1.0}[name]
    if algorithm == "tree":
        share *= TREE_BUS_SHARE
    cap = 0.0
    if name == "LL":
        ll_max = LL_MAX_ONE_NODE[cluster_generation(cluster)] if N == 1 else LL_MAX_NODES[0 if N == 2 else 1]
        cap = 1.0 / (ll_max * 1e9)
    bus = 2.0 * message_bytes if algorithm == "tree" else factor * message_bytes
    latency = option_latency_s(algorithm, protocol, kind, n, N, k, cluster, intra_hw)
    return latency + bus * max(cap, part / share)


def nccl_time(kind: str, message_bytes: float, links, cluster, factor: float, efficiency: tuple[float, float],
              least: bool = False) -> float:
    """(C5d) The time of NCCL's choice: the option of least time at the cluster's reference links (`least`: at
    `links` themselves, the lower envelope the bounds need), timed at `links`."""
    from formulation.physics.cost import GroupLinks

    intra_hw = _intra_hw(cluster)
    domains = crosses_domains(links, cluster)
    nics = min(links.per_node, CROSS_DOMAIN_RING_NICS) if domains else links.per_node  # inter_nics, once
    options = _options(kind, links.nodes, intra_hw, domains)
    if least:
        return min(option_time(a, p, kind, message_bytes, factor, links, cluster, efficiency, intra_hw, nics)
                   for a, p in options)
    intra, inter = reference_links(cluster, links)
    ref = GroupLinks(links.size, intra, inter, links.nodes, links.per_node)
    chosen = min(options, key=lambda o: option_time(*o, kind, message_bytes, factor, ref, cluster, efficiency,
                                                    intra_hw, nics))
    return option_time(*chosen, kind, message_bytes, factor, links, cluster, efficiency, intra_hw, nics)


def chosen_option(kind: str, message_bytes: float, links, cluster, factor: float,
                  efficiency: tuple[float, float]) -> tuple[str, str]:
    """(algorithm, protocol) NCCL's tuning model picks for this collective (for reports and tests)."""
    from formulation.physics.cost import GroupLinks

    intra_hw = _intra_hw(cluster)
    intra, inter = reference_links(cluster, links)
    ref = GroupLinks(links.size, intra, inter, links.nodes, links.per_node)
    a, p = min(_options(kind, links.nodes, intra_hw, crosses_domains(links, cluster)),
               key=lambda o: option_time(*o, kind, message_bytes, factor, ref, cluster, efficiency, intra_hw))
    return a, PROTOCOLS[p]


def latency_figure_us(collective: str, n: int, nodes: int, per_node: int, alpha_us: float, level: str,
                      intra_hw: str = "nvlink", intra_us: float | None = None) -> float:
    """The `level`'s latency figure (us, `intra_node_latency_us` / `inter_node_latency_us`) at which NCCL's model
    gives an nccl-tests log's collective (n ranks on `nodes` nodes, `per_node` each) its fitted zero-size time
    `alpha_us`, the intra-node figure at `intra_us` (default 5) when solving for the inter-node one: the least
    option's latency is increasing in the figure, so a bisection over its scale finds it
    (formulation/inputs/ingest/network.py)."""
    import types

    default_us = 1e6 * (DEFAULT_INTRA_LATENCY_S if level == "intra" else DEFAULT_INTER_LATENCY_S)

    def alpha_at(scale: float) -> float:
        figures = {"intra_latency_s": DEFAULT_INTRA_LATENCY_S if intra_us is None else intra_us * 1e-6,
                   "inter_latency_s": DEFAULT_INTER_LATENCY_S}
        figures[f"{level}_latency_s"] = default_us * 1e-6 * scale
        stub = types.SimpleNamespace(**figures)
        return 1e6 * min(option_latency_s(a, p, collective, n, nodes, per_node, stub, intra_hw)
                         for a, p in _options(collective, nodes, intra_hw))

    lo, hi = -10.0, 10.0  # log2 of the scale
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if alpha_at(2 ** mid) < alpha_us else (lo, mid)
    return default_us * 2 ** ((lo + hi) / 2)
