"""nccl-tests logs (`all_reduce_perf`, `all_gather_perf`, `reduce_scatter_perf`, `sendrecv_perf`) -> alpha-beta fits.

Why: links deliver what they deliver, not the data sheet (Pipette), and the planner's communication model is
alpha-beta per GPU in nccl-tests' bus-bandwidth sense (docs/model.md (C5), (C7)). A log therefore becomes one
`LinkFit`: time_us = latency_us + size * factor / (gb_per_s * 1e3), factor the collective's busbw factor
(all-reduce 2(n-1)/n, all-gather and reduce-scatter (n-1)/n, sendrecv 1), so that gb_per_s is the asymptotic
busbw. If the factor cannot be known (the log lists no ranks and none is given, or the collective cannot be
told) the fit uses factor 1, i.e. the algorithm bandwidth (`basis == "algbw"`): for all-reduce that under-states
the bus bandwidth (conservative), for all-gather and reduce-scatter it over-states it by n/(n-1).

The layout, read by its header line and never by column position:

    # nThread 1 nGpus 1 minBytes 8 maxBytes 8589934592 step: 2(factor) warmup iters: 5 iters: 20 ...
    # Using devices
    #  Rank  0 Group  0 Pid   6899 on node-a device  0 [0000:04:00] NVIDIA H100 80GB HBM3
    #                                              out-of-place                       in-place
    #       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw ...
    #        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s) ...
               8             2     float     sum      -1    20.62    0.00    0.00      0    19.84    0.00 ...
    # Out of bounds values : 0 OK
    # Avg bus bandwidth    : 123.456

Older builds print `#   Rank  0 Pid ...` (no Group), lack the `root` column (all-gather also `redop`) and
call the last column `error`; MPI launchers prefix lines with `[0] ` (Intel MPI -l), `[1,0]<stdout>:`
(Open MPI --tag-output) or `0: ` (srun -l). In-place cells may read N/A. NCCL INFO lines and other noise
between rows are skipped: a data row is a line whose first cell is an integer.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from formulation.physics.cost import COLLECTIVE_FACTOR, COLLECTIVE_STEPS
from formulation.errors import InputError
from formulation.inputs.ingest.common import read_text

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "sendrecv")
BUS_FACTOR = {**COLLECTIVE_FACTOR, "sendrecv": lambda n: 1.0}
RING_STEPS = {**COLLECTIVE_STEPS, "sendrecv": lambda n: 1}

_PREFIX = re.compile(r"^(?:\[\d+(?:,\d+)*\](?:<std(?:out|err)>)?:?\s?|\d+:\s)")
_RANK = re.compile(r"^\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device\s+\d+")
_NAME = re.compile(r"(all_?reduce|all_?gather|reduce_?scatter|send_?recv)", re.IGNORECASE)
_TEST_NAME = re.compile(r"\b(all_reduce|all_gather|reduce_scatter|sendrecv)_perf")

# Messages from max_size / BANDWIDTH_SPAN up measure bandwidth; the smallest quarter of sizes measure latency.
BANDWIDTH_SPAN = 16


@dataclass(frozen=True)
class NcclRow:
    """One message size: out-of-place and (None where the log says N/A) in-place figures."""

    size_bytes: int
    time_us: float
    algbw: float
    busbw: float
    in_place_time_us: float | None
    in_place_algbw: float | None
    in_place_busbw: float | None


@dataclass(frozen=True)
class NcclLog:
    file: str
    collective: str | None  # from the log's text (test banner, echoed command) or file name; None if neither says
    rows: tuple[NcclRow, ...]
    hosts: tuple[str, ...]  # host of every rank in rank order; empty when the log lists no ranks
    avg_busbw: float | None  # the `# Avg bus bandwidth` footer (over both column groups and all sizes)

    @property
    def n_ranks(self) -> int | None:
        return len(self.hosts) or None

    @property
    def n_nodes(self) -> int | None:
        return len(set(self.hosts)) or None


@dataclass(frozen=True)
class LinkFit:
    """Alpha-beta fit of one log: time_us = latency_us + bus_bytes / (gb_per_s * 1e3)."""

    latency_us: float  # whole operation at zero size (alpha)
    gb_per_s: float  # asymptotic bandwidth, in the sense of `basis`
    n_ranks: int | None
    source: str
    collective: str | None = None
    basis: str = "busbw"  # "busbw" (bus factor known) or "algbw" (factor unknown: fitted on size / time)


def collective_from_name(file_name: str) -> str | None:
    """`all_reduce_perf.log`, `allreduce-2node.txt`, `sendrecv_a_b.log` ... -> the collective."""
    match = _NAME.search(file_name)
    if match is None:
        return None
    key = match.group(1).lower().replace("_", "")
    return {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
            "sendrecv": "sendrecv"}[key]


def _number(cell: str, file: str, line: int, column: str, *, allow_na: bool) -> float | None:
    if allow_na and cell.upper() == "N/A":
        return None
    try:
        value = float(cell)
    except ValueError:
        value = math.nan
    if math.isnan(value):
        raise InputError(file, f"line {line}", f"{column} {cell!r} is not a number")
    if math.isinf(value) or value < 0 or (column.endswith("time") and value <= 0):
        raise InputError(file, f"line {line}", f"{column} {cell!r} is not a valid measurement")
    return value


def _columns(tokens: list[str], file: str, line: int) -> dict[str, int]:
    """Header tokens -> index of size and of the out-of-place / in-place time, algbw, busbw cells."""
    index: dict[str, int] = {"size": 0}
    for name in ("time", "algbw", "busbw"):
        spots = [i for i, token in enumerate(tokens) if token == name]
        if not spots:
            raise InputError(file, f"line {line}", f"table header has no {name!r} column")
        index[name] = spots[0]
        if len(spots) > 1:
            index[f"in_place_{name}"] = spots[1]
    return index


def _row(tokens: list[str], cols: dict[str, int], file: str, line: int) -> NcclRow:
    size = int(tokens[0])
    values = {}
    for name, at in cols.items():
        if name != "size":
            in_place = name.startswith("in_place_")
            label = f"in-place {name[9:]}" if in_place else f"out-of-place {name}"
            values[name] = _number(tokens[at], file, line, label, allow_na=in_place)
    return NcclRow(size_bytes=size, time_us=values["time"], algbw=values["algbw"], busbw=values["busbw"],
                   in_place_time_us=values.get("in_place_time"), in_place_algbw=values.get("in_place_algbw"),
                   in_place_busbw=values.get("in_place_busbw"))


def parse_nccl_log(path: str | Path, text: str | None = None) -> NcclLog:
    """Read an nccl-tests log (see module docstring). Raises `InputError(file, "line N" | "<root>", problem)`."""
    file = str(path)
    text = read_text(path) if text is None else text
    cols: dict[str, int] | None = None
    width = header_line = 0
    ranks: dict[int, str] = {}
    rows: list[NcclRow] = []
    avg = None
    for no, raw in enumerate(text.splitlines(), start=1):
        line = _PREFIX.sub("", raw, count=1)
        body = line.strip()
        if body.startswith("#"):
            tokens = body[1:].split()
            rank = _RANK.match(body[1:])
            if rank:
                ranks[int(rank.group(1))] = rank.group(2)
            elif tokens[:1] == ["size"] and "time" in tokens:
                if cols is not None:
                    raise InputError(file, f"line {no}", f"a second table header (the first is on line {header_line}); "
                                                         "give one nccl-tests run per file")
                cols, width, header_line = _columns(tokens, file, no), len(tokens), no
            elif body[1:].strip().startswith("Avg bus bandwidth"):
                avg = _number(body.partition(":")[2].strip(), file, no, "Avg bus bandwidth", allow_na=False)
            continue
        tokens = body.split()
        if cols is None or not tokens or not tokens[0].isdigit():
            continue  # noise: NCCL INFO lines, launcher messages, text before the table
        if len(tokens) != width:
            hint = ": the table is truncated" if len(tokens) < width else ""
            raise InputError(file, f"line {no}", f"expected {width} cells as in the header (line {header_line}), "
                                                 f"got {len(tokens)}{hint}")
        rows.append(_row(tokens, cols, file, no))
    if cols is None:
        raise InputError(file, "<root>", "no nccl-tests table header (a '#  size  count  type ... time  algbw  busbw' "
                                         "line) found")
    if not rows:
        raise InputError(file, "<root>", f"the table (header on line {header_line}) has no data rows")
    if ranks and sorted(ranks) != list(range(len(ranks))):
        missing = sorted(set(range(max(ranks) + 1)) - set(ranks))
        raise InputError(file, "<root>", f"the '# Rank' lines skip rank {missing[0]}: truncated device list")
    # What ran: newer builds print "# Collective test starting: all_reduce_perf", wrappers echo the command;
    # otherwise the file's name.
    named = _TEST_NAME.search(text)
    collective = named.group(1) if named else collective_from_name(Path(file).name)
    return NcclLog(file=file, collective=collective, rows=tuple(rows), hosts=tuple(ranks[r] for r in sorted(ranks)),
                   avg_busbw=avg)


def fit_nccl_log(log: NcclLog, *, collective: str | None = None, n_ranks: int | None = None) -> LinkFit:
    """Alpha-beta fit (module docstring). Both column groups are samples of the same link.

    Bandwidth: least squares of time against bus bytes over the messages of at least max_size / 16 (the
    largest, bandwidth-bound ones; at least two sizes). Latency: with that slope fixed, the least-squares
    intercept over the smallest quarter of the sizes (latency-bound), i.e. their mean of time - bytes / bw.
    """
    collective = collective or log.collective
    n = n_ranks or log.n_ranks
    if n is not None and n < 2:
        raise InputError(log.file, "<root>", f"a run of {n} rank measures no link")
    known = collective is not None and n is not None
    factor = BUS_FACTOR[collective](n) if known else 1.0
    sizes = np.array([r.size_bytes for r in log.rows] + [r.size_bytes for r in log.rows if r.in_place_time_us])
    times = np.array([r.time_us for r in log.rows] + [r.in_place_time_us for r in log.rows if r.in_place_time_us])
    distinct = np.unique(sizes)
    if len(distinct) < 2:
        raise InputError(log.file, "<root>", "a fit needs at least two message sizes (run with -b 8 -e 8G -f 2)")
    cut = min(distinct.max() / BANDWIDTH_SPAN, distinct[-2])
    big = sizes >= cut
    slope, _ = np.polyfit(sizes[big] * factor, times[big], 1)
    if slope <= 0:
        raise InputError(log.file, "<root>", "time does not grow with message size in the largest messages: "
                                             "no bandwidth can be fitted")
    small = sizes <= distinct[max(0, len(distinct) // 4 - 1)]
    latency = float(np.mean(times[small] - sizes[small] * factor * slope))
    if latency <= 0:
        raise InputError(log.file, "<root>", f"the smallest message ({distinct[0]} B) is bandwidth-bound: no latency "
                                             "can be fitted (run with -b 8)")
    return LinkFit(latency_us=latency, gb_per_s=float(1.0 / slope / 1e3), n_ranks=n, source=log.file,
                   collective=collective, basis="busbw" if known else "algbw")


def sendrecv_bandwidth(path: str | Path) -> float:
    """Large-message bandwidth (GB/s) of one `sendrecv_perf` run between two nodes.

    sendrecv's busbw equals its algbw (factor 1), and per rank it is the slowest hop of the send ring, so a
    run with one or several GPUs per node measures the per-GPU (per-NIC) bandwidth between the two nodes.
    """
    log = parse_nccl_log(path)
    if log.collective not in (None, "sendrecv"):
        raise InputError(log.file, "<root>", f"expected a sendrecv_perf log, this one looks like {log.collective}_perf")
    if log.n_nodes is not None and log.n_nodes != 2:
        raise InputError(log.file, "<root>", f"expected ranks on two hosts, the log lists {log.n_nodes} "
                                             f"({', '.join(sorted(set(log.hosts)))})")
    return fit_nccl_log(log, collective="sendrecv").gb_per_s


def sendrecv_pair_bandwidths(logs: dict[tuple[str, str], str | Path]) -> dict[tuple[str, str], float]:
    """{(node_a, node_b): sendrecv_perf log} -> {(node_a, node_b): GB/s}: the measured node-pair matrix entries."""
    return {pair: sendrecv_bandwidth(path) for pair, path in logs.items()}
