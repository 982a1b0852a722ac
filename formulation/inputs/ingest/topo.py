"""`nvidia-smi topo -m` output -> the intra-node GPU-pair bandwidth matrix (GB/s).

Why: inside a node not every GPU pair is equal (PCIe boxes with NVLink bridge pairs, GPUs on two sockets),
and the planner should put tensor parallelism on the fast pairs. The topology names each pair's link class;
a per-generation table turns classes into bandwidth, one direction, in nccl-tests' busbw sense:

    class   meaning (nvidia-smi legend)                                  v100   a100   h100/h200  b200
    NV#     a bonded set of # NVLinks: # x per-link bandwidth            25/link (NVLink2, 3, 4)   50/link (NVLink5)
    PIX     at most one PCIe bridge                                       12     24     48        48
    PXB     several PCIe bridges, no host bridge                          12     24     48        48
    PHB     a PCIe host bridge (the CPU)                                  10     20     40        40
    NODE    between host bridges of one NUMA node                          9     18     36        36
    SYS     across the SMP interconnect (QPI/UPI, xGMI); also old `SOC`    6     12     20        20

Sources and assumptions: NVLink per-link figures are NVIDIA's data-sheet rates per direction (NVLink2/3/4: 25 GB/s,
so A100 NV12 = 300 and H100 NV18 = 450; NVLink5: 50, B200 NV18 = 900). PCIe figures are achievable
peer-to-peer rates, below the x16 link's nominal 16 (gen3), 32 (gen4) and 64 (gen5) GB/s: PCIe gen4 peer
copies through one switch reach about 24 GB/s, through the host bridge about 20, between host bridges about 18,
and across sockets about 12 (the SMP link and its P2P forwarding are the bottleneck). Gen5 (H100, B200) doubles
the switch and host-bridge figures; the cross-socket figure grows less (20), as UPI does not double. These are
planning defaults, not measurements: a `table` of overrides (`{"NV": 22, "NV18": 400, "SYS": 10}`; `NV` is per
link, `NV<k>` a whole bonded set) replaces any of them, and measured GPU pairs (`gpu_pairs`) still win.

Layout (tab-separated, header possibly underlined with ANSI codes; NIC columns are `NIC0..` with a NIC legend
in newer drivers, `mlx5_0..` in older ones; NIC rows, affinity columns and the legend are ignored):

            GPU0    GPU1    ...     NIC0    CPU Affinity    NUMA Affinity   GPU NUMA ID
    GPU0     X      NV18    ...     PIX     0-55,112-167    0               N/A
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from formulation.errors import InputError
from formulation.inputs.ingest.common import read_text

PCIE_CLASSES = ("PIX", "PXB", "PHB", "NODE", "SYS")
_GEN4 = {"PIX": 24.0, "PXB": 24.0, "PHB": 20.0, "NODE": 18.0, "SYS": 12.0}
_GEN5 = {"PIX": 48.0, "PXB": 48.0, "PHB": 40.0, "NODE": 36.0, "SYS": 20.0}
GENERATIONS: dict[str, dict[str, float]] = {
    "v100": {"NV": 25.0, "PIX": 12.0, "PXB": 12.0, "PHB": 10.0, "NODE": 9.0, "SYS": 6.0},
    "a100": {"NV": 25.0, **_GEN4},
    "h100": {"NV": 25.0, **_GEN5},
    "h200": {"NV": 25.0, **_GEN5},
    "b200": {"NV": 50.0, **_GEN5},
}

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_GPU = re.compile(r"GPU(\d+)")
_NVLINK = re.compile(r"NV(\d+)")
_NOT_DEVICE = {"CPU", "NUMA", "GPU", "Affinity", "ID"}


def is_link_class(cell: str) -> bool:
    return cell in PCIE_CLASSES or cell == "SOC" or bool(_NVLINK.fullmatch(cell))


def is_table_key(key: str) -> bool:
    """Keys a user table may override: `NV` (per link), `NV<k>` (a bonded set), or a PCIe class."""
    return key == "NV" or key in PCIE_CLASSES or bool(_NVLINK.fullmatch(key))


@dataclass(frozen=True)
class Topology:
    file: str
    classes: tuple[tuple[str, ...], ...]  # g x g link classes between GPUs, "X" on the diagonal
    nics: tuple[str, ...]  # NIC column names (NIC0.. or mlx5_0..)

    @property
    def num_gpus(self) -> int:
        return len(self.classes)


def parse_topology(path: str | Path, text: str | None = None) -> Topology:
    """Read `nvidia-smi topo -m` output. Raises `InputError(file, "line N" | "<root>", problem)`."""
    file = str(path)
    text = read_text(path) if text is None else text
    columns: list[str] | None = None
    header_line = 0
    rows: dict[int, tuple[int, list[str]]] = {}
    for no, raw in enumerate(text.splitlines(), start=1):
        tokens = _ANSI.sub("", raw).split()
        if not tokens:
            continue
        if columns is None:
            if tokens[0] == "GPU0" and (len(tokens) == 1 or tokens[1] != "X"):
                columns, header_line = [], no
                for token in tokens:
                    if token in _NOT_DEVICE:
                        break
                    columns.append(token)
            continue
        if tokens[0].rstrip(":") == "Legend":
            break
        match = _GPU.fullmatch(tokens[0])
        if match is None:
            continue  # NIC rows
        if len(tokens) - 1 < len(columns):
            raise InputError(file, f"line {no}", f"{tokens[0]} has {len(tokens) - 1} cells, the header (line "
                                                 f"{header_line}) has {len(columns)} device columns")
        cells = tokens[1:1 + len(columns)]
        for column, cell in zip(columns, cells):
            if cell != "X" and not is_link_class(cell):
                raise InputError(file, f"line {no}", f"{tokens[0]} / {column}: {cell!r} is not a link class (X, NV#, "
                                                     f"{', '.join(PCIE_CLASSES)}): a missing or shifted column?")
        rows[int(match.group(1))] = (no, cells)
    if columns is None:
        raise InputError(file, "<root>", "no topology header (a line of GPU0 GPU1 ... columns) found")
    g = sum(1 for c in columns if _GPU.fullmatch(c))
    if columns[:g] != [f"GPU{i}" for i in range(g)]:
        raise InputError(file, f"line {header_line}", f"expected the columns to start GPU0 .. GPU{g - 1}, got "
                                                      f"{' '.join(columns[:g])}")
    if sorted(rows) != list(range(g)):
        missing = sorted(set(range(g)) - set(rows)) or sorted(set(rows) - set(range(g)))
        raise InputError(file, "<root>", f"the matrix has {g} GPU columns but the row of GPU{missing[0]} is "
                                         f"{'missing' if missing[0] < g else 'extra'}")
    classes = tuple(tuple(rows[i][1][:g]) for i in range(g))
    for i in range(g):
        for j in range(g):
            if (classes[i][j] == "X") != (i == j):
                expected = "X" if i == j else "a link class"
                raise InputError(file, f"line {rows[i][0]}", f"GPU{i} / GPU{j}: expected {expected}, got "
                                                            f"{classes[i][j]!r}")
            if classes[i][j] != classes[j][i]:
                raise InputError(file, f"line {rows[i][0]}", f"GPU{i} / GPU{j} is {classes[i][j]} but GPU{j} / "
                                                            f"GPU{i} is {classes[j][i]}: the matrix is not symmetric")
    return Topology(file=file, classes=classes, nics=tuple(columns[g:]))


def bandwidth_table(generation: str, overrides: dict[str, float] | None = None) -> dict[str, float]:
    """The generation's table (module docstring) with a user's overrides applied (keys: see `is_table_key`)."""
    return {**GENERATIONS[generation], **(overrides or {})}


def link_bandwidth(cell: str, table: dict[str, float]) -> float:
    """GB/s of one link class: an exact entry (`NV12`, `PIX`) first, else # x the per-link `NV` rate."""
    cell = "SYS" if cell == "SOC" else cell
    if cell in table:
        return table[cell]
    return int(_NVLINK.fullmatch(cell).group(1)) * table["NV"]


def gpu_bandwidth_matrix(topology: Topology, generation: str, overrides: dict[str, float] | None = None) -> np.ndarray:
    """g x g GB/s between the GPUs of the node (diagonal 0: a GPU does not talk to itself over a link)."""
    table = bandwidth_table(generation, overrides)
    g = topology.num_gpus
    out = np.zeros((g, g))
    for i in range(g):
        for j in range(g):
            if i != j:
                out[i, j] = link_bandwidth(topology.classes[i][j], table)
    return out
