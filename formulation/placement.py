"""A placement: parallel sizes, micro-batch, recompute, sharding, layer partition, and the GPU of every rank.

Ranks follow Megatron-LM's default order `tp-cp-dp-pp` (tp varies fastest):
    rank = tp_i + tp * (cp_i + cp * (dp_i + dp * pp_i)).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from functools import cached_property

import numpy as np

from formulation.errors import InputError
from formulation.inputs.job import PYTORCH_STACKS, RECOMPUTE_CHOICES, ZERO_STAGES
from formulation.physics import moe_overlap
from formulation.physics.sharding import check_sharding as sharding_problem


@dataclass(frozen=True, order=True)
class Config:
    """The choices that are not the map: parallel sizes, micro-batch, interleaving, recompute, sharding.

    A field added here with a default must be `field(default=..., kw_only=True)`: `Placement` extends this
    class with fields that have none, and existing positional calls keep their meaning."""

    tp: int
    pp: int
    cp: int
    dp: int
    vpp: int
    micro_batch_size: int
    recompute: str
    zero_stage: int
    # mixture-of-experts layers: expert parallel and expert tensor parallel sizes over the same tp x cp x dp
    # ranks of a stage (Megatron-Core: etp x ep x expert_dp = tp x cp x dp); 1 and 1 for dense models
    ep: int = field(default=1, kw_only=True)
    etp: int = field(default=1, kw_only=True)
    # Megatron-Core's MoE all-to-all overlap (--overlap-moe-expert-parallel-comm --delay-wgrad-compute, docs/moe.md
    # (E10)): each MoE layer's dispatch and combine beside the other micro-batch's compute
    moe_a2a_overlap: bool = field(default=False, kw_only=True)
    # pipeline schedule family (formulation/physics/schedules.py): "1f1b" (1F1B, interleaved with vpp > 1) or
    # "zero_bubble" (ZB-H1, InterleavedZeroBubble with vpp > 1), or the V-shaped "zbv" (ZBVZeroBubble) and
    # "dualpipev" (DualPipeV), vpp = 2

    schedule: str = field(default="1f1b", kw_only=True)
    # sharded data parallelism (docs/model.md (M1)-(M3), (C11)-(C12), formulation/physics/sharding.py): dp =
    # dp_shard x dp_replicate; ZeRO states are sharded over dp_shard x cp ranks (torchtitan's dp_shard_cp mesh,
    # Megatron's distributed-optimizer instance) and replicated over dp_replicate groups (HSDP; Megatron-Core's
    # num_distributed_optimizer_instances). 1: one shard group over the whole dp x cp group.
    dp_replicate: int = field(default=1, kw_only=True)
    # zero_stage 3: parameters freed after each layer's forward and gathered again in its backward (FSDP's
    # reshard_after_forward, FULL_SHARD); False keeps them unsharded until the backward (SHARD_GRAD_OP)
    reshard_after_forward: bool = field(default=True, kw_only=True)

    def sizes(self) -> str:
        """The parallel sizes, the one spelling every table, title and message uses."""
        experts = f" ep={self.ep} etp={self.etp}" if (self.ep, self.etp) != (1, 1) else ""
        shards = f" dp_shard={self.dp_shard} dp_replicate={self.dp_replicate}" if self.dp_replicate > 1 else ""
        return f"tp={self.tp} pp={self.pp} cp={self.cp} dp={self.dp}{shards}{experts}"

    @property
    def dp_shard(self) -> int:
        """Data-parallel replicas in one shard group (dp / dp_replicate)."""
        return self.dp // self.dp_replicate

    @property
    def shard_size(self) -> int:
        """Ranks the ZeRO states of a stage are sharded over: dp_shard x cp."""
        return self.dp // self.dp_replicate * self.cp

    @property
    def expert_dp(self) -> int:
        """Expert data-parallel size: the ranks of a stage that hold the same experts."""
        return self.tp * self.cp * self.dp // (self.ep * self.etp)

    def describe(self) -> str:
        overlap = " a2a-overlap" if self.moe_a2a_overlap else ""
        keep = "" if self.reshard_after_forward else " reshard_after_forward=False"
        return (f"{self.sizes()} vpp={self.vpp} mbs={self.micro_batch_size} recompute={self.recompute} "
                f"zero={self.zero_stage}{keep}{overlap}{self.schedule_text}")

    @property
    def schedule_name(self) -> str:
        """The pipeline schedule by torch.distributed.pipelining's name (1F1B, Interleaved1F1B, ZBH1, ...)."""
        from formulation.physics.schedules import schedule_name
        return schedule_name(self.schedule, self.vpp)

    @property
    def schedule_text(self) -> str:
        """" schedule=NAME" for a zero-bubble configuration, "" for the 1F1B family (the texts stay as before)."""
        return f" schedule={self.schedule_name}" if self.schedule != "1f1b" else ""

    def config_key(self) -> tuple:
        return tuple(getattr(self, f.name) for f in fields(Config))


def _choices(config: Config) -> dict:
    """The configuration's fields by name (keyword-only ones included)."""
    return {f.name: getattr(config, f.name) for f in fields(Config)}


@dataclass(frozen=True)
class Placement(Config):
    """A configuration with its layer partition and the GPU of every rank."""

    layers_per_stage: tuple[int, ...]
    gpus: tuple[int, ...]  # global GPU index of every rank, in tp-cp-dp-pp order
    # With recompute "full": 0 recomputes every layer (Megatron-LM's --recompute-method uniform
    # --recompute-num-layers 1); r > 0 only the first r layers of each model chunk, the others keeping their
    # activations (--recompute-method block --recompute-num-layers r; (C4b), (M4b) in docs/model.md). A plan the
    # user brings: the search does not propose it (docs/model.md says why).
    recompute_num_layers: int = field(default=0, kw_only=True)

    @classmethod
    def of(cls, config: Config, layers_per_stage, gpus) -> "Placement":
        return cls(**_choices(config), layers_per_stage=tuple(layers_per_stage), gpus=tuple(gpus))

    @property
    def recompute_text(self) -> str:
        """The recompute policy in words: with block recompute, how many layers of each chunk."""
        if self.recompute_num_layers:
            return f"{self.recompute} (block: first {self.recompute_num_layers} layers of each chunk)"
        return self.recompute

    def recomputed_layers(self, layers: int) -> int:
        """How many of a stage's `layers` recompute their forward in the backward under recompute "full": all,
        or with `recompute_num_layers` r the first r of each of its vpp chunks (Megatron-Core's block method
        counts within each chunk)."""
        if self.recompute != "full":
            return 0
        if self.recompute_num_layers == 0:
            return layers
        return self.vpp * min(self.recompute_num_layers, layers // self.vpp)

    @property
    def config(self) -> Config:
        return Config(**_choices(self))

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.cp * self.dp

    def num_micro_batches(self, global_batch_size: int) -> int:
        return global_batch_size // (self.micro_batch_size * self.dp)

    @cached_property
    def grid(self) -> np.ndarray:
        """GPU indices as an array [pp, dp, cp, tp] (the reverse of the rank order)."""
        return np.asarray(self.gpus).reshape(self.pp, self.dp, self.cp, self.tp)

    def tp_groups(self, stage: int) -> np.ndarray:
        return self.grid[stage].reshape(-1, self.tp)

    def cp_groups(self, stage: int) -> np.ndarray:
        return self.grid[stage].transpose(0, 2, 1).reshape(-1, self.cp)

    def dp_cp_groups(self, stage: int) -> np.ndarray:
        """Megatron's data-parallel group with context parallelism: same tp and pp coordinate."""
        return self.grid[stage].transpose(2, 0, 1).reshape(self.tp, -1)

    def shard_groups(self, stage: int) -> np.ndarray:
        """The groups a stage's ZeRO states are sharded over: dp_shard x cp ranks of one tp coordinate and replica,
        cp fastest; contiguous pieces of `dp_cp_groups` (Megatron-Core's intra distributed-optimizer instance groups
        are consecutive slices of its dp-cp ranks; torchtitan's mesh is [pp, dp_replicate, dp_shard, cp, tp]).
        With dp_replicate 1 they are `dp_cp_groups`, row for row."""
        r = self.dp_replicate
        return self.grid[stage].reshape(r, self.dp // r, self.cp, self.tp).transpose(0, 3, 1, 2).reshape(
            -1, self.shard_size)

    def replicate_groups(self, stage: int) -> np.ndarray:
        """The groups that all-reduce a stage's sharded gradients across replicas: the dp_replicate ranks of one
        tp, cp and shard coordinate (Megatron-Core's inter distributed-optimizer instance groups)."""
        r = self.dp_replicate
        return self.grid[stage].reshape(r, self.dp // r, self.cp, self.tp).transpose(1, 2, 3, 0).reshape(-1, r)

    def stage_gpus(self, stage: int) -> np.ndarray:
        return self.grid[stage].reshape(-1)

    # ---- expert groups (mixture-of-experts layers) ----------------------------------------------------------
    def expert_grid(self, ep: int, etp: int) -> np.ndarray:
        """GPU indices of the expert layers' ranks as [pp, expert_dp, ep, etp]. Megatron-Core lays the expert
        groups over the same ranks: each stage's tp x cp x dp ranks are re-split as etp x ep x expert_dp, etp
        varying fastest (its RankGenerator with cp = 1 and the order tp-ep-dp-pp)."""
        per_stage = self.tp * self.cp * self.dp
        if per_stage % (ep * etp):
            raise ValueError(f"ep x etp = {ep} x {etp} does not divide tp x cp x dp = {per_stage}")
        return np.asarray(self.gpus).reshape(self.pp, per_stage // (ep * etp), ep, etp)

    def moe_ep_groups(self, stage: int) -> np.ndarray:
        """This placement's expert-parallel groups of a stage (its own ep and etp)."""
        return self.ep_groups(stage, self.ep, self.etp)

    def moe_expert_dp_groups(self, stage: int) -> np.ndarray:
        return self.expert_dp_groups(stage, self.ep, self.etp)

    def ep_groups(self, stage: int, ep: int, etp: int) -> np.ndarray:
        """The expert-parallel groups of a stage: the GPUs a token's dispatch and combine cross."""
        return self.expert_grid(ep, etp)[stage].transpose(0, 2, 1).reshape(-1, ep)

    def expert_tp_groups(self, stage: int, ep: int, etp: int) -> np.ndarray:
        return self.expert_grid(ep, etp)[stage].reshape(-1, etp)

    def expert_dp_groups(self, stage: int, ep: int, etp: int) -> np.ndarray:
        """The groups that synchronise the same experts' gradients (expert data parallelism)."""
        grid = self.expert_grid(ep, etp)[stage]
        return grid.transpose(1, 2, 0).reshape(-1, grid.shape[0])

    def summary(self) -> str:
        """The choices on one line, in the ecosystem's words."""
        block = f" recompute_num_layers={self.recompute_num_layers}" if self.recompute_num_layers else ""
        overlap = " moe_a2a_overlap=true" if self.moe_a2a_overlap else ""
        return (f"{self.sizes()} vpp={self.vpp} "
                f"micro_batch_size={self.micro_batch_size} recompute={self.recompute}{block} "
                f"zero_stage={self.zero_stage}{overlap}{self.schedule_text} layers_per_stage={list(self.layers_per_stage)}")

    def to_dict(self, cluster=None) -> dict:
        out = asdict(self)
        if (self.ep, self.etp) == (1, 1):  # dense plans keep their keys
            del out["ep"], out["etp"]
        if not self.recompute_num_layers:  # every layer under its policy: the plans of the search
            del out["recompute_num_layers"]
        if not self.moe_a2a_overlap:  # plans without the overlap keep their keys
            del out["moe_a2a_overlap"]
        if self.schedule == "1f1b":  # 1F1B plans keep their keys
            del out["schedule"]
        if self.dp_replicate == 1:  # one shard group: the plans before sharded data parallelism
            del out["dp_replicate"]
        if self.reshard_after_forward:
            del out["reshard_after_forward"]
        out["layers_per_stage"] = list(self.layers_per_stage)
        out["gpus"] = [cluster.gpu_name(g) for g in self.gpus] if cluster is not None else list(self.gpus)
        return out


def even_split(num_layers: int, pp: int) -> tuple[int, ...]:
    """Layers per stage as even as possible; leftover layers go to the middle stages, because the first and
    last stages also carry the embedding and the output layer."""
    base, extra = divmod(num_layers, pp)
    counts = [base] * pp
    order = sorted(range(pp), key=lambda i: (i in (0, pp - 1), abs(i - (pp - 1) / 2)))
    for i in order[:extra]:
        counts[i] += 1
    return tuple(counts)


def default_split(num_layers: int, pp: int, vpp: int = 1) -> tuple[int, ...] | None:
    """Megatron-LM's default partition: even split; with interleaving only when every stage gets the same
    whole number of chunks (num_layers divisible by pp x vpp), else None (it needs the layout flag)."""
    if vpp == 1:
        return even_split(num_layers, pp)
    return (num_layers // pp,) * pp if num_layers % (pp * vpp) == 0 else None


def default_placement(instance, tp: int, pp: int, cp: int = 1, dp: int | None = None, vpp: int = 1,
                      micro_batch_size: int = 1, recompute: str = "none", zero_stage: int = 1, ep: int = 1,
                      etp: int = 1) -> Placement:
    """Megatron-style default: even layer split, ranks filled node by node in the listed order."""
    cluster = instance.cluster
    if dp is None:
        dp = cluster.num_gpus // (tp * pp * cp)
    world = tp * pp * cp * dp
    placement = Placement(tp=tp, pp=pp, cp=cp, dp=dp, vpp=vpp, micro_batch_size=micro_batch_size,
                          recompute=recompute, zero_stage=zero_stage, ep=ep, etp=etp,
                          layers_per_stage=even_split(instance.model.num_layers, pp), gpus=tuple(range(world)))
    check_placement(instance, placement, "<default placement>")
    return placement


def check_placement(instance, p: Placement, file: str) -> None:
    """Raise `InputError` naming the field when a placement cannot run this model on this cluster."""
    model, job, cluster = instance.model, instance.training, instance.cluster

    def bad(field: str, problem: str):
        raise InputError(file, field, problem)

    world = p.world_size
    sizes = f"tp={p.tp} x pp={p.pp} x cp={p.cp} x dp={p.dp} = {world}"
    if world > cluster.num_gpus:
        bad("dp", f"{sizes} GPUs, but the cluster has {cluster.num_gpus}")
    if len(p.gpus) != world:
        bad("gpus", f"expected {world} GPUs ({sizes}), got {len(p.gpus)}")
    if len(set(p.gpus)) != len(p.gpus):
        dup = next(g for g in p.gpus if p.gpus.count(g) > 1)
        bad("gpus", f"GPU {cluster.gpu_name(dup)} is used by two ranks")
    if any(g < 0 or g >= cluster.num_gpus for g in p.gpus):
        bad("gpus", "GPU index outside the cluster")
    if model.num_attention_heads % p.tp or model.num_kv_heads % p.tp:
        bad("tp", f"tp={p.tp} must divide num_attention_heads={model.num_attention_heads} and "
                  f"num_key_value_heads={model.num_kv_heads}")
    if p.recompute not in RECOMPUTE_CHOICES:
        bad("recompute", f"expected one of {', '.join(RECOMPUTE_CHOICES)}; got {p.recompute!r}")
    if p.zero_stage not in ZERO_STAGES:
        bad("zero_stage", f"expected one of {ZERO_STAGES}; got {p.zero_stage!r}")
    if job.seq_length % p.cp:
        bad("cp", f"cp={p.cp} must divide seq_length={job.seq_length}")
    if job.global_batch_size % (p.micro_batch_size * p.dp):
        bad("micro_batch_size", f"global_batch_size={job.global_batch_size} is not divisible by "
                                f"micro_batch_size={p.micro_batch_size} x dp={p.dp}")
    if len(p.layers_per_stage) != p.pp:
        bad("layers_per_stage", f"expected {p.pp} entries (one per pipeline stage), got {len(p.layers_per_stage)}")
    if any(n < 1 for n in p.layers_per_stage):
        bad("layers_per_stage", "every stage needs at least one layer")
    if sum(p.layers_per_stage) != model.num_layers:
        bad("layers_per_stage", f"sums to {sum(p.layers_per_stage)}, the model has {model.num_layers} layers")
    check_experts(model, p, bad)
    check_block_recompute(model, job, p, bad)
    if not isinstance(p.moe_a2a_overlap, bool):
        bad("moe_a2a_overlap", f"expected true or false, got {p.moe_a2a_overlap!r}")
    if p.moe_a2a_overlap and (why := moe_overlap.problem(model, job, p)):
        bad("moe_a2a_overlap", why)
    schedule_problem(model, job, p, bad)
    sharding_problem(model, p, bad)
    if p.vpp > 1:
        if p.pp < 2:
            bad("vpp", "interleaving (vpp > 1) needs pp >= 2")
        if any(n % p.vpp for n in p.layers_per_stage):
            bad("vpp", f"every stage's layer count must be divisible by vpp={p.vpp}")
        if p.num_micro_batches(job.global_batch_size) % p.pp:
            bad("vpp", f"interleaving needs the number of micro-batches "
                       f"({p.num_micro_batches(job.global_batch_size)}) divisible by pp={p.pp}")


def check_block_recompute(model, job, p: Placement, bad) -> None:
    """recompute_num_layers (Megatron-LM's block method: r layers of each chunk fully recomputed) needs recompute
    "full", a dense model and the megatron stack or a PyTorch one. Which r layers of a chunk recompute changes
    neither its time nor its peak (the stored activations are summed over the chunk's layers), so r of n also
    scores torchtitan's selective_ac_option = "k" (every k-th layer, n/k of them) and FSDP's checkpoint wrapper
    applied to a share of the blocks; DeepSpeed's checkpointing counts layers otherwise."""
    r = p.recompute_num_layers
    if isinstance(r, bool) or not isinstance(r, int) or r < 0:
        bad("recompute_num_layers", f"expected a non-negative integer, got {r!r}")
    if r == 0:
        return
    if p.recompute != "full":
        bad("recompute_num_layers", f"applies to recompute \"full\" (Megatron-LM's --recompute-method block); "
                                    f"got recompute={p.recompute!r}")
    if job.software_stack not in ("megatron",) + PYTORCH_STACKS:
        bad("recompute_num_layers", f"block recompute is modelled for software_stack megatron, "
                                    f"{' and '.join(PYTORCH_STACKS)}, not {job.software_stack}")
    if model.moe is not None:
        bad("recompute_num_layers", "block recompute is not modelled for mixture-of-experts models: expected 0")


def check_experts(model, p: Config, bad) -> None:
    """Megatron-Core's rules for the expert layers: etp x ep x expert_dp = tp x cp x dp (ep x etp divides the
    stage's ranks), ep divides the experts, etp divides an expert's FFN width; a dense model has ep = etp = 1.
    `bad(field, problem)` raises."""
    if p.ep < 1 or p.etp < 1:
        bad("ep" if p.ep < 1 else "etp", f"expected a positive integer, got ep={p.ep} etp={p.etp}")
    moe = model.moe
    if moe is None:
        if (p.ep, p.etp) != (1, 1):
            bad("ep" if p.ep != 1 else "etp", f"ep={p.ep} etp={p.etp}: {model.name} has no experts (expected 1)")
        return
    if p.zero_stage >= 2:
        bad("zero_stage", f"zero_stage={p.zero_stage} is not modelled for mixture-of-experts models (Megatron-Core "
                          "shards experts with its distributed optimizer): expected 0 or 1")
    ranks = p.tp * p.cp * p.dp
    if ranks % (p.ep * p.etp):
        bad("ep", f"etp={p.etp} x ep={p.ep} = {p.ep * p.etp} must divide tp={p.tp} x cp={p.cp} x dp={p.dp} = "
                  f"{ranks} (etp x ep x expert_dp = tp x cp x dp)")
    if moe.num_experts % p.ep:
        bad("ep", f"ep={p.ep} must divide the {moe.num_experts} experts")
    if moe.expert_ffn_hidden_size % p.etp:
        bad("etp", f"etp={p.etp} must divide the expert FFN width {moe.expert_ffn_hidden_size}")


def schedule_problem(model, job, p, bad) -> None:
    """The schedule family exists and fits the placement (docs/schedules.md): pp >= 2 beyond 1F1B; the V-shaped
    ones with vpp = 2 (two chunks per rank), m >= 2 pp and a model of one layer kind (the V's layer-to-rank map of
    dense and MoE layers is not encoded)."""
    from formulation.physics import layer_kinds, v_schedules
    from formulation.physics.schedules import FAMILIES
    if p.schedule not in FAMILIES:
        bad("schedule", f"expected one of {', '.join(FAMILIES)}; got {p.schedule!r}")
    if p.schedule != "1f1b" and p.pp < 2:
        bad("schedule", f"schedule {p.schedule} needs pp >= 2")
    if p.schedule in v_schedules.V_FAMILIES:
        if p.vpp != 2:
            bad("schedule", f"schedule {p.schedule} runs two chunks per rank: vpp must be 2, got {p.vpp}")
        m, least = p.num_micro_batches(job.global_batch_size), v_schedules.min_micro_batches(p.pp)
        if m < least:
            bad("schedule", f"schedule {p.schedule} needs at least 2 x pp = {least} micro-batches, got {m}")
        if layer_kinds.is_mixed(model):
            bad("schedule", f"schedule {p.schedule} is searched for models of one layer kind (dense or all-MoE)")
