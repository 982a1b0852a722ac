"""The plan's rank order realised on machines (torchrun or Slurm) and a self-check of Megatron's groups.

A launcher decides which physical GPU runs which global rank:
- torchrun (static rendezvous) gives global rank = node_rank x nproc_per_node + local_rank, and local rank j
  drives the j-th GPU of CUDA_VISIBLE_DEVICES. It can express a plan iff every node hosts one contiguous
  block of nproc_per_node consecutive ranks (the same count on every node).
- Slurm with `--distribution=arbitrary` places task r on line r of SLURM_HOSTFILE, so it expresses any order;
  a per-rank wrapper then exports LOCAL_RANK and the node's CUDA_VISIBLE_DEVICES permutation.

`check_groups` rebuilds Megatron-LM's tp, cp, dp, dp-with-cp and pp process groups from the launch (global
ranks and the GPUs the launcher gives them) and compares them with the groups of the plan taken independently
from `Placement.grid`. The ranks of each group come from `megatron_rank_groups`, a re-derivation of Megatron's
`RankGenerator` (importing megatron-core and torch at plan time would cost seconds and a multi-GB dependency);
tests/test_frameworks_megatron.py checks it against megatron-core's real `RankGenerator` and
`initialize_model_parallel`, and passes their groups to `check_groups` in its place.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from math import prod
from typing import Callable

from formulation.placement import Placement

MEGATRON_ORDER = ("tp", "cp", "ep", "dp", "pp")  # Megatron-LM's default `order` (tp varies fastest)


class LaunchMismatch(ValueError):
    """The launch order does not realise the plan's process groups."""


@dataclass(frozen=True)
class TorchrunNode:
    host: str
    node_rank: int
    visible_devices: tuple[int, ...]  # CUDA_VISIBLE_DEVICES: local rank j drives visible_devices[j]


@dataclass(frozen=True)
class TorchrunLaunch:
    nproc_per_node: int
    nodes: tuple[TorchrunNode, ...]

    def realise(self, cluster) -> list[int]:
        """Global GPU index of every global rank, as torchrun assigns them."""
        world = self.nproc_per_node * len(self.nodes)
        gpus: list[int | None] = [None] * world
        for node in self.nodes:
            if len(node.visible_devices) != self.nproc_per_node:
                raise LaunchMismatch(f"torchrun: {node.host} lists {len(node.visible_devices)} GPUs in "
                                     f"CUDA_VISIBLE_DEVICES, nproc_per_node is {self.nproc_per_node}")
            if not 0 <= node.node_rank < len(self.nodes):
                raise LaunchMismatch(f"torchrun: {node.host} has --node-rank {node.node_rank}, expected 0.."
                                     f"{len(self.nodes) - 1}")
            for local_rank, device in enumerate(node.visible_devices):
                rank = node.node_rank * self.nproc_per_node + local_rank
                if gpus[rank] is not None:
                    raise LaunchMismatch(f"torchrun: global rank {rank} is started twice (node rank used twice)")
                gpus[rank] = _gpu(cluster, node.host, device)
        return gpus  # type: ignore[return-value]


@dataclass(frozen=True)
class SlurmLaunch:
    hostfile: tuple[str, ...]  # line r: the host of global rank r
    local_rank: tuple[int, ...]  # per global rank: its LOCAL_RANK on its host
    table_host: tuple[str, ...]  # per global rank: the host the wrapper's table expects (checked at run time)
    visible_devices: dict[str, tuple[int, ...]]  # per host: CUDA_VISIBLE_DEVICES
    gpus_per_node: int = 0  # the GPUs the job asks Slurm for on each node (--gpus-per-node); 0: not stated

    def realise(self, cluster) -> list[int]:
        if self.gpus_per_node:
            for host, devices in self.visible_devices.items():
                if max(devices) >= self.gpus_per_node:
                    raise LaunchMismatch(f"slurm: the job asks for {self.gpus_per_node} GPUs per node but {host} "
                                         f"drives GPU {max(devices)}")
        gpus = []
        for rank, (host, local) in enumerate(zip(self.hostfile, self.local_rank)):
            if self.table_host[rank] != host:
                raise LaunchMismatch(f"slurm: rank {rank} is placed on {host} by the hostfile but the wrapper "
                                     f"expects {self.table_host[rank]} (it would refuse to start)")
            devices = self.visible_devices.get(host)
            if devices is None or not 0 <= local < len(devices):
                raise LaunchMismatch(f"slurm: rank {rank} has LOCAL_RANK {local} on {host}, which lists "
                                     f"{0 if devices is None else len(devices)} GPUs")
            gpus.append(_gpu(cluster, host, devices[local]))
        return gpus


def _gpu(cluster, host: str, device: int) -> int:
    try:
        return cluster.gpu_index(f"{host}:{device}")
    except KeyError:
        raise LaunchMismatch(f"GPU {host}:{device} does not exist in the cluster") from None


# ---- building launches from a placement ----------------------------------------------------------------

def _rank_hosts(cluster, placement: Placement) -> list[str]:
    return [cluster.nodes[cluster.gpu_node[g]].name for g in placement.gpus]


def torchrun_launch(instance, placement: Placement) -> TorchrunLaunch | None:
    """The torchrun realisation of the plan, or None when some node's ranks are not one contiguous block."""
    cluster = instance.cluster
    hosts = _rank_hosts(cluster, placement)
    order = list(dict.fromkeys(hosts))  # nodes in order of their first rank
    if placement.world_size % len(order):
        return None
    per_node = placement.world_size // len(order)
    nodes = []
    for node_rank, host in enumerate(order):
        block = range(node_rank * per_node, (node_rank + 1) * per_node)
        if any(hosts[r] != host for r in block):
            return None
        nodes.append(TorchrunNode(host, node_rank, tuple(int(cluster.gpu_local[placement.gpus[r]]) for r in block)))
    return TorchrunLaunch(per_node, tuple(nodes))


def slurm_launch(instance, placement: Placement) -> SlurmLaunch:
    """The Slurm arbitrary-distribution realisation (any rank order)."""
    cluster = instance.cluster
    hosts = _rank_hosts(cluster, placement)
    local_rank, devices = [], {}
    for rank, host in enumerate(hosts):
        mine = devices.setdefault(host, [])
        local_rank.append(len(mine))  # ranks on a host in increasing rank order, as Slurm numbers SLURM_LOCALID
        mine.append(int(cluster.gpu_local[placement.gpus[rank]]))
    # every GPU of the nodes used: Slurm hides the GPUs a job did not ask for and renumbers the others
    per_node = max(cluster.nodes[cluster.gpu_node[g]].num_gpus for g in placement.gpus)
    return SlurmLaunch(tuple(hosts), tuple(local_rank), tuple(hosts), {h: tuple(d) for h, d in devices.items()},
                       per_node)


# ---- the launch scripts as written ----------------------------------------------------------------------------------------

# FRAMEWORK=torchtitan runs `-m torchtitan.train` (a module: its own torchrun flag and array element) with
# torchtitan's arguments only; its activation-checkpoint subcommand must follow every option, extras included.
TRAIN_SCRIPT = "pretrain_gpt.py"
_PREAMBLE = """set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [[ ! -f "$HERE/megatron_args.sh" && -n "${SLURM_SUBMIT_DIR:-}" ]]; then
  HERE=$SLURM_SUBMIT_DIR  # sbatch runs a copy of the script: the launch files are where it was submitted
fi
FRAMEWORK=${FRAMEWORK:-%(framework)s}  # the framework the plan was made for (solve --framework), unless set
if [[ "$FRAMEWORK" == torchtitan ]]; then
  source "$HERE/torchtitan_args.sh"
  PROGRAM=(-m "${TORCHTITAN_ENTRY:-torchtitan.train}" "${TORCHTITAN_ARGS[@]}")
  TAIL=("${TORCHTITAN_SUBCOMMANDS[@]}")
elif [[ "$FRAMEWORK" == megatron ]]; then
  source "$HERE/megatron_args.sh"
  PROGRAM=("${TRAIN_SCRIPT:-%(train_script)s}" "${MEGATRON_ARGS[@]}")
  TAIL=()
else
  echo "FRAMEWORK must be megatron or torchtitan, not $FRAMEWORK" >&2; exit 2
fi"""


def preamble(framework: str | None) -> str:
    """The scripts' common start: the launch files of FRAMEWORK, by default the one the plan was made for."""
    return _PREAMBLE % {"framework": framework or "megatron", "train_script": TRAIN_SCRIPT}


def torchrun_script(launch: TorchrunLaunch, p: Placement, framework: str | None = None) -> str:
    master = launch.nodes[0].host
    lines = ["#!/usr/bin/env bash",
             "# torchrun route. Run this script once on every node of the plan; it picks the node's line below.",
             "# torchrun (static rendezvous) makes global rank = node_rank x nproc_per_node + local_rank, and local",
             "# rank j drives the j-th GPU of CUDA_VISIBLE_DEVICES: together they realise the plan's rank order.",
             f"# plan: {p.summary()}",
             "# Usage: [FRAMEWORK=megatron|torchtitan] [NODE=<this node's name>] [MASTER_ADDR=...] bash launch_torchrun.sh",
             "#        [extra training args]",
             preamble(framework),
             f"NNODES={len(launch.nodes)}",
             f"NPROC_PER_NODE={launch.nproc_per_node}",
             "NODE=${NODE:-$(hostname -s)}",
             f"MASTER_ADDR=${{MASTER_ADDR:-{master}}}  # the node of global rank 0",
             "MASTER_PORT=${MASTER_PORT:-29500}",
             'case "$NODE" in']
    for node in launch.nodes:
        lines.append(f"  {node.host}) NODE_RANK={node.node_rank}; "
                     f"DEVICES={','.join(map(str, node.visible_devices))} ;;")
    lines += ['  *) echo "launch_torchrun.sh: node $NODE is not part of this plan" >&2; exit 1 ;;',
              "esac",
              'export CUDA_VISIBLE_DEVICES="$DEVICES"',
              'exec torchrun --nnodes="$NNODES" --nproc-per-node="$NPROC_PER_NODE" --node-rank="$NODE_RANK" \\',
              '  --master-addr="$MASTER_ADDR" --master-port="$MASTER_PORT" \\',
              '  "${PROGRAM[@]}" "$@" "${TAIL[@]}"']
    return "\n".join(lines) + "\n"


def slurm_files(launch: SlurmLaunch, p: Placement, framework: str | None = None,
                rack_lines: tuple[str, ...] | list[str] = ()) -> tuple[str, str]:
    """(hostfile, launch_slurm.sh); `rack_lines`: the NVLink domains' #SBATCH and comment lines
    (solvers/outputs/racks.py)."""
    hosts = list(dict.fromkeys(launch.hostfile))
    gpus = f"--gpus-per-node={launch.gpus_per_node}"
    lines = ["#!/usr/bin/env bash",
             f"#SBATCH --nodes={len(hosts)}",
             f"#SBATCH --nodelist={','.join(hosts)}",
             f"#SBATCH --ntasks={len(launch.hostfile)}",
             f"#SBATCH {gpus}",
             "#SBATCH --exclusive",
             *rack_lines,
             "# Slurm route: expresses any rank order. srun starts one task per rank and places task r on line r",
             "# of ./hostfile (SLURM_HOSTFILE, --distribution=arbitrary); each task then takes LOCAL_RANK from the",
             "# table below and its node's CUDA_VISIBLE_DEVICES permutation, so it drives the plan's GPU. The job",
             "# asks for every GPU of its nodes (Slurm would hide and renumber the others).",
             f"# plan: {p.summary()}",
             "# Usage (node names are used as host names): from this directory, [FRAMEWORK=...] sbatch launch_slurm.sh",
             f"# or inside an allocation: salloc --nodes={len(hosts)} --exclusive {gpus} --nodelist={','.join(hosts)}",
             "#   then [FRAMEWORK=megatron|torchtitan] bash launch_slurm.sh [extra training args]",
             preamble(framework),
             f"WORLD_SIZE={len(launch.hostfile)}",
             'if [[ "${1:-}" != "--rank" ]]; then',
             '  export SLURM_HOSTFILE="$HERE/hostfile"',
             f"  export MASTER_ADDR=${{MASTER_ADDR:-{launch.hostfile[0]}}} MASTER_PORT=${{MASTER_PORT:-29500}}",
             f'  exec srun --nodes={len(hosts)} --ntasks="$WORLD_SIZE" --distribution=arbitrary --cpu-bind=none \\',
             f'    {gpus} --gpu-bind=none bash "$HERE/launch_slurm.sh" --rank "$@"',
             "fi",
             "shift",
             "RANK=$SLURM_PROCID",
             'case "$RANK" in']
    for rank, (host, local) in enumerate(zip(launch.table_host, launch.local_rank)):
        lines.append(f"  {rank}) HOST={host}; LOCAL={local} ;;")
    lines += ["esac", 'case "$HOST" in']
    for host in hosts:
        lines.append(f"  {host}) DEVICES={','.join(map(str, launch.visible_devices[host]))} ;;")
    lines += ["esac",
              'if [[ "$(hostname -s)" != "$HOST" ]]; then',
              '  echo "launch_slurm.sh: rank $RANK belongs on $HOST but runs on $(hostname -s)" >&2; exit 1',
              "fi",
              'export CUDA_VISIBLE_DEVICES="$DEVICES" RANK WORLD_SIZE LOCAL_RANK="$LOCAL"',
              'exec python "${PROGRAM[@]}" "$@" "${TAIL[@]}"']
    return "\n".join(launch.hostfile) + "\n", "\n".join(lines) + "\n"


# ---- Megatron-LM's process groups -----------------------------------------------------------------------

def orthogonal_rank_groups(sizes: list[int], mask: list[bool]) -> list[list[int]]:
    """Megatron-LM's `generate_masked_orthogonal_rank_groups`, re-derived.

    A global rank is a mixed-radix number whose digits are the parallel coordinates in `sizes` order (first
    digit fastest). A group fixes the unmasked digits and enumerates the masked ones (first masked digit
    fastest); groups are enumerated by the unmasked digits (first fastest).
    """
    strides = [prod(sizes[:i]) for i in range(len(sizes))]
    masked = [i for i, m in enumerate(mask) if m]
    unmasked = [i for i, m in enumerate(mask) if not m]

    def offset(index: int, dims: list[int]) -> int:
        total = 0
        for d in dims:
            total += (index % sizes[d]) * strides[d]
            index //= sizes[d]
        return total

    group_size = prod(sizes[d] for d in masked)
    return [[offset(g, unmasked) + offset(k, masked) for k in range(group_size)]
            for g in range(prod(sizes[d] for d in unmasked))]


def token_rank_groups(sizes: dict[str, int], token: str) -> list[list[int]]:
    """Megatron's `RankGenerator.get_ranks(token)` for the sizes by name (tp, cp, ep, dp, pp) in its default order."""
    wanted = token.split("-")
    return orthogonal_rank_groups([sizes[name] for name in MEGATRON_ORDER], [name in wanted for name in MEGATRON_ORDER])


def megatron_rank_groups(tp: int, cp: int, dp: int, pp: int) -> dict[str, list[list[int]]]:
    """Global ranks of Megatron's groups as `RankGenerator(order='tp-cp-ep-dp-pp')` builds them."""
    sizes = dict(tp=tp, cp=cp, ep=1, dp=dp, pp=pp)
    return {token: token_rank_groups(sizes, token) for token in ("tp", "cp", "dp", "dp-cp", "pp")}


def megatron_expert_rank_groups(etp: int, ep: int, expert_dp: int, pp: int) -> dict[str, list[list[int]]]:
    """Global ranks of Megatron's expert groups: its expert `RankGenerator` (cp = 1, the same order) builds the
    expert-parallel ("ep"), expert tensor-parallel ("tp"), expert data-parallel ("dp") and "tp-ep" groups."""
    sizes = dict(tp=etp, cp=1, ep=ep, dp=expert_dp, pp=pp)
    return {token: token_rank_groups(sizes, token) for token in ("ep", "tp", "dp", "tp-ep")}


def plan_groups(placement: Placement) -> dict[str, list[tuple[int, ...]]]:
    """The plan's groups as physical GPUs, straight from the [pp, dp, cp, tp] grid (no rank arithmetic)."""
    grid = placement.grid
    pp, dp, cp, tp = grid.shape
    return {
        "tp": [tuple(grid[s, d, c, :]) for s in range(pp) for d in range(dp) for c in range(cp)],
        "cp": [tuple(grid[s, d, :, t]) for s in range(pp) for d in range(dp) for t in range(tp)],
        "dp": [tuple(grid[s, :, c, t]) for s in range(pp) for c in range(cp) for t in range(tp)],
        "dp-cp": [tuple(grid[s, :, :, t].reshape(-1)) for s in range(pp) for t in range(tp)],
        "pp": [tuple(grid[:, d, c, t]) for d in range(dp) for c in range(cp) for t in range(tp)],
    }


RankGroups = Callable[[int, int, int, int], dict[str, list[list[int]]]]  # (tp, cp, dp, pp) -> name -> groups
ExpertRankGroups = Callable[[int, int, int, int], dict[str, list[list[int]]]]  # (etp, ep, expert_dp, pp) -> ...


def plan_expert_groups(placement: Placement) -> dict[str, list[tuple[int, ...]]]:
    """The plan's expert groups as physical GPUs, from `Placement.expert_grid` ([pp, expert_dp, ep, etp]), under
    the names Megatron's expert RankGenerator gives them."""
    grid = placement.expert_grid(placement.ep, placement.etp)
    pp, edp, ep, etp = grid.shape
    return {
        "ep": [tuple(grid[s, d, :, t]) for s in range(pp) for d in range(edp) for t in range(etp)],
        "tp": [tuple(grid[s, d, e, :]) for s in range(pp) for d in range(edp) for e in range(ep)],
        "dp": [tuple(grid[s, :, e, t]) for s in range(pp) for e in range(ep) for t in range(etp)],
        "tp-ep": [tuple(grid[s, d].reshape(-1)) for s in range(pp) for d in range(edp)],
    }


def check_groups(instance, placement: Placement, launch: TorchrunLaunch | SlurmLaunch,
                 rank_groups: RankGroups = megatron_rank_groups,
                 expert_rank_groups: ExpertRankGroups = megatron_expert_rank_groups) -> None:
    """Raise `LaunchMismatch` unless the launch realises every process group of the plan.

    `rank_groups` / `expert_rank_groups` give the global ranks of Megatron's groups and expert groups (the tests
    pass megatron-core's own). Expert groups (ep, expert tp, expert dp, tp-ep) are checked where the plan has
    ep x etp > 1.

    tp, cp, dp and dp-cp groups are compared as sets of GPUs (the order inside them changes neither traffic nor
    results); pp groups as sequences, because position k of a pipeline group is stage k and holds its layers.
    """
    cluster = instance.cluster
    gpus = [int(g) for g in launch.realise(cluster)]
    kind = "torchrun" if isinstance(launch, TorchrunLaunch) else "slurm"
    if len(gpus) != placement.world_size:
        raise LaunchMismatch(f"{kind}: the launch starts {len(gpus)} ranks, the plan has {placement.world_size}")
    if len(set(gpus)) != len(gpus):
        dup = next(g for g in gpus if gpus.count(g) > 1)
        raise LaunchMismatch(f"{kind}: GPU {cluster.gpu_name(dup)} is given to two ranks")
    _compare_groups(kind, "", rank_groups(placement.tp, placement.cp, placement.dp, placement.pp),
                    plan_groups(placement), gpus, cluster)
    if placement.ep * placement.etp > 1:
        expert_dp = placement.tp * placement.cp * placement.dp // (placement.ep * placement.etp)
        _compare_groups(kind, "expert ", expert_rank_groups(placement.etp, placement.ep, expert_dp, placement.pp),
                        plan_expert_groups(placement), gpus, cluster)


def _compare_groups(kind: str, prefix: str, built: dict, expected: dict, gpus: list[int], cluster) -> None:
    """Each of Megatron's groups (global ranks, realised on `gpus`) must be a group of the plan; pp in order."""
    for name, rank_groups in built.items():
        realised = [tuple(gpus[r] for r in ranks) for ranks in rank_groups]
        want = [tuple(int(g) for g in group) for group in expected[name]]
        if name == "pp":
            have_set, want_set = set(realised), set(want)
        else:
            have_set, want_set = {frozenset(g) for g in realised}, {frozenset(g) for g in want}
        if have_set != want_set:
            bad = next(i for i, g in enumerate(realised) if (g if name == "pp" else frozenset(g)) not in want_set)
            names = ", ".join(cluster.gpu_name(g) for g in realised[bad])
            raise LaunchMismatch(f"{kind}: Megatron's {prefix}{name} group of ranks {rank_groups[bad]} runs on "
                                 f"[{names}], which is not an {prefix}{name} group of the plan" if prefix else
                                 f"{kind}: Megatron's {name} group of ranks {rank_groups[bad]} runs on [{names}], "
                                 f"which is not a {name} group of the plan")


# ---- reading the rendered scripts back (so the self-check covers what is actually written) -------------

_TORCHRUN_NODE = re.compile(r"^\s*(\S+)\)\s+NODE_RANK=(\d+);\s+DEVICES=([\d,]+)\s*;;", re.M)
_SLURM_RANK = re.compile(r"^\s*(\d+)\)\s+HOST=(\S+);\s+LOCAL=(\d+)\s*;;", re.M)
_SLURM_HOST = re.compile(r"^\s*(\S+)\)\s+DEVICES=([\d,]+)\s*;;", re.M)


def parse_torchrun_script(text: str) -> TorchrunLaunch:
    nproc = re.search(r"^NPROC_PER_NODE=(\d+)", text, re.M)
    if nproc is None:
        raise LaunchMismatch("torchrun script: no NPROC_PER_NODE line")
    nodes = tuple(TorchrunNode(host, int(rank), tuple(int(d) for d in devs.split(",")))
                  for host, rank, devs in _TORCHRUN_NODE.findall(text))
    return TorchrunLaunch(int(nproc.group(1)), nodes)


def parse_slurm_files(hostfile: str, script: str) -> SlurmLaunch:
    hosts = tuple(line.strip() for line in hostfile.splitlines() if line.strip())
    table = {int(rank): (host, int(local)) for rank, host, local in _SLURM_RANK.findall(script)}
    if sorted(table) != list(range(len(hosts))):
        raise LaunchMismatch(f"slurm: the wrapper's rank table covers {len(table)} ranks, the hostfile {len(hosts)}")
    devices = {host: tuple(int(d) for d in devs.split(",")) for host, devs in _SLURM_HOST.findall(script)}
    asked = re.search(r"^#SBATCH --gpus-per-node=(\d+)$", script, re.M)
    if asked is None:
        raise LaunchMismatch("slurm: the script asks for no GPUs (no #SBATCH --gpus-per-node line)")
    return SlurmLaunch(hosts, tuple(table[r][1] for r in range(len(hosts))),
                       tuple(table[r][0] for r in range(len(hosts))), devices, int(asked.group(1)))
