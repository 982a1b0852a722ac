"""The rank-order geometry of the incremental scorer: which ranks form each tp group, cp ring, expert group and
data-parallel (shard / replicate) group of a stage, and which of them a permutation change touches.

`RankGroups` is a mixin of `solvers.local.fast_score.FastScorer`: it reads the scorer's sizes (tp, cp, ep, etp, S,
dp, pp, vpp, r, block, n_shard, world), its permutation and class table, and holds no state of its own. The group
orders are `formulation.space.Placement`'s (Megatron's tp-cp-dp-pp order, the expert order etp-ep-edp), so a group
here holds the same GPUs as the evaluator's (tests/test_annealing.py checks the totals on random walks).
"""

from __future__ import annotations


class RankGroups:
    def _group_positions(self, kind: str, stage: int, g: int) -> range:
        """Rank positions of group g of `kind` (tp, cp, ep, etp, edp or dp: shard groups, then replicate groups)."""
        base, tp, cp = stage * self.S, self.tp, self.cp
        if kind == "tp":
            return range(base + g * tp, base + (g + 1) * tp)
        if kind == "cp":  # g = dp_i * tp + tp_i
            d, t = divmod(g, tp)
            return range(base + t + tp * cp * d, base + tp * cp * (d + 1), tp)
        ep, etp = self.ep, self.etp  # expert order etp-ep-edp (Placement.expert_grid)
        if kind == "etp":
            return range(base + g * etp, base + (g + 1) * etp)
        if kind == "ep":  # g = edp_i * etp + etp_i
            d, t = divmod(g, etp)
            return range(base + t + etp * ep * d, base + etp * ep * (d + 1), etp)
        if kind == "edp":  # g = ep_i * etp + etp_i
            return range(base + g, base + self.S, etp * ep)
        if self.r == 1:
            return range(base + g, base + self.S, tp)  # "dp": Megatron's dp x cp group of tp coordinate g
        if g < self.n_shard:  # shard group g = replica x tp + tp coordinate
            d, t = divmod(g, tp)
            return range(base + t + self.block * d, base + self.block * (d + 1), tp)
        return range(base + g - self.n_shard, base + self.S, self.block)  # replicate group of a replica position


    def _touch_experts(self, touched: dict, i: int, q: int) -> None:
        """The expert groups rank position q of stage i belongs to (etp-ep-edp order)."""
        ep, etp = self.ep, self.etp
        if ep > 1:
            touched.setdefault(("ep", i), {})[(q // (etp * ep)) * etp + q % etp] = None
        if etp > 1:
            touched.setdefault(("etp", i), {})[q // etp] = None
        if self.S // (ep * etp) > 1:
            touched.setdefault(("edp", i), {})[q % (etp * ep)] = None

    def _touched_groups(self, changes: dict, old: dict) -> tuple[dict, dict]:
        """The groups and sends a permutation change touches, (kind, stage) -> {index: None}, and the new GPU-type
        counts of the stages whose types change."""
        S, tp, cp, pp, perm = self.S, self.tp, self.cp, self.pp, self.perm
        touched: dict = {}  # (kind, stage) -> {index: value}
        counts: dict = {}
        cls = self.class_of
        for x in changes:
            if x >= self.world or cls[old[x]] == cls[perm[x]]:  # same class: no group or send changes
                continue
            i, q = divmod(x, S)
            if tp > 1:
                touched.setdefault(("tp", i), {})[q // tp] = None
            if cp > 1:
                touched.setdefault(("cp", i), {})[(q // (tp * cp)) * tp + q % tp] = None
            if self.dp * cp > 1 and self.r == 1:
                touched.setdefault(("dp", i), {})[q % tp] = None
            elif self.dp * cp > 1:  # its shard group (if it has one) and its replicate group
                if self.n_shard:
                    touched.setdefault(("dp", i), {})[(q // self.block) * tp + q % tp] = None
                touched.setdefault(("dp", i), {})[self.n_shard + q % self.block] = None
            if self.moe:
                self._touch_experts(touched, i, q)
            if i > 0:
                touched.setdefault(("pair", i - 1), {})[q] = None
            if i < pp - 1:
                touched.setdefault(("pair", i), {})[q] = None
            if self.vpp > 1 and i in (0, pp - 1):
                touched.setdefault(("pair", pp - 1), {})[q] = None
            if self.multi_type and self.type_of[old[x]] != self.type_of[perm[x]]:
                c = counts.setdefault(i, list(self.counts[i]))
                c[self.type_of[old[x]]] -= 1
                c[self.type_of[perm[x]]] += 1
        return touched, counts
