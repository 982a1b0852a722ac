"""The lower bounds' view of a model with dense and MoE layers (docs/moe.md (E1)): the bounds reason about one
per-layer time per stage, here an MoE layer's (`KindUnit`), so each stage's time is bounded below by
l_i u_i - D_i s_i, D_i the most dense layers stage i can hold and s_i what a dense layer saves against u_i with
the same groups; its dp sync per layer mix it can hold (solvers/bounds/parts.py), its optimizer by the lighter
kind."""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from formulation.physics import cost, layer_kinds
from formulation.physics.memory import memory_coefficients, stage_memory
from formulation.physics.stage import layer_time, stage_constants

INF = float("inf")


class KindUnit(float):
    """An MoE layer's time with given slowest groups, carrying `saving`: how much less a dense layer of the same
    stage takes with the same groups (>= 0). A stage of l layers, at most D_i of them dense, with groups no faster
    takes at least l x this - D_i x saving: n_m u_m + n_d u_d = l u_m - n_d (u_m - u_d), every time
    non-decreasing in the groups' times and the dense layer paying no expert communication."""

    saving: float

    def __new__(cls, value: float, saving: float) -> "KindUnit":
        unit = super().__new__(cls, value)
        unit.saving = saving
        return unit


def kind_unit(instance, p, gpu_type, tp: float, cp: float, ag: float, rs: float, ep: float) -> KindUnit:
    """`Parts.unit` of a model with dense and MoE layers: the MoE layer's time and the dense layer's saving."""
    overlap = instance.training.tp_comm_overlap
    moe = layer_time(stage_constants(instance, p, 0, gpu_type, "moe"), overlap, tp, cp, ag, rs, ep)
    dense = layer_time(stage_constants(instance, p, 0, gpu_type, "dense"), overlap, tp, cp, ag, rs)
    u_m, u_d = moe.forward + moe.backward, dense.forward + dense.backward
    return KindUnit(u_m, max(0.0, u_m - u_d))


def dense_saving(u) -> float:
    """What a dense layer saves against the per-layer time `u` (0 for a model of one kind's plain float)."""
    return getattr(u, "saving", 0.0)


def most_dense_layers(model, p) -> tuple:
    """D_i per stage (the most dense layers stage i can hold in any partition); () for a model of one kind."""
    if not layer_kinds.is_mixed(model):
        return ()
    return tuple(layer_kinds.most_dense_layers(model, p.pp, p.vpp, i) for i in range(p.pp))


@dataclasses.dataclass(frozen=True)
class KindPartitions:
    """What the least slowest stage of a model with dense and MoE layers needs: the folded MoE prefix count F
    (E1a) and, per stage, its memory as an affine function of its two layer counts, total(n_d, n_m) = base +
    dense n_d + moe n_m, against its limit (on the roomiest GPU type, as the capacities)."""

    vpp: int
    prefix: tuple[int, ...]
    memory: tuple[tuple[float, float, float, float], ...]  # per stage (base, dense, moe, limit) GiB

    def fits(self, i: int, dense: int, moe: int) -> bool:
        base, per_dense, per_moe, limit = self.memory[i]
        return base + per_dense * dense + per_moe * moe <= limit * (1 + 1e-9)  # a relaxation: rounding admits

    def alike(self) -> "KindPartitions":
        """Every stage with the roomiest memory of any (component-wise least, largest limit): a relaxation under
        which stages of only MoE layers at one per-layer time are interchangeable."""
        base, dense, moe = (min(m[j] for m in self.memory) for j in range(3))
        roomiest = (base, dense, moe, max(m[3] for m in self.memory))
        return dataclasses.replace(self, memory=(roomiest,) * len(self.memory))

    def least_slowest_stage(self, us: list, extras: list[float], fixed: dict[int, int] | None = None) -> float:
        """A lower bound of the smallest max_i (n_d u^d_i + n_m u_i + extra_i) over partitions into contiguous
        ranges in layer order that fit in memory, u^d_i = u_i - its saving (`KindUnit`), l_i = fixed[i] where
        given; INF if none. At a level, the stages' reachable end positions are followed as intervals (the
        hull of the true sets: a relaxation): a range costs and holds no more than one containing it, so from
        the interval's last feasible start a stage reaches farthest. The result is the relaxation's least
        level exactly (one of the ranges' costs)."""
        stages = tuple((float(u - dense_saving(u)), float(u), float(e)) for u, e in zip(us, extras))
        return _least_level(self, stages, tuple(sorted((fixed or {}).items())))

    def _least_level(self, stages: tuple, fixed_items: tuple) -> float:
        """`least_slowest_stage` of stages given as (u^d_i, u_i, extra_i)."""
        fixed, P, units = dict(fixed_items), len(stages), len(self.prefix) - 1
        dense_us, us, extras = ([s[j] for s in stages] for j in range(3))

        def ok(i: int, start: int, end: int, level: float) -> bool:
            moe = self.prefix[end] - self.prefix[start]
            dense = self.vpp * (end - start) - moe
            return dense * dense_us[i] + moe * us[i] + extras[i] <= level and self.fits(i, dense, moe)

        def feasible(i: int, starts: range, length: int, level: float) -> tuple[int, int] | None:
            """The first and the last start in `starts` from which stage i can hold `length` positions."""
            first = next((s for s in starts if ok(i, s, s + length, level)), None)
            if first is None:
                return None
            return first, next(s for s in reversed(starts) if ok(i, s, s + length, level))

        def holds(level: float) -> bool:
            a = b = 0  # the stage starts somewhere in [a, b]
            for i in range(P):
                hi = units - (P - 1 - i)
                q = fixed[i] // self.vpp if i in fixed else 1
                found = feasible(i, range(a, min(b, hi - q) + 1), q, level)
                if found is None:
                    return False
                if i in fixed:
                    a, b = found[0] + q, found[1] + q
                    continue
                end = found[1] + 1
                while end < hi and ok(i, found[1], end + 1, level):
                    end += 1
                a, b = found[0] + 1, end
            return a <= units <= b

        top = max(self.vpp * units * max(u, d) + e for u, d, e in zip(us, dense_us, extras)) + 1.0
        if not holds(top):
            return INF
        # `holds` changes only where some range's cost equals the level: the least level that holds is the
        # least such cost that does (binary search over them, ~12 calls of `holds` instead of ~45 halvings)
        levels = self._range_costs(stages)
        lo, hi = 0, len(levels)  # levels[hi] holds (or hi is past the end: `top` holds)
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if holds(float(levels[mid])) else (mid + 1, hi)
        return float(levels[lo]) if lo < len(levels) else top

    def _range_costs(self, stages: tuple) -> np.ndarray:
        """Every cost `ok` can compare with a level, sorted: n_d u^d + n_m u + extra of every range of positions,
        for each distinct stage (u^d, u, extra), in `ok`'s order of operations so that the floats are equal."""
        units = len(self.prefix) - 1
        prefix = np.asarray(self.prefix, dtype=np.int64)
        start, end = np.triu_indices(units + 1, k=1)
        moe = prefix[end] - prefix[start]
        dense = self.vpp * (end - start) - moe
        costs = [dense * du + moe * u + extra for du, u, extra in dict.fromkeys(stages)]
        return np.unique(np.concatenate(costs))


@functools.lru_cache(maxsize=4096)
def _least_level(partitions: KindPartitions, stages: tuple, fixed_items: tuple) -> float:
    """Kept: the bounds ask for the same stages again (about 4 calls in 9 on DeepSeek-V3's search)."""
    return partitions._least_level(stages, fixed_items)


def kind_partitions(instance, p, gpu_type) -> KindPartitions:
    """`KindPartitions` of the template `p` (its stages' memory is affine in (n_d, n_m): read off at three
    points)."""
    model = instance.model
    memory = []
    for i in range(p.pp):
        empty = stage_memory(instance, p, i, 0, gpu_type).total_gib
        moe = stage_memory(instance, p, i, 1, gpu_type).total_gib - empty
        dense = stage_memory(instance, p, i, 1, gpu_type, dense_layers=1).total_gib - empty
        memory.append((empty, dense, moe, instance.training.memory_limit_fraction * gpu_type.memory_gib))
    return KindPartitions(p.vpp, layer_kinds.folded_moe_prefix(model, p.vpp), tuple(memory))


def least_optimizer_step(instance, p, gpu_type) -> float:
    """The cheapest optimizer step (C13) of a stage holding ceil(L / pp) layers (some stage holds at least as
    many), per layer the lighter kind's state where the model has both (E1): a lower bound whatever the mix."""
    heavy = math.ceil(instance.model.num_layers / p.pp)

    def state(stage: int) -> float:
        fixed, per_layer = memory_coefficients(instance, p, stage).optimizer
        if layer_kinds.is_mixed(instance.model):
            per_layer = min(per_layer, memory_coefficients(instance, p, stage, "dense").optimizer[1])
        return fixed + per_layer * heavy

    o_bytes = instance.training.bytes_per_param_state[2]
    return min(cost.optimizer_step_time(state(i) / o_bytes, gpu_type) for i in range(p.pp))


def kind_parts(instance, p) -> tuple[tuple, KindPartitions | None]:
    """(D_i per stage, KindPartitions on the roomiest GPU type) of a model with dense and MoE layers, else
    ((), None): what `Parts` needs to bound stages by their layers' kinds."""
    if not layer_kinds.is_mixed(instance.model):
        return (), None
    roomiest = max(instance.cluster.gpu_types.values(), key=lambda g: g.memory_gib)
    return most_dense_layers(instance.model, p), kind_partitions(instance, p, roomiest)


class KindBounds:
    """`Parts`' methods for a model with dense and MoE layers (docs/moe.md (E1)): the stage's dp sync is bounded
    per layer mix it can hold (each exactly, with MixedConstants), and some stage holds at least the average
    number of MoE layers."""

    def mixes(self, stage: int) -> list:
        """(E1) The layer mixes `stage` can hold within memory (models with both layer kinds)."""
        if ("mixes", stage) not in self._constants:
            self._constants[("mixes", stage)] = [
                mix for mix in layer_kinds.possible_mixes(self.instance.model, self.config.pp, self.config.vpp, stage)
                if self.kinds.fits(stage, mix.dense, mix.moe)]
        return self._constants[("mixes", stage)]

    def mix_floor(self, stage: int, keep, inter: float, min_nodes: int, per_node_cap: int | None = None) -> float:
        """The least exposed dp sync of `stage` over the mixes it can hold that `keep` accepts (INF: none)."""
        return min((sum(self.dp_part_exposures(stage, mix, inter, min_nodes, per_node_cap))
                    for mix in self.mixes(stage) if keep(mix)), default=INF)

    def moe_loaded_floor(self, stage: int) -> float:
        """The least exposed dp sync of `stage` holding at least ceil(MoE layers / pp) MoE layers, as some stage
        does (INF where it cannot)."""
        heavy = math.ceil(self.instance.model.moe.num_moe_layers / self.config.pp)
        return self.mix_floor(stage, lambda mix: mix.moe >= heavy, self.inter, 1)

    def slowest_anywhere(self, k: int, slow) -> tuple[float, float]:
        """`Parts.pipeline_any`'s least slowest stage with k stages at `slow` wherever they sit, and the most
        the model's dense layers save in the stage sum. The stages that may hold a dense layer form a prefix
        (they are taken fast); the others hold MoE layers only and, under the roomiest memory and no extras,
        are alike, so at least k - |prefix| slow ones among them may as well be the last."""
        P, u = self.config.pp, self.u
        front = max((i + 1 for i, d in enumerate(self.dense_layers) if d), default=0)
        back = max(0, k - front)
        M = self.kinds.alike().least_slowest_stage([u] * (P - back) + [max(slow, u)] * back, [0.0] * P)
        model = self.instance.model
        return M, (model.num_layers - model.moe.num_moe_layers) * max(dense_saving(slow), dense_saving(u))
