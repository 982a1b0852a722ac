"""Which layers of each pipeline stage are dense and which are mixture-of-experts (docs/moe.md (E1)).

A model's layer pattern (`MoE.layer_pattern`: 1 = MoE, 0 = dense, Megatron-LM's `--moe-layer-freq` list) may
mix the two kinds: DeepSeek-V3's first three layers are dense, Qwen's `mlp_only_layers` and `decoder_sparse_step`
and DeepSeek's `moe_layer_freq` > 1 interleave them. A stage's cost and memory then depend on how many layers of
each kind it holds (`LayerMix`), not only on its layer count.

Layer order (Megatron-LM, `--pipeline-model-parallel-layout` and `get_transformer_layer_offset`): with vpp
model chunks per stage, virtual stage c pp + i is chunk c of stage i, each chunk of stage i holding
l_i / vpp consecutive layers. So chunk c of stage i holds layers c L / vpp + [S_i, S_{i+1}) with S_i =
sum_{j < i} l_j / vpp, the stage's *boundary positions* in units of chunk layers (0 <= S_i <= L / vpp).
Stage i's MoE layers are therefore F(S_{i+1}) - F(S_i), where

    F(s) = #{MoE layers c L / vpp + r : 0 <= c < vpp, 0 <= r < s}          (E1a)

is the pattern folded over the vpp chunks (vpp = 1: the plain prefix count). The programs encode a partition
by its boundary positions, in which the MoE counts are linear (docs/programs.md (P2b)).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class LayerMix:
    """A stage's layers by kind."""

    dense: int
    moe: int

    @property
    def total(self) -> int:
        return self.dense + self.moe


def is_mixed(model) -> bool:
    """The model has layers of both kinds (only then does a stage's mix, not its count, decide its cost)."""
    return model.moe is not None and 0 < model.moe.num_moe_layers < model.num_layers


def uniform_mix(model, layers: int) -> LayerMix:
    """`layers` layers of a model whose layers are all of one kind."""
    return LayerMix(0, layers) if model.moe is not None and model.moe.num_moe_layers else LayerMix(layers, 0)


def folded_moe_prefix(model, vpp: int) -> tuple[int, ...]:
    """(E1a) F(s) for s = 0 .. L / vpp (vpp must divide L, as every stage's count is a multiple of vpp)."""
    L = model.num_layers
    if L % vpp:
        raise ValueError(f"vpp={vpp} does not divide the {L} layers")
    pattern = model.moe.layer_pattern if model.moe is not None else (0,) * L
    width = L // vpp
    prefix = [0]
    for r in range(width):
        prefix.append(prefix[-1] + sum(pattern[c * width + r] for c in range(vpp)))
    return tuple(prefix)


def mix_between(model, vpp: int, start: int, end: int, prefix: tuple[int, ...] | None = None) -> LayerMix:
    """The layers of a stage whose boundary positions are [start, end) (chunk units, (E1a))."""
    prefix = prefix or folded_moe_prefix(model, vpp)
    moe = prefix[end] - prefix[start]
    return LayerMix(vpp * (end - start) - moe, moe)


def stage_mixes(model, layers_per_stage, vpp: int) -> tuple[LayerMix, ...]:
    """Every stage's mix for a partition (layers_per_stage[i] a multiple of vpp)."""
    if not is_mixed(model):
        return tuple(uniform_mix(model, q) for q in layers_per_stage)
    prefix = folded_moe_prefix(model, vpp)
    out, start = [], 0
    for q in layers_per_stage:
        end = start + q // vpp
        out.append(mix_between(model, vpp, start, end, prefix))
        start = end
    return tuple(out)


def stage_window(num_layers: int, pp: int, vpp: int, stage: int) -> tuple[int, int]:
    """The boundary positions stage i can span when every stage holds at least vpp layers (one per chunk):
    it starts at position >= i and ends at <= L / vpp - (pp - 1 - i)."""
    return stage, num_layers // vpp - (pp - 1 - stage)


def possible_mixes(model, pp: int, vpp: int, stage: int) -> dict[LayerMix, list[tuple[int, int]]]:
    """Every mix stage i can hold in some partition, with the (start, end) position pairs that give it: the
    first stage starts at 0, the last ends at L / vpp, the others lie in their `stage_window`."""
    lo, hi = stage_window(model.num_layers, pp, vpp, stage)
    prefix = folded_moe_prefix(model, vpp)
    out: dict[LayerMix, list[tuple[int, int]]] = {}
    for start in ([0] if stage == 0 else range(lo, hi)):
        for end in ([hi] if stage == pp - 1 else range(start + 1, hi + 1)):
            if end > start:
                out.setdefault(mix_between(model, vpp, start, end, prefix), []).append((start, end))
    return out


@functools.lru_cache(maxsize=1024)
def most_dense_layers(model, pp: int, vpp: int, stage: int) -> int:
    """The most dense layers stage i can hold in any partition (for bounds)."""
    if not is_mixed(model):
        return 0 if model.moe is not None else model.num_layers
    return max(mix.dense for mix in possible_mixes(model, pp, vpp, stage))


@functools.lru_cache(maxsize=256)
def dense_extremes(model, pp: int, vpp: int, stage: int) -> dict[int, tuple[int, int]]:
    """{layer count l: (fewest, most) dense layers} over the ranges of l layers stage i can hold (memory is
    affine in the two counts, so these extremes decide what fits)."""
    out: dict[int, tuple[int, int]] = {}
    for mix in possible_mixes(model, pp, vpp, stage):
        lo, hi = out.get(mix.total, (mix.dense, mix.dense))
        out[mix.total] = (min(lo, mix.dense), max(hi, mix.dense))
    return out


def stage_units(model, layers_per_stage, vpp: int) -> list:
    """What decides each stage's cost under a partition: its layer count for a model of one kind, else its
    LayerMix."""
    if not is_mixed(model):
        return list(layers_per_stage)
    return list(stage_mixes(model, layers_per_stage, vpp))


def memory_probes(model, pp: int, vpp: int, stage: int, layers: int) -> list:
    """What to check to know that stage i fits with `layers` layers however it mixes them: the count for a model
    of one kind, else the mixes with the most and the fewest dense layers it might hold (memory is affine in
    the two counts, so these two decide)."""
    if not is_mixed(model):
        return [layers]
    dense = min(layers, most_dense_layers(model, pp, vpp, stage))
    moe_layers = model.moe.num_moe_layers
    return [LayerMix(dense, layers - dense), LayerMix(max(0, layers - moe_layers), min(layers, moe_layers))]
