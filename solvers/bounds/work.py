"""(B0) The work bound: the pipeline's compute alone, a lower bound for every partition and GPU map of a
configuration that costs microseconds, so a search with a short budget still proves something.

A stage's time per micro-batch is at least its compute (forward, backward, recompute; on the last stage
the output layer's forward and twice that backward): communication, sync, optimizer and chain only add.
Over the stages that compute sums to W = L x (f + b) + 3 x out, each term at its smallest over the
cluster's GPU types (a stage runs at its slowest GPU, which is no faster than the fastest type). The
schedule (C9) is m x t_max + (sum t - t_max) / vpp = (m - 1/vpp) t_max + (sum t) / vpp, and t_max is at
least the mean W / pp, so

    T >= W / pp x (m + (pp - 1) / vpp) + the smallest per-iteration overhead of any GPU type.

Zero-bubble schedules (docs/schedules.md (S1)): (m - 1/vpp) t_max + sum_j (t_j - 2 W_j) / vpp with each stage's
weight gradient W_j <= t_j / 3, so T >= W / pp x (m + (pp / 3 - 1) / vpp) + the overhead.

f, b and out depend only on tp, cp, micro_batch_size and recompute (and the GPU type; with experts on ep and
etp too), so W is computed once per such combination. The bound ignores memory: the search applies it to
configurations that fit. Mixture-of-experts (B3): every MoE layer also pays at least ep_passes (2 + rp, + 1 under the "moe" recompute module) x the least expert
communication of a layer over every group shape at the cluster's fastest links (`expert_layer_floor`), or under
the all-to-all overlap (docs/moe.md (E10)) that communication's least exposure (`StageConstants.ep_exposed`); with
dense and MoE layers (docs/moe.md (E1)) W counts each kind's layers at their own compute.
"""

from __future__ import annotations

from formulation.physics import layer_kinds
from formulation.physics.stage import stage_constants
from formulation.physics.v_schedules import V_FAMILIES, output_stage
from formulation.space import Config, placement_for

from solvers.bounds.levels import cluster_extremes, level_units, span_bandwidth
from solvers.bounds.parts import expert_layer_floor

# Rounding guard: the bound is compared with evaluator times computed in another order of additions.
_SAFETY = 1 - 1e-9


class WorkBound:
    """(B0) for the configurations of one instance, with W cached per (tp, cp, micro_batch_size, recompute, ep, etp,
    MoE overlap, schedule)."""

    def __init__(self, instance):
        self.instance = instance
        self._work: dict[tuple, float] = {}
        self._overhead = min(g.iteration_overhead_s for g in instance.cluster.gpu_types.values())

    def work(self, config: Config) -> float:
        """W: the compute of one micro-batch summed over all stages, in seconds."""
        # everything the constants below read: the layer's sizes, and the schedule, which places the output layer
        key = (config.tp, config.cp, config.micro_batch_size, config.recompute, config.ep, config.etp,
               config.moe_a2a_overlap, config.schedule)
        if key not in self._work:
            inst = self.instance
            world = config.tp * config.pp * config.cp * config.dp
            p = placement_for(config, (1,) * config.pp, range(world))
            # the output stage's constants carry the output layer (the last stage, the first in a V (S3));
            # per-layer terms are the same on every stage
            ks = [stage_constants(inst, p, output_stage(config.schedule, config.pp), g)
                  for g in inst.cluster.gpu_types.values()]
            cluster = inst.cluster
            experts = expert_layer_floor(inst, p, *cluster_extremes(cluster), *level_units(cluster),
                                         span_bandwidth(cluster))
            if layer_kinds.is_mixed(inst.model):  # (E1) each kind's layers at their own cost
                layers = self._mixed_layers(p, experts)
            else:
                layers = inst.model.num_layers * min(k.f_compute + k.b_compute + k.ep_exposed(experts) for k in ks)
            self._work[key] = layers + 3 * min(k.output_fwd for k in ks)
        return self._work[key]

    def _mixed_layers(self, p, experts: float) -> float:
        """The layers' compute of a model with dense and MoE layers (docs/moe.md (E1)): n_d (f + b) of the dense
        layer + n_m (f + b + the least expert communication's exposure, ep_passes x it unless overlapped (E10))
        of the MoE layer, at the GPU type where that sum is least."""
        inst = self.instance
        moe = inst.model.moe.num_moe_layers
        dense = inst.model.num_layers - moe
        best = float("inf")
        for g in inst.cluster.gpu_types.values():
            kd = stage_constants(inst, p, p.pp - 1, g, "dense")
            km = stage_constants(inst, p, p.pp - 1, g, "moe")
            best = min(best, dense * (kd.f_compute + kd.b_compute)
                       + moe * (km.f_compute + km.b_compute + km.ep_exposed(experts)))
        return best

    def __call__(self, config: Config) -> float:
        m = self.instance.training.global_batch_size // (config.micro_batch_size * config.dp)
        P, v = config.pp, config.vpp
        # zero bubble (S1): (m - 1/v) t_max + sum_j (t_j - 2 W_j) / v, and W_j <= t_j / 3 (W <= F, W <= B)
        bubble = (P - 1) / v if config.schedule == "1f1b" else (P / 3 - 1) / v
        if config.schedule in V_FAMILIES:  # (S3): no bubble term kept (every row is at least m t_k)
            bubble = 0.0
        pipe = self.work(config) / P * (m + bubble)
        return (pipe + self._overhead) * _SAFETY
