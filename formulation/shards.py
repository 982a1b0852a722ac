"""The model shard each GPU holds under a placement, and how many ranks of a new plan hold another shard than
their GPU held under the old one: what a checkpoint reshard must move after a re-plan (docs/replan.md).

A rank's shard is what decides which slice of the model's weights it loads:
  (tp, tp index, cp, cp index, ep, etp, ep index, etp index, the layers it holds),
the sizes included (tp index 0 of 4 holds another slice than tp index 0 of 8). The layers follow Megatron-LM's
interleaved order (formulation/physics/layer_kinds.py): stage i with vpp chunks holds, for each chunk c, the
layers c L / vpp + [S_i, S_{i+1}) with S_i = sum_{j < i} l_j / vpp; under a V schedule (ZBV, DualPipeV) rank r holds
virtual stages r and 2 pp - 1 - r (docs/schedules.md (S3)). The dp index is not part of it: data-parallel
replicas hold the same weights (the optimizer state a ZeRO stage shards over dp is re-split whenever dp changes,
and is counted apart by nothing here)."""

from __future__ import annotations

from formulation.physics.pipeline_sim import stage_rank
from formulation.physics.v_schedules import V_FAMILIES
from formulation.placement import Placement


def stage_layers(num_layers: int, layers_per_stage, vpp: int, schedule: str = "1f1b") -> list[frozenset[int]]:
    """The global layer indices each pipeline stage holds: the virtual stages in order, virtual stage v on rank
    v mod pp (looped) or, under a V schedule, v then 2 pp - 1 - v, each with its rank's l / vpp layers."""
    pp = len(layers_per_stage)
    style = "v" if schedule in V_FAMILIES else "loop"
    held: list[set[int]] = [set() for _ in range(pp)]
    first = 0
    for virtual in range(pp * vpp):
        rank = stage_rank(virtual, pp, style)
        n = layers_per_stage[rank] // vpp
        held[rank].update(range(first, first + n))
        first += n
    return [frozenset(h) for h in held]


def shards(placement: Placement, num_layers: int) -> dict[int, tuple]:
    """GPU (global index) -> the shard its rank holds."""
    p = placement
    layers = stage_layers(num_layers, p.layers_per_stage, p.vpp, p.schedule)
    per_stage = p.tp * p.cp * p.dp
    out = {}
    for rank, gpu in enumerate(p.gpus):
        tp_i, rest = rank % p.tp, rank // p.tp
        cp_i, rest = rest % p.cp, rest // p.cp
        pp_i = rest // p.dp
        within = rank % per_stage  # expert layers: the stage's ranks as etp x ep x expert_dp, etp fastest
        etp_i, ep_i = within % p.etp, (within // p.etp) % p.ep
        out[int(gpu)] = (p.tp, tp_i, p.cp, cp_i, p.ep, p.etp, ep_i, etp_i, layers[pp_i])
    return out


def ranks_moved(old: Placement, new: Placement, num_layers: int) -> int:
    """Ranks of `new` whose GPU did not hold the same shard under `old` (a GPU idle or failed before counts)."""
    before = shards(old, num_layers)
    return sum(1 for gpu, shard in shards(new, num_layers).items() if before.get(gpu) != shard)
