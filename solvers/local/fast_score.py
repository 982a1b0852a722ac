"""Incremental scoring of one configuration's placements: the evaluator's iteration time, move by move.

`FastScorer` holds a complete placement (layer partition + rank-to-GPU permutation) and caches what
`formulation.evaluate` computes from it: every tensor-parallel group's, context-parallel ring's and data-parallel
group's links and times, every pipeline pair's send time, and each stage's composed time, exposed data-parallel
sync, optimizer step, overhead and memory verdict. A move recomputes only the groups and stages it touches, and
every number comes from the evaluator's own public functions (formulation/evaluate.py: group_comm for a tp
group or cp ring, cost.collective_time for a dp group, pipeline_send for a pipeline pair, links_from_groups and
stage_estimate for a stage, compose_iteration for the iteration), fed with the cached group values: nothing of
the cost or memory model is repeated here, so the total equals evaluate(...).iteration_time_s by construction
(tests/test_annealing.py checks it on random walks, and anneal() re-evaluates its result and raises if the two
ever disagree).

Memoisation is exact: a group's links depend only on its GPU set, and permuting the GPUs inside a uniform class
(`Cluster.uniform_classes`, refined here so that columns of an asymmetric intra-node matrix match too) is an
automorphism of the bandwidth model, so links are cached by the multiset of classes of the group's members and
pipeline sends by the (class, class) pair. A stage's type and memory depend only on the GPU types of the stage,
so one GPU of each type stands for them.

Positions: `perm[r]` is the GPU of rank r for r < world; positions world..N-1 hold the spare GPUs (a swap
with one of them brings a spare GPU in). Protocol: `propose_perm(changes)` or `propose_layers(layers)` returns
the new total (None if a stage no longer fits), then `commit(total)` or `reject()`. `slack` (sum of every group's
and pipeline pair's time, where the total sees only maxima) is a tie-break for the annealer only. Which ranks form
each group, and which groups a move touches, is the rank-order geometry of solvers/local/rank_groups.py (a mixin).
"""

from __future__ import annotations

import numpy as np

from formulation.physics import cost, layer_kinds
from formulation.physics.moe_cost import is_moe
from formulation.evaluate import compose_iteration, stage_estimate
from formulation.stage_links import group_comm, links_from_groups, pipeline_message, pipeline_send
from formulation.physics.stage import dp_sync_parts
from formulation.space import placement_for

from solvers.local.gpu_classes import safe_classes
from solvers.local.rank_groups import RankGroups

MEMO_LIMIT = 20_000_000  # group members held in cache keys (about 160 MB) before the caches are dropped


def _new_max(values: list, current: float, changes: dict) -> float:
    """max(values with `changes` applied) from the cached maximum; exact, rescans only when the maximum left."""
    if not changes:
        return current
    top = max(changes.values())
    if top >= current or all(values[k] < current for k in changes):
        return max(top, current)
    return max(top, max((v for k, v in enumerate(values) if k not in changes), default=top))


class FastScorer(RankGroups):
    def __init__(self, instance, config, layers, perm):
        self.instance, self.config = instance, config
        self.model, self.job, self.cluster = instance.model, instance.training, instance.cluster
        c = config
        self.tp, self.pp, self.cp, self.dp, self.vpp = c.tp, c.pp, c.cp, c.dp, c.vpp
        self.S = c.tp * c.cp * c.dp  # ranks per stage
        self.ep, self.etp = c.ep, c.etp  # expert groups over the same ranks (mixture-of-experts; 1, 1 when dense)
        self.moe = is_moe(instance.model)
        # the stage's "dp" groups: Megatron's dp x cp groups (one per tp coordinate); with dp_replicate > 1 its
        # shard groups (one per replica and tp coordinate; none of one rank) and then its replicate groups
        self.r, self.block = c.dp_replicate, c.tp * c.shard_size  # a replica's ranks in a stage
        self.n_shard = (c.tp * self.r if c.shard_size > 1 else 0) if self.r > 1 else c.tp
        self.n_dp = self.n_shard + (self.block if self.r > 1 else 0)
        self.world = self.S * c.pp
        self.N = self.cluster.num_gpus
        self.probe = placement_for(config, tuple(layers), range(self.world))
        self.m = self.probe.num_micro_batches(self.job.global_batch_size)
        self.class_of = safe_classes(self.cluster)
        names = sorted(self.cluster.gpu_types)
        self.type_names = names
        self.type_of = [names.index(self.cluster.nodes[n].gpu_type) for n in self.cluster.gpu_node]
        self.multi_type = len(set(self.type_of)) > 1
        self.rep_gpu = {t: self.type_of.index(t) for t in set(self.type_of)}  # one GPU of every type
        self.p2p_message = pipeline_message(instance, self.probe)
        self.w_bytes, _, self.o_bytes = self.job.bytes_per_param_state
        self.g_bytes = self.job.grad_reduce_bytes  # gradients are reduced in this dtype
        self._ids, self.links, self._val, self._pair, self._weight = {}, [], {}, {}, 0
        self._type, self._stage_links, self._stages = {}, {}, {}
        self.perm = [int(g) for g in perm]
        if len(self.perm) < self.N:  # the rank GPUs only: the other GPUs become spares
            used = set(self.perm)
            self.perm += [g for g in range(self.N) if g not in used]
        if sorted(self.perm) != list(range(self.N)):
            raise ValueError("perm must list every GPU of the cluster once (ranks first, then spares)")
        self.layers = [int(x) for x in layers]
        self.rebuild()

    # ---- groups -------------------------------------------------------------------------------------------
    def group_id(self, positions) -> int:
        """Interned id of the group's class multiset; its links are `self.links[id]`."""
        perm, cls = self.perm, self.class_of
        key = tuple(sorted([cls[perm[x]] for x in positions]))
        gid = self._ids.get(key)
        if gid is None:
            self._weight += len(key)
            gid = self._ids[key] = len(self.links)
            self.links.append(cost.group_links(self.cluster, np.array([perm[x] for x in positions])))
        return gid

    def _group_value(self, kind: str, gid: int) -> float:
        key = (kind, gid)
        v = self._val.get(key)
        if v is None:
            v = self._val[key] = group_comm(self.instance, self.probe, kind, self.links[gid])
        return v

    def _collective(self, kind: str, message: float, gid: int) -> float:
        key = (kind, message, gid)
        v = self._val.get(key)
        if v is None:
            v = self._val[key] = cost.collective_time(kind, message, self.links[gid], self.cluster)
        return v

    def _pair_value(self, src: int, dst: int) -> float:
        key = (self.class_of[src], self.class_of[dst])
        v = self._pair.get(key)
        if v is None:
            v = self._pair[key] = pipeline_send(self.cluster, self.p2p_message, src, dst)
        return v

    # ---- stages -------------------------------------------------------------------------------------------
    def _stage_type(self, counts) -> tuple:
        """Key of the stage's GPU types (its pace and memory depend on nothing else of its GPUs)."""
        key = tuple(t for t, n in enumerate(counts) if n) if self.multi_type else (self.type_of[0],)
        if key not in self._type:
            self._type[key] = np.array([self.rep_gpu[t] for t in key])  # one GPU of every type
        return key

    def stage_fits(self, i: int, layers: int, tkey: tuple) -> bool:
        """Whether stage i, on GPUs of the types `tkey` (its current ones), fits with `layers` layers (any mix)."""
        return all(self._stage(i, u, tkey, self.tp_max[i], self.cp_max[i], self.dp_ids[i], self._moe_of(i))[4]
                   for u in layer_kinds.memory_probes(self.model, self.pp, self.vpp, i, layers))

    def _moe_of(self, i: int, new_max: dict | None = None, new_edp: dict | None = None) -> tuple:
        """Stage i's expert groups as the stage sees them: (slowest ep + slowest etp forward time, edp group ids)."""
        if not self.moe:
            return (0.0, ())
        new_max, new_edp = new_max or {}, new_edp or {}
        return (new_max.get(("ep", i), self.ep_max[i]) + new_max.get(("etp", i), self.etp_max[i]),
                tuple(new_edp.get(i, self.edp_ids[i])))

    def _stage(self, i: int, layers: int, tkey: tuple, tp: float, cp: float, dp_ids: list,
               moe: tuple = (0.0, ())) -> tuple:
        """(time per micro-batch, exposed dp sync, optimizer, overhead, fits, slack, StageEstimate): the
        evaluator's own stage functions (links_from_groups, stage_estimate) on the cached group values, memoised
        on their inputs (dp_ids: the stage's data-parallel groups); slack is a tie-break only."""
        key = (i, layers, tkey, tp, cp, tuple(dp_ids), moe)
        out = self._stages.get(key)
        if out is None:
            self._weight += 8 + len(dp_ids)
            lkey = key[:1] + key[2:]
            links = self._stage_links.get(lkey)
            if links is None:
                links = self._stage_links[lkey] = links_from_groups(
                    self.instance, self.probe, i, self._type[tkey], tp, cp,
                    tuple(self.links[g] for g in dp_ids[:self.n_shard]), moe[0], tuple(self.links[g] for g in moe[1]),
                    tuple(self.links[g] for g in dp_ids[self.n_shard:]))
            est = stage_estimate(self.instance, self.probe, i, layers, links)  # a count or a LayerMix
            overhead = self.cluster.gpu_types[est.gpu_type].iteration_overhead_s
            out = self._stages[key] = (est.time_per_micro_batch_s, est.dp_exposed_s, est.optimizer_s, overhead,
                                       est.memory.fits, self._dp_slack(links.constants, layers, dp_ids), est)
        return out

    def _dp_slack(self, k, layers: int, dp_ids: list) -> float:
        """Sum over the stage's dp groups of their sync (and ZeRO-3 gather) times, where the stage sees only the
        slowest group: a tie-break that steers plateau moves towards faster groups (not part of the time)."""
        if not dp_ids:
            return 0.0
        parts = [(kind, message) for kind, message, _, _ in dp_sync_parts(self.instance, self.probe, k, layers)]
        if self.config.zero_stage >= 3:
            parts += [("all_gather", k.layer_params * self.w_bytes), ("reduce_scatter", k.layer_params * self.g_bytes)]
        return sum(self._collective(kind, message, lk) for kind, message in parts for lk in dp_ids)

    def _compose(self, stages: list, bounds: list, wrap: float) -> float:
        return compose_iteration(self.instance, self.probe, [s[6] for s in stages], bounds, wrap)[0]

    # ---- full build ---------------------------------------------------------------------------------------
    def rebuild(self) -> None:
        S, tp, cp, dp, pp, perm = self.S, self.tp, self.cp, self.dp, self.pp, self.perm
        self.tp_vals, self.cp_vals, self.dp_ids, self.counts = [], [], [], []
        for i in range(pp):
            self.tp_vals.append([self._group_value("tp", self.group_id(self._group_positions("tp", i, g)))
                                 for g in range(dp * cp)] if tp > 1 else [])
            self.cp_vals.append([self._group_value("cp", self.group_id(self._group_positions("cp", i, g)))
                                 for g in range(dp * tp)] if cp > 1 else [])
            self.dp_ids.append([self.group_id(self._group_positions("dp", i, g)) for g in range(self.n_dp)]
                                 if dp * cp > 1 else [])
            self._rebuild_experts(i)
            counts = [0] * len(self.type_names)
            for r in range(i * S, (i + 1) * S):
                counts[self.type_of[perm[r]]] += 1
            self.counts.append(counts)
        self.tp_max = [max(v, default=0.0) for v in self.tp_vals]
        self.cp_max = [max(v, default=0.0) for v in self.cp_vals]
        self.ep_max = [max(v, default=0.0) for v in self.ep_vals]
        self.etp_max = [max(v, default=0.0) for v in self.etp_vals]
        self.pairs = [[self._pair_value(perm[j * S + q], perm[(j + 1) * S + q]) for q in range(S)]
                      for j in range(pp - 1)]
        if self.vpp > 1:
            self.pairs.append([self._pair_value(perm[(pp - 1) * S + q], perm[q]) for q in range(S)])
        self.pair_max = [max(v) for v in self.pairs]
        self.tkeys = [self._stage_type(c) for c in self.counts]
        unit = layer_kinds.stage_units(self.model, self.layers, self.vpp)  # counts, or LayerMix (E1)
        self.stages = [self._stage(i, unit[i], self.tkeys[i], self.tp_max[i], self.cp_max[i], self.dp_ids[i],
                                   self._moe_of(i)) for i in range(pp)]
        self.total = self._compose(self.stages, self.pair_max[:pp - 1], self.pair_max[-1] if self.vpp > 1 else 0.0)
        self.fits = all(s[4] for s in self.stages)
        self.slack = (sum(map(sum, self.tp_vals)) + sum(map(sum, self.cp_vals)) + sum(map(sum, self.pairs))
                      + sum(map(sum, self.ep_vals)) + sum(map(sum, self.etp_vals)) + sum(s[5] for s in self.stages))
        self._pending, self.pending_slack = None, self.slack

    def _rebuild_experts(self, i: int) -> None:
        """Stage i's expert-parallel and expert-tp group values and expert-data-parallel group ids."""
        if i == 0:
            self.ep_vals, self.etp_vals, self.edp_ids = [], [], []
        S, ep, etp = self.S, self.ep, self.etp
        moe = self.moe
        self.ep_vals.append([self._group_value("ep", self.group_id(self._group_positions("ep", i, g)))
                             for g in range(S // ep)] if moe and ep > 1 else [])
        self.etp_vals.append([self._group_value("etp", self.group_id(self._group_positions("etp", i, g)))
                              for g in range(S // etp)] if moe and etp > 1 else [])
        self.edp_ids.append([self.group_id(self._group_positions("edp", i, g)) for g in range(ep * etp)]
                            if moe and S // (ep * etp) > 1 else [])

    # ---- moves --------------------------------------------------------------------------------------------
    def propose_perm(self, changes: dict) -> float | None:
        """Score the permutation with `changes` (position -> new GPU) applied; None if a stage stops fitting.
        The changes are written into `perm` at once: call `commit()` or `reject()` next."""
        pp, perm = self.pp, self.perm
        old = {x: perm[x] for x in changes}
        for x, g in changes.items():
            perm[x] = g
        touched, counts = self._touched_groups(changes, old)
        self._value_touched(touched)
        new_max, new_dp, new_edp = {}, {}, {}
        stages, pair_max = list(self.stages), list(self.pair_max)
        slack = self.slack
        dirty = set(counts)
        for (kind, i), idx in touched.items():
            if kind in ("tp", "cp", "ep", "etp"):
                values, current = self._vals(kind)[i], self._maxes(kind)[i]
                new_max[(kind, i)] = _new_max(values, current, idx)
                slack += sum(v - values[g] for g, v in idx.items())
                dirty.add(i)
            elif kind in ("dp", "edp"):
                links = list((self.dp_ids if kind == "dp" else self.edp_ids)[i])
                for g, lk in idx.items():
                    links[g] = lk
                (new_dp if kind == "dp" else new_edp)[i] = links
                dirty.add(i)
            else:
                pair_max[i] = _new_max(self.pairs[i], self.pair_max[i], idx)
                slack += sum(v - self.pairs[i][g] for g, v in idx.items())
        tkeys = list(self.tkeys)
        unit = layer_kinds.stage_units(self.model, self.layers, self.vpp)  # counts, or LayerMix (E1)
        for i in dirty:
            if i in counts:
                tkeys[i] = self._stage_type(counts[i])
            stages[i] = self._stage(i, unit[i], tkeys[i], new_max.get(("tp", i), self.tp_max[i]),
                                    new_max.get(("cp", i), self.cp_max[i]), new_dp.get(i, self.dp_ids[i]),
                                    self._moe_of(i, new_max, new_edp))
            slack += stages[i][5] - self.stages[i][5]
        self.pending_slack = slack
        self._pending = ("perm", old, touched, new_max, new_dp, counts, tkeys, stages, pair_max)
        if not all(stages[i][4] for i in dirty):
            return None
        return self._compose(stages, pair_max[:pp - 1], pair_max[-1] if self.vpp > 1 else 0.0)

    def _vals(self, kind: str) -> list:
        return {"tp": self.tp_vals, "cp": self.cp_vals, "ep": self.ep_vals, "etp": self.etp_vals}[kind]

    def _maxes(self, kind: str) -> list:
        return {"tp": self.tp_max, "cp": self.cp_max, "ep": self.ep_max, "etp": self.etp_max}[kind]

    def _value_touched(self, touched: dict) -> None:
        """Each touched group's new link value (a group id for dp groups), in place."""
        S, pp, perm = self.S, self.pp, self.perm
        for (kind, i), idx in touched.items():
            for g in idx:
                if kind == "pair":
                    src = perm[i * S + g]
                    dst = perm[(i + 1) * S + g] if i < pp - 1 else perm[g]
                    idx[g] = self._pair_value(src, dst)
                elif kind in ("dp", "edp"):
                    idx[g] = self.group_id(self._group_positions(kind, i, g))
                else:
                    idx[g] = self._group_value(kind, self.group_id(self._group_positions(kind, i, g)))

    def propose_layers(self, layers: list) -> float | None:
        """Score the partition `layers` (same map); None if a stage stops fitting or holds no layer."""
        stages = list(self.stages)
        new, old = (layer_kinds.stage_units(self.model, x, self.vpp) for x in (layers, self.layers))  # (E1)
        dirty = [i for i in range(self.pp) if new[i] != old[i]]
        for i in dirty:
            stages[i] = self._stage(i, new[i], self.tkeys[i], self.tp_max[i], self.cp_max[i], self.dp_ids[i],
                                    self._moe_of(i))
        self.pending_slack = self.slack + sum(stages[i][5] - self.stages[i][5] for i in dirty)
        self._pending = ("layers", list(layers), stages)
        if min(layers) < 1 or not all(stages[i][4] for i in dirty):
            return None
        return self._compose(stages, self.pair_max[:self.pp - 1], self.pair_max[-1] if self.vpp > 1 else 0.0)

    def commit(self, total: float) -> None:
        pend, self._pending = self._pending, None
        if pend[0] == "layers":
            self.layers, self.stages = pend[1], pend[2]
        else:
            _, _, touched, new_max, _, counts, tkeys, stages, pair_max = pend
            for (kind, i), idx in touched.items():
                target = {"tp": self.tp_vals, "cp": self.cp_vals, "dp": self.dp_ids, "pair": self.pairs,
                          "ep": self.ep_vals, "etp": self.etp_vals, "edp": self.edp_ids}[kind][i]
                for g, v in idx.items():
                    target[g] = v
            for (kind, i), v in new_max.items():
                self._maxes(kind)[i] = v
            for i, c in counts.items():
                self.counts[i] = c
            self.tkeys, self.stages, self.pair_max = tkeys, stages, pair_max
        self.total, self.slack = total, self.pending_slack
        self.fits = all(st[4] for st in self.stages)
        self._trim()

    def reject(self) -> None:
        pend, self._pending = self._pending, None
        if pend is not None and pend[0] == "perm":
            for x, g in pend[1].items():
                self.perm[x] = g
        self._trim()

    def _trim(self) -> None:
        """Bound the memory of the caches (group keys grow with the group size): past MEMO_LIMIT member
        entries, forget every group and stage cached and rebuild the state (exact, like a restart)."""
        if self._weight > MEMO_LIMIT:
            self._ids, self.links, self._val, self._stages, self._weight = {}, [], {}, {}, 0
            self._stage_links = {}
            self.rebuild()

    def placement(self):
        return placement_for(self.config, self.layers, self.perm[:self.world])

    def proposed_placement(self):
        """The placement the pending proposal would give (for checks)."""
        layers = self._pending[1] if self._pending and self._pending[0] == "layers" else self.layers
        return placement_for(self.config, layers, self.perm[:self.world])
