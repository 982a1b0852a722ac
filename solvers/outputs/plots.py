"""Pictures of a plan (PNG, matplotlib's Agg canvas, no global pyplot state): the pipeline schedule as a Gantt
chart, memory per stage, and the cluster as a node x GPU grid with its inter-node bandwidth matrix."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from solvers.outputs.files import save_figure_atomic
from solvers.outputs.schedule import Schedule, simulate_schedule

FORWARD, BACKWARD, P2P, CRITICAL = "#4C72B0", "#DD8452", "#8172B3", "#C44E52"
WEIGHT = "#55A868"  # zero-bubble schedules' deferred weight-gradient ops
KIND_COLOR = {"F": FORWARD, "B": BACKWARD, "W": WEIGHT}
STEADY = "#8E9AAF"  # forwards and backwards alternating (1F1B), in the aggregated whole-iteration panel


# ---- writing PNGs ------------------------------------------------------------------------------------------

def _figure(width: float, height: float):
    from matplotlib.figure import Figure
    return Figure(figsize=(width, height), dpi=110, layout="constrained")


def _shade(color: str, chunk: int, vpp: int):
    """Lighter shades for earlier model chunks, so interleaving is visible."""
    from matplotlib.colors import to_rgb
    rgb = np.array(to_rgb(color))
    mix = 0.45 * (vpp - 1 - chunk) / max(vpp - 1, 1)
    return tuple(rgb + (1 - rgb) * mix)


def _draw_schedule(ax, sched: Schedule, pp: int, vpp: int, window: tuple[float, float], label: bool) -> None:
    from matplotlib.collections import PolyCollection
    lo, hi = window
    visible = [o for o in sched.ops if o.end >= lo and o.start <= hi]
    boxes, colors, edges = [], [], []
    for o in visible:
        y = o.stage
        boxes.append([(o.start, y - 0.32), (o.end, y - 0.32), (o.end, y + 0.32), (o.start, y + 0.32)])
        colors.append(_shade(KIND_COLOR[o.kind], o.chunk, vpp))
        edges.append("black" if (o.critical and label) else "none")
        if o.comm:
            a, b = o.comm
            boxes.append([(a, y + 0.36), (b, y + 0.36), (b, y + 0.48), (a, y + 0.48)])
            colors.append(P2P)
            edges.append("none")
    ax.add_collection(PolyCollection(boxes, facecolors=colors, edgecolors=edges, linewidths=0.9))
    # the critical path as a red line through the ops it runs through (below their labels), jumping rows where
    # it follows a p2p send to another stage
    xs, ys, prev = [], [], None
    for o in sched.critical_path:
        if prev is not None and prev.stage != o.stage:  # the path followed a send from prev's stage
            arrive = o.comm[1] if o.comm else prev.end
            xs += [arrive, arrive]
            ys += [prev.stage + 0.18, o.stage + 0.18]
        xs += [o.start, o.end]
        ys += [o.stage + 0.18, o.stage + 0.18]
        prev = o
    ax.plot(xs, ys, color=CRITICAL, linewidth=1.4 if label else 1.0, zorder=3)
    if label:
        width_px = ax.get_position().width * ax.figure.get_figwidth() * ax.figure.dpi
        for o in visible:
            text = str(o.micro_batch) if vpp == 1 else f"{o.micro_batch}.{o.chunk}"
            if (o.end - o.start) / (hi - lo) * width_px > 4 + 4 * len(text):  # room for the label
                r, g, b = _shade(KIND_COLOR[o.kind], o.chunk, vpp)
                ax.text((o.start + o.end) / 2, o.stage - 0.08, text, ha="center", va="center", fontsize=6.5,
                        color="white" if 0.299 * r + 0.587 * g + 0.114 * b < 0.5 else "black", clip_on=True)
    ax.set_xlim(lo, hi)
    ax.set_ylim(pp - 0.5, -0.6)
    ax.set_yticks(range(pp), [f"stage {i}" for i in range(pp)])


def _draw_busy_bands(ax, sched: Schedule, pp: int) -> None:
    """The whole iteration when single ops would be a barcode: per stage its warm-up (forwards only), steady
    1F1B and cool-down (backwards only) phases as bands, idle gaps longer than 0.2 % of the iteration cut out
    in white, and the stage's busy share at the right."""
    from matplotlib.collections import PolyCollection
    boxes, colors = [], []
    for stage in range(pp):
        ops = sorted((o for o in sched.ops if o.stage == stage), key=lambda o: o.start)
        first_b = min(o.start for o in ops if o.kind == "B")
        last_f = max(o.end for o in ops if o.kind == "F")
        phases = [(ops[0].start, first_b, FORWARD), (first_b, last_f, STEADY), (last_f, ops[-1].end, BACKWARD)]
        for a, b, color in phases:
            boxes.append([(a, stage - 0.32), (b, stage - 0.32), (b, stage + 0.32), (a, stage + 0.32)])
            colors.append(color)
        busy = sum(o.end - o.start for o in ops)
        for prev, nxt in zip(ops, ops[1:]):
            if nxt.start - prev.end > 0.002 * sched.makespan_s:
                a, b = prev.end, nxt.start
                boxes.append([(a, stage - 0.33), (b, stage - 0.33), (b, stage + 0.33), (a, stage + 0.33)])
                colors.append("white")
        ax.text(1.002, stage, f"busy {100 * busy / sched.makespan_s:.1f} %", transform=ax.get_yaxis_transform(),
                va="center", fontsize=8)
    ax.add_collection(PolyCollection(boxes, facecolors=colors, edgecolors="none"))
    ax.set_xlim(0, sched.makespan_s)
    ax.set_ylim(pp - 0.5, -0.6)
    ax.set_yticks(range(pp), [f"stage {i}" for i in range(pp)])


def schedule_gantt(instance, placement, estimate, path) -> Path:
    """One iteration of the 1F1B (or interleaved) schedule: stages as rows, forward/backward/p2p coloured, the
    critical path as a red line (ops on it outlined in the zoomed panels)."""
    from matplotlib.patches import Patch
    from matplotlib.lines import Line2D
    p, e = placement, estimate
    sched = simulate_schedule(instance, p, e)
    b = e.breakdown
    predicted = b["compute_s"] + b["bubble_s"] + b["tp_comm_s"] + b["cp_comm_s"] + b["pp_comm_s"]
    per_row = len(sched.ops) / p.pp
    zoom = per_row > 80
    fig = _figure(15, 3.2 + 0.45 * p.pp + (0.45 * p.pp + 2.0 if zoom else 0))
    grid = fig.add_gridspec(2 if zoom else 1, 2, height_ratios=[1, 1.3] if zoom else [1])
    overview = fig.add_subplot(grid[0, :])
    if zoom:  # single ops would be a barcode: phases and idle gaps per stage, the ops in the zoomed panels
        _draw_busy_bands(overview, sched, p.pp)
    else:
        _draw_schedule(overview, sched, p.pp, p.vpp, (0, sched.makespan_s), label=True)
    overview.set_xlabel("time [s]")
    name = f"interleaved 1F1B, vpp={p.vpp}" if p.vpp > 1 else "1F1B"
    if p.schedule != "1f1b":
        name = f"{p.schedule_name}" + (f", vpp={p.vpp}" if p.vpp > 1 else "")
    overview.set_title(f"{instance.name}: one iteration, {name}, {e.num_micro_batches} micro-batches, "
                       f"{p.sizes()}\nsimulated pipeline {sched.makespan_s:.3f} s vs "
                       f"estimate {predicted:.3f} s (compute + bubble + tp/cp + pp); afterwards exposed dp sync "
                       f"{b['dp_comm_s']:.3f} s and optimizer {b['optimizer_s']:.3f} s (not drawn)", fontsize=10)
    if zoom:
        unit = max(s.time_per_micro_batch_s for s in e.stages) / p.vpp
        span = min(sched.makespan_s / 2, max(p.pp * p.vpp, 2 * p.pp) * unit * 0.6)
        for col, (lo, hi, title) in enumerate([(0, span, "warm-up"),
                                               (sched.makespan_s - span, sched.makespan_s, "cool-down")]):
            ax = fig.add_subplot(grid[1, col])
            _draw_schedule(ax, sched, p.pp, p.vpp, (lo, hi), label=True)
            ax.set_title(f"{title}: {lo:.2f}-{hi:.2f} s (labels: micro-batch"
                         + (".chunk)" if p.vpp > 1 else ")"), fontsize=9)
            ax.set_xlabel("time [s]")
            for a in (lo, hi):
                overview.axvline(a, color="grey", linewidth=0.6, linestyle=":")
    handles = [Patch(color=FORWARD, label="forward"), Patch(color=BACKWARD, label="backward"),
               Patch(color=P2P, label="p2p send into the stage"),
               Line2D([], [], color=CRITICAL, label="critical path")]
    if p.schedule != "1f1b":
        handles[1] = Patch(color=BACKWARD, label="backward (input gradient)")
        handles.insert(2, Patch(color=WEIGHT, label="weight gradient (deferred)"))
    if p.vpp > 1:
        handles.append(Patch(color=_shade(FORWARD, 0, p.vpp), label="lighter = earlier model chunk"))
    if zoom:
        handles.append(Patch(color=STEADY, label="steady 1F1B (top: whole iteration; white: idle)"))
    fig.legend(handles=handles, loc="outside lower center", ncol=len(handles), fontsize=8, frameon=False)
    return save_figure_atomic(fig, path)


def _close_values(values: list[float], within: float = 3.0) -> list[list[float]]:
    """Sorted values in groups whose neighbours are less than `within` apart."""
    groups: list[list[float]] = []
    for v in values:
        if groups and v - groups[-1][-1] < within:
            groups[-1].append(v)
        else:
            groups.append([v])
    return groups


def memory_bars(instance, placement, estimate, path) -> Path:
    """Memory per GPU of every stage, stacked by component, against the planner's limit and the capacity."""
    parts = [("weights_gib", "weights", "#4C72B0"), ("gradients_gib", "gradients", "#55A868"),
             ("optimizer_gib", "optimizer state", "#8172B3"), ("activations_gib", "activations", "#DD8452"),
             ("buffers_gib", "buffers", "#937860"), ("overhead_gib", "overhead (runtime, fragmentation)", "#8C8C8C")]
    stages = estimate.stages
    fig = _figure(max(8.5, 3.2 + 0.55 * len(stages)), 4.8)
    ax = fig.add_subplot()
    x = np.arange(len(stages))
    bottom = np.zeros(len(stages))
    for key, label, color in parts:
        values = np.array([getattr(s.memory, key) for s in stages])
        ax.bar(x, values, bottom=bottom, color=color, label=label, width=0.7)
        bottom += values
    limits = {(s.memory.limit_gib, s.memory.capacity_gib) for s in stages}
    for values, color, style, name in ((sorted({lim for lim, _ in limits}), CRITICAL, "--", "limit"),
                                       (sorted({cap for _, cap in limits}), "black", "-", "capacity")):
        for group in _close_values(values):  # GPU types a few GiB apart share one label, not two overprinted
            for v in group:
                ax.axhline(v, color=color, linestyle=style, linewidth=1.2)
            ax.text(len(stages) - 0.5, max(group), f" {name} {' / '.join(f'{v:.1f}' for v in group)} GiB",
                    va="bottom", ha="right", color=color, fontsize=8)
    if len(stages) <= 24:
        for i, s in enumerate(stages):
            ax.text(i, s.memory.total_gib, f"{s.memory.total_gib:.1f}", ha="center", va="bottom", fontsize=8,
                    color="black" if s.memory.fits else CRITICAL, fontweight="normal" if s.memory.fits else "bold")
    ax.set_xticks(x, [f"{s.stage}\n{s.layers} layers" for s in stages] if len(stages) <= 16
                  else [str(s.stage) for s in stages], fontsize=8)
    ax.set_xlabel("pipeline stage")
    ax.set_ylabel("memory per GPU [GiB]")
    ax.set_ylim(0, max(max(c for _, c in limits), bottom.max()) * 1.12)
    p = placement
    ax.set_title(f"{instance.name}: memory per GPU by stage\n({p.sizes()}, "
                 f"mbs={p.micro_batch_size}, recompute={p.recompute_text}, zero={p.zero_stage}); "
                 f"{'fits' if estimate.fits else 'DOES NOT FIT'}", fontsize=9)
    handles, labels = ax.get_legend_handles_labels()  # top component first, as stacked
    ax.legend(handles[::-1], labels[::-1], loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8, frameon=False)
    return save_figure_atomic(fig, path)


# ---- cluster picture ---------------------------------------------------------------------------------------

SLOW = 0.75  # a link below 75% of what its peers deliver is marked slow


def slow_links(cluster) -> tuple[list[int], list[tuple[int, int, float, float]], dict[int, set[int]]]:
    """(nodes with a slow NIC, slow node pairs (a, b, GB/s, expected GB/s), node -> local GPUs on slow pairs).

    A node's NIC is slow when its best inter-node link is below 75% of the median node's best link. The other
    nodes fall into islands (connected by links at >= 75% of that reference, e.g. leaf switches); a pair is slow
    when it is below 75% of the median pair between the same two islands (so an oversubscribed spine is the
    islands' normal, and a congested pair inside it stands out). Intra-node pairs are compared with the
    median intra-node pair of the nodes of the same GPU type.
    """
    import networkx as nx
    n = len(cluster.nodes)
    bw = np.minimum(cluster.inter_gb_per_s, cluster.inter_gb_per_s.T).astype(float)
    np.fill_diagonal(bw, np.nan)
    slow_nic, pairs = [], []
    if n > 1:
        best = np.nanmax(bw, axis=1)
        reference = float(np.median(best))
        # a node is compared with nodes of its own GPU type: another purchase's older NICs are not a fault
        types = [node.gpu_type for node in cluster.nodes]
        peers = {t: float(np.median([best[i] for i in range(n) if types[i] == t])) for t in set(types)}
        slow_nic = [i for i in range(n) if best[i] < SLOW * peers[types[i]]]
        graph = nx.Graph()
        graph.add_nodes_from(range(n))
        graph.add_edges_from((a, b) for a in range(n) for b in range(a + 1, n) if bw[a, b] >= SLOW * reference)
        island = {v: k for k, comp in enumerate(nx.connected_components(graph)) for v in comp}
        typical = {}
        for a in range(n):
            for b in range(a + 1, n):
                if a not in slow_nic and b not in slow_nic:
                    typical.setdefault(tuple(sorted((island[a], island[b]))), []).append(bw[a, b])
        for a in range(n):
            for b in range(a + 1, n):
                if a in slow_nic or b in slow_nic:
                    continue
                expected = float(np.median(typical[tuple(sorted((island[a], island[b])))]))
                if bw[a, b] < SLOW * expected:
                    pairs.append((a, b, float(bw[a, b]), expected))
    slow_gpus: dict[int, set[int]] = {}
    for gpu_type in {node.gpu_type for node in cluster.nodes}:  # NVLink generations differ by type
        mine = [k for k, node in enumerate(cluster.nodes) if node.gpu_type == gpu_type]
        intra = [cluster.intra_gb_per_s[k][~np.eye(len(cluster.intra_gb_per_s[k]), dtype=bool)] for k in mine
                 if len(cluster.intra_gb_per_s[k]) > 1]
        if not intra:
            continue
        nominal = float(np.median(np.concatenate(intra)))
        for node in mine:
            m = cluster.intra_gb_per_s[node]
            a, b = np.where((m < SLOW * nominal) & ~np.eye(len(m), dtype=bool))
            if len(a):
                slow_gpus.setdefault(node, set()).update(int(g) for g in np.concatenate([a, b]))
    for (ga, gb), value in cluster.gpu_pair_gb_per_s.items():  # measured cross-node GPU pairs
        na, nb = cluster.gpu_node[ga], cluster.gpu_node[gb]
        if value < SLOW * cluster.inter_gb_per_s[na, nb]:
            for g in (ga, gb):
                slow_gpus.setdefault(int(cluster.gpu_node[g]), set()).add(int(cluster.gpu_local[g]))
    return slow_nic, pairs, slow_gpus


def _node_pair_panel(fig, bx, cluster, pairs) -> None:
    """The inter-node bandwidth matrix beside the GPU map, slow node pairs outlined in cyan."""
    from matplotlib.patches import Rectangle
    n = len(cluster.nodes)
    matrix = cluster.inter_gb_per_s.astype(float).copy()
    np.fill_diagonal(matrix, np.nan)
    image = bx.imshow(matrix, cmap="magma", aspect="auto")
    fig.colorbar(image, ax=bx, label="inter-node GB/s per GPU", shrink=0.8)
    for a, b, value, expected in pairs:
        for r, c in ((a, b), (b, a)):
            bx.add_patch(Rectangle((c - 0.5, r - 0.5), 1, 1, fill=False, edgecolor="cyan", linewidth=1.8))
    bx.set_yticks(range(n), [""] * n)
    step = max(1, -(-n // 48))  # every node up to 48, else every step-th: the labels stay legible
    bx.set_xticks(range(0, n, step), [cluster.nodes[i].name for i in range(0, n, step)], rotation=90,
                  fontsize=7 if n <= 24 else 5)
    bx.set_xlabel("node" + (f" (every {step}th labelled)" if step > 1 else ""), fontsize=8)
    notes = [f"{cluster.nodes[a].name}-{cluster.nodes[b].name} {value:.0f} vs {expected:.0f}" for a, b, value, expected
             in pairs[:6]]
    bx.set_title("node-pair bandwidth; cyan = slow pair" + ("\n" + ", ".join(notes) if notes else ""), fontsize=8)


def cluster_grid(instance, placement, path) -> Path:
    """Nodes x GPUs coloured by pipeline stage (text: data-parallel/context/tensor coordinate), next to the
    inter-node bandwidth matrix; slow NICs, slow node pairs and slow intra-node pairs are marked."""
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch, Rectangle
    cluster, p = instance.cluster, placement
    n, width = len(cluster.nodes), max(node.num_gpus for node in cluster.nodes)
    stage = np.full((n, width), np.nan)
    text = {}
    for rank, gpu in enumerate(p.gpus):
        t, c = rank % p.tp, (rank // p.tp) % p.cp
        d, s = (rank // (p.tp * p.cp)) % p.dp, rank // (p.tp * p.cp * p.dp)
        node, local = int(cluster.gpu_node[gpu]), int(cluster.gpu_local[gpu])
        stage[node, local] = s
        text[(node, local)] = f"d{d}" + (f" c{c}" if p.cp > 1 else "") + (f"\nt{t}" if p.tp > 1 else "")
    slow_nic, pairs, slow_gpus = slow_links(cluster)
    height = min(40.0, 2.2 + 0.42 * n)
    fig = _figure(4.0 + 0.8 * width + 0.42 * min(n, 24), height)
    grid = fig.add_gridspec(1, 2, width_ratios=[0.8 * width, 0.42 * min(n, 24) + 1.0])
    ax, bx = fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1])
    from matplotlib import colormaps
    if p.pp == 1:
        colors = [(0.75, 0.75, 0.75)]
    else:  # categorical colours lightened so the black coordinates stay readable
        cm = colormaps["tab10" if p.pp <= 10 else "tab20" if p.pp <= 20 else "viridis"]
        colors = [tuple(0.62 * np.array(cm(i if p.pp <= 20 else i / (p.pp - 1))[:3]) + 0.38) for i in range(p.pp)]
    cmap = ListedColormap(colors).with_extremes(bad="#EEEEEE")
    ax.imshow(np.ma.masked_invalid(stage), cmap=cmap, vmin=-0.5, vmax=p.pp - 0.5, aspect="auto")
    if n * width <= 600:
        for (node, local), label in text.items():
            ax.text(local, node, label, ha="center", va="center", fontsize=7.5)
    for node, locals_ in slow_gpus.items():
        for local in locals_:
            ax.add_patch(Rectangle((local - 0.5, node - 0.5), 1, 1, fill=False, hatch="///", edgecolor=CRITICAL))
    ax.set_xticks(range(width), [f"gpu{g}" for g in range(width)], fontsize=8)
    labels = [node.name + (" (slow NIC)" if i in slow_nic else "") for i, node in enumerate(cluster.nodes)]
    ax.set_yticks(range(n), labels, fontsize=8 if n <= 40 else 5)
    for i in slow_nic:
        ax.get_yticklabels()[i].set_color(CRITICAL)
        ax.add_patch(Rectangle((-0.45, i - 0.45), width - 0.1, 0.9, fill=False, edgecolor=CRITICAL, linewidth=2.5))
    ax.set_title("GPU map: colour = pipeline stage\nd = data-parallel replica" + (", c = context rank" if p.cp > 1
                 else "") + (", t = tensor rank" if p.tp > 1 else ""), fontsize=9)
    handles = [Patch(color=colors[s], label=f"stage {s} ({p.layers_per_stage[s]} layers)") for s in range(p.pp)]
    if np.isnan(stage).any():
        handles.append(Patch(color="#EEEEEE", label="idle"))
    if slow_gpus:
        handles.append(Patch(facecolor="white", edgecolor=CRITICAL, hatch="///", label="on a slow GPU pair"))
    if slow_nic:
        handles.append(Patch(facecolor="white", edgecolor=CRITICAL, linewidth=2, label="node with a slow NIC"))
    fig.legend(handles=handles[:24], loc="outside lower center", ncol=min(6, len(handles)), fontsize=8,
               frameon=False)
    _node_pair_panel(fig, bx, cluster, pairs)
    fig.suptitle(f"{instance.name}: {p.world_size} of {cluster.num_gpus} GPUs, {p.sizes()}; "
                 f"slow = below {SLOW:.0%} of comparable links", fontsize=10)
    return save_figure_atomic(fig, path)


def write_pictures(instance, placement, estimate, out_dir) -> dict[str, Path]:
    out = Path(out_dir)
    return {"schedule.png": schedule_gantt(instance, placement, estimate, out / "schedule.png"),
            "memory.png": memory_bars(instance, placement, estimate, out / "memory.png"),
            "cluster.png": cluster_grid(instance, placement, out / "cluster.png")}
