"""The exact mathematical program for one configuration (docs/programs.md (P1)-(P15)).

Decides the layer partition and the rank-to-GPU map of one configuration (tp, pp, cp, dp, vpp, micro-batch,
recompute, zero_stage) so that the evaluator's iteration time is minimal. Ranks are assigned to *uniform
classes* (`Cluster.uniform_classes`: GPUs of a node that are interchangeable), which is exact because
the evaluator cannot tell two maps apart that differ by a permutation inside a class.

Every physical number is computed by formulation.physics.cost / stage / memory; this module only encodes how
they combine. All time variables carry integer coefficients and every constant is in seconds, so the
CP-SAT backend can scale constants to integers (`Program.time_unit_s` is the MILP's unit).
"""

from __future__ import annotations

import math
from fractions import Fraction


from formulation.physics import cost, layer_kinds, sharding, v_schedules
from formulation.physics.cost import GroupLinks
from formulation.physics.memory import memory_coefficients, stage_memory
from formulation.programs.exact_experts import (expert_dp_groups, expert_layer_comm, expert_layer_upper_bound,
                                                 expert_sync_time, symmetry_breaking)
from formulation.programs.exact_groups import cp_time, group_time, group_variables, sync_time
from formulation.programs.exact_schedule import v_objective, zero_bubble_objective
from formulation.programs.exact_step import once_per_step_sync, with_step_sync
from formulation.programs.layer_mix import mix_partition
from formulation.programs.mip import Program
from formulation.placement import Placement
from formulation.space import Config, node_gpu_types
from formulation.physics.stage import (dp_sync_parts, expert_dp_messages, expert_only_parts, layer_time,
                                       mixed_constants, stage_constants)


class _Builder:
    def __init__(self, instance, config: Config):
        self.inst, self.c = instance, config
        self.cluster = instance.cluster
        self.prog = Program(config=config, classes=instance.cluster.uniform_classes())
        self.template = Placement.of(config, (1,) * config.pp, range(self._world()))
        self.class_node = [int(self.cluster.gpu_domain[cls[0]]) for cls in self.prog.classes]
        bws = set()
        for u, cls in enumerate(self.prog.classes):
            for v, other in enumerate(self.prog.classes):
                if u != v or len(cls) > 1:
                    bws.add(self._bw(u, v))
        self.levels = sorted(bws)  # distinct bandwidths, GB/s
        self.unit = self.prog.time_unit_s
        self.mixed = layer_kinds.is_mixed(instance.model)  # dense and MoE layers: partition by mix (P2b)
        self.step_sync = {}  # (P9'') per stage: E_i of the once-per-step sync

    def _world(self) -> int:
        c = self.c
        return c.tp * c.pp * c.cp * c.dp

    def _bw(self, u: int, v: int) -> float:
        a = self.prog.classes[u][0]
        b = self.prog.classes[v][1] if u == v else self.prog.classes[v][0]
        return self.cluster.bandwidth(a, b)

    def t(self, seconds: float) -> float:
        """Seconds -> the program's time unit."""
        return seconds / self.unit


def build_program(instance, config: Config) -> Program:
    """(P1)-(P15) for one configuration; raises ValueError if no partition fits in memory."""
    b = _Builder(instance, config)
    gpu_types = node_gpu_types(b.cluster)
    if len(gpu_types) != 1:
        raise ValueError("the exact program handles one GPU type per cluster (mixed clusters are composed from islands: solvers/search/mixed.py)")
    b.gpu_type = b.cluster.gpu_types[gpu_types.pop()]
    _assignment(b)
    _partition_and_memory(b)
    stage_time = [_stage_time(b, i) for i in range(config.pp)]
    dp_exposed = [_dp_sync(b, i) for i in range(config.pp)]
    dp_exposed = [with_step_sync(b.prog, i, e, b.step_sync.get(i)) for i, e in enumerate(dp_exposed)]
    chain = _p2p_chain(b)
    _objective(b, stage_time, dp_exposed, chain)
    symmetry_breaking(b)
    b.prog.tighten_upper_bounds()
    return b.prog


def _assignment(b: _Builder) -> None:
    """(P1) x[r, u] = 1 iff rank r runs on a GPU of class u: sum_u x[r, u] = 1, sum_r x[r, u] = |u|."""
    prog = b.prog
    world = b._world()
    for r in range(world):
        for u in range(len(prog.classes)):
            prog.assign[(r, u)] = prog.var(f"x[{r},{u}]", "binary")
        prog.add({prog.assign[(r, u)]: 1 for u in range(len(prog.classes))}, "==", 1, "P1 assignment")
    for u, cls in enumerate(prog.classes):
        prog.add({prog.assign[(r, u)]: 1 for r in range(world)}, "<=", len(cls), "P1 class capacity")


def _partition_and_memory(b: _Builder) -> None:
    """(P2) one-hot layer counts lambda[i, q], sum_i sum_q q lambda[i, q] = L, stages contiguous by order.
    (P3) memory: q is allowed on stage i only if the stage's memory (M1)-(M7), affine in q, fits.
    A model with dense and MoE layers: one-hot layer mixes instead, linked to the arcs of the stages' ranges (P2b),
    a mix allowed only if its memory, affine in (n_d, n_m), fits."""
    prog, c, L = b.prog, b.c, b.inst.model.num_layers
    if b.mixed:
        allowed = {i: [mix for mix in sorted(layer_kinds.possible_mixes(b.inst.model, c.pp, c.vpp, i))
                       if stage_memory(b.inst, b.template, i, mix.total, b.gpu_type, dense_layers=mix.dense).fits]
                   for i in range(c.pp)}
        for i, mixes in allowed.items():
            if not mixes:
                raise ValueError(f"stage {i} fits no layer mix in memory")
        prog.layers.update(mix_partition(prog, b.inst.model, c.pp, c.vpp, allowed))
        return
    total = {}
    for i in range(c.pp):
        allowed = [q for q in range(1, L - c.pp + 2)
                   if (c.vpp == 1 or q % c.vpp == 0) and stage_memory(b.inst, b.template, i, q, b.gpu_type).fits]
        if not allowed:
            need = stage_memory(b.inst, b.template, i, 1, b.gpu_type)
            raise ValueError(f"stage {i} needs {need.total_gib:.1f} GiB with one layer, limit {need.limit_gib:.1f} GiB")
        for q in allowed:
            prog.layers[(i, q)] = prog.var(f"lambda[{i},{q}]", "binary")
            total[prog.layers[(i, q)]] = q
        prog.add({prog.layers[(i, q)]: 1 for q in allowed}, "==", 1, "P2 one layer count per stage")
    prog.add(total, "==", L, "P2 all layers placed")


def _stage_time(b: _Builder, i: int) -> int:
    """(P7) per-layer time u_i = layer_time(tp, cp, ag, rs) of formulation/physics/stage.py, encoded with
    max(0, .) as two lower bounds each; (P8) stage time t_i = l_i u_i + 3 out_i by McCormick on the one-hot
    layer count: y_i >= q u_i - q U_i (1 - lambda[i, q]).
    (P8b) with dense and MoE layers, a per-layer time of each kind (u^d_i without expert communication, u^m_i
    with it, each with its own compute) and McCormick on the one-hot mix (P2b):
    y_i >= n_d u^d_i + n_m u^m_i - (n_d U^d_i + n_m U^m_i)(1 - lambda[i, (n_d, n_m)])."""
    prog, inst, c, tpl = b.prog, b.inst, b.c, b.template
    model, job, cluster = inst.model, inst.training, b.cluster
    kk = mixed_constants(inst, tpl, i, b.gpu_type) if b.mixed else None
    k = kk.moe if b.mixed else stage_constants(inst, tpl, i, b.gpu_type)
    b.stage_constants = getattr(b, "stage_constants", {})
    b.stage_constants[i] = kk or k
    tp_vars, cp_vars, ag_vars, rs_vars = [], [], [], []
    if c.tp > 1:
        for ranks in tpl.tp_groups(i):
            g = group_variables(b, ranks, f"tp{i}.")
            tp_vars.append(group_time(b, g, lambda lk: cost.tp_layer_comm(model, job, tpl, lk, cluster), f"tp{i}."))
    if c.cp > 1:
        for ranks in tpl.cp_groups(i):
            g = group_variables(b, ranks, f"cp{i}.")
            tp_like = cp_time(b, g, i)
            cp_vars.append(tp_like)
    b.dp_groups = getattr(b, "dp_groups", {})  # the shard groups: the dp x cp groups without replicas
    b.rep_groups = getattr(b, "rep_groups", {})
    if tpl.shard_size > 1:
        b.dp_groups[i] = [group_variables(b, ranks, f"dp{i}.") for ranks in tpl.shard_groups(i)]
    if c.dp_replicate > 1:  # (P9') the replicate groups, whose all-reduce follows the reduce-scatter
        b.rep_groups[i] = [group_variables(b, ranks, f"rep{i}.") for ranks in tpl.replicate_groups(i)]
    w_bytes, g_bytes = job.bytes_per_param_state[0], job.grad_reduce_bytes
    for g in b.dp_groups.get(i, []):
        if c.zero_stage >= 3:
            ag_vars.append(group_time(b, g, lambda lk: cost.collective_time(
                "all_gather", k.layer_params * w_bytes, lk, cluster), f"ag{i}."))
        if sharding.per_layer_reduce_scatter(c):  # zero 2 and 3
            rs_vars.append(group_time(b, g, lambda lk: cost.collective_time(
                "reduce_scatter", k.layer_params * g_bytes, lk, cluster), f"rs{i}."))
    replica = sharding.layer_replica_bytes(inst, tpl, k.layer_params)  # zero 2-3: then across replicas (C12)
    ar_vars = [group_time(b, g, lambda lk: cost.collective_time("all_reduce", replica, lk, cluster), f"ar{i}.")
               for g in b.rep_groups.get(i, [])] if replica else []

    def stage_max(vars_, name):
        m = prog.var(f"{name}[{i}]")
        for v in vars_:
            prog.add({m: 1, v: -1}, ">=", 0, f"P7 slowest {name} group")
        return m

    tp, cp, ag, rs = (stage_max(v, n) for v, n in ((tp_vars, "TP"), (cp_vars, "CP"), (ag_vars, "AG"), (rs_vars, "RS")))
    if ar_vars:  # the slowest shard group's reduce-scatter, then the slowest replicate group's all-reduce
        ar, rs_total = stage_max(ar_vars, "AR"), prog.var(f"RSAR[{i}]")
        prog.add({rs_total: 1, rs: -1, ar: -1}, ">=", 0, "P7 reduce-scatter and replica all-reduce")
        rs = rs_total
    experts = expert_layer_comm(b, i)  # (P14) slowest ep + slowest etp, forward, of an MoE layer
    u = _per_layer_time(b, i, k, (tp, cp, ag, rs), experts, "")
    u_max = b.t(_per_layer_upper_bound(b, k))
    if k.sync_once_per_step:  # (P9'') the first forward's gather and the reduce, once per step (C12)
        b.step_sync[i] = once_per_step_sync(b, i, k, ag, rs, b.t(_per_layer_upper_bound(b, k, step=True)))
    y = prog.var(f"y[{i}]")
    if b.mixed:  # (P8b)
        u_d = _per_layer_time(b, i, kk.dense, (tp, cp, ag, rs), None, "d")
        ud_max = b.t(_per_layer_upper_bound(b, kk.dense, experts=False))
        for (stage, mix), lam in prog.layers.items():
            if stage == i:
                big = mix.dense * ud_max + mix.moe * u_max
                prog.add({y: 1, u_d: -mix.dense, u: -mix.moe, lam: -big}, ">=", -big, "P8b stage time McCormick")
    else:
        for (stage, q), lam in prog.layers.items():
            if stage == i:
                prog.add({y: 1, u: -q, lam: -q * u_max}, ">=", -q * u_max, "P8 stage time McCormick")
    t_i = prog.var(f"t[{i}]")
    prog.add({t_i: 1, y: -1}, "==", b.t(3 * k.output_fwd), "P8 stage time")
    return t_i


def _per_layer_time(b: _Builder, i: int, k, slowest: tuple, experts: int | None, tag: str) -> int:
    """(P7) u_i of a layer with constants `k`: its exposed tp, cp and ZeRO-3 communication from the stage's
    slowest groups `slowest` = (TP, CP, AG, RS), plus ep_passes (2 + rp, + 1 with the "moe" recompute module)
    x `experts` (an MoE layer's expert communication, (P14)); with the all-to-all overlap (E10) what the layer's
    compute leaves of it, X >= passes M - (f + b) and den X >= num passes M (the exposure is non-decreasing in
    the objective, so X sits at the larger). `tag` names the layer kind's variables.

    The ZeRO-3 gathers hide behind the layer's compute and exposed tp and cp time: the forward's exposed
    communication tp_f + cp_f + max(0, AG - f - tp_f - cp_f) is written as fwd >= tp_f + cp_f, fwd >= AG - f (the
    backward's likewise), so that no row has two time variables with positive coefficients. A row
    z3_f + tp_f + cp_f >= AG - f let tp_f or cp_f rise as z3_f fell at no cost, and CP-SAT's propagation walked that
    free range one integer unit at a time (docs/programs.md (P7))."""
    prog, job = b.prog, b.inst.training
    tp, cp, ag, rs = slowest
    rp, tp_rp = k.recompute_passes, k.tp_recompute_passes
    tp_f, tp_b0, cp_f, fwd, bwd = (prog.var(f"{n}{tag}[{i}]") for n in ("tpf", "tpb", "cpf", "fwd", "bwd"))
    if job.tp_comm_overlap:
        prog.add({tp_f: 1, tp: -1}, ">=", -b.t(k.matmul_fwd), "P7 tp exposed")
        prog.add({tp_b0: 1, tp: -1}, ">=", -b.t(2 * k.matmul_fwd), "P7 tp exposed")
        num, den = cost.tp_overlap_exposed()  # contention: at least num/den of the overlapped time
        prog.add({tp_f: den, tp: -num}, ">=", 0, "P7 tp exposed share")
        prog.add({tp_b0: den, tp: -num}, ">=", 0, "P7 tp exposed share")
    else:
        prog.add({tp_f: 1, tp: -1}, ">=", 0, "P7 tp exposed")
        prog.add({tp_b0: 1, tp: -1}, ">=", 0, "P7 tp exposed")
    prog.add({cp_f: 1, cp: -1}, ">=", -b.t(k.attention_fwd), "P7 cp exposed")
    # cp_b = 2 cp_f (1 + rp / 2) = (2 + rp) cp_f; tp_b = tp_b0 + tp_rp tp_f. The row with tp_rp is multiplied by its
    # denominator d (tp_rp is a multiple of 1/2): CP-SAT takes integer coefficients on time variables.
    tp_rp = Fraction(tp_rp).limit_denominator(2)
    d = tp_rp.denominator
    prog.add({fwd: 1, tp_f: -1, cp_f: -1}, ">=", 0, "P7 forward exposed")
    if not k.sync_once_per_step:  # (C12) else the forward gather is once per step (P9'')
        prog.add({fwd: 1, ag: -1}, ">=", -b.t(k.f_compute), "P7 zero3 exposed")
    ag_b = -1 if k.backward_gathers else 0  # (C12) no backward gather without resharding after the forward
    rs_b = 0 if k.sync_once_per_step else -1  # (C12) the reduce leaves the micro-batch (P9'')
    tp_cp_b = {bwd: d, tp_b0: -d, tp_f: -int(tp_rp * d), cp_f: -(2 + rp) * d}  # d (bwd - tp_b - cp_b)
    if k.backward_gathers_exposed:  # (C12) FSDP1's "post" prefetch: the backward waits for both
        prog.add({**tp_cp_b, ag: ag_b * d, rs: rs_b * d}, ">=", 0, "P7 zero3 exposed")
    else:
        prog.add(tp_cp_b, ">=", 0, "P7 backward exposed")
        prog.add({bwd: 1, ag: ag_b, rs: rs_b}, ">=", -b.t(k.b_compute), "P7 zero3 exposed")
    u = prog.var(f"u{tag}[{i}]")
    moe_terms = {experts: -k.ep_passes} if experts is not None else {}  # forward + backward + recomputes
    if experts is not None and k.ep_overlap:  # (E10) X >= passes M - (f + b), den X >= num passes M
        x = prog.var(f"epx{tag}[{i}]")
        num, den = cost.dp_overlap_exposed()
        prog.add({x: 1, experts: -k.ep_passes}, ">=", -b.t(k.f_compute + k.b_compute), "P7 ep overlap exposed")
        prog.add({x: den, experts: -num * k.ep_passes}, ">=", 0, "P7 ep overlap share")
        moe_terms = {x: -1}
    prog.add({u: 1, fwd: -1, bwd: -1, **moe_terms}, "==", b.t(k.f_compute + k.b_compute), "P7 per-layer time")
    return u


def _per_layer_upper_bound(b: _Builder, k, experts: bool = True, step: bool = False) -> float:
    """A valid upper bound of u_i (`step`: of its once-per-step sync, (P9'')): every group at the slowest
    bandwidth in its worst shape (`experts`: with an MoE layer's expert communication)."""
    inst, tpl, cluster = b.inst, b.template, b.cluster
    slow = b.levels[0]
    n_tp, n_dp = tpl.tp, tpl.shard_size
    tp = max((cost.tp_layer_comm(inst.model, inst.training, tpl, GroupLinks(n_tp, slow, slow, N, kk), cluster)
              for N in range(1, n_tp + 1) for kk in range(1, n_tp // N + 1)), default=0.0) if n_tp > 1 else 0.0
    cp = cost.cp_layer_comm(inst.model, inst.training, tpl, slow, False, cluster) if tpl.cp > 1 else 0.0
    w_bytes, g_bytes = inst.training.bytes_per_param_state[0], inst.training.grad_reduce_bytes
    ag = rs = 0.0
    if tpl.zero_stage >= 2 and n_dp > 1:
        shapes = [(N, kk) for N in range(1, n_dp + 1) for kk in range(1, n_dp // N + 1)]
        ag = 0.0 if tpl.zero_stage == 2 else max(cost.collective_time(
            "all_gather", k.layer_params * w_bytes, GroupLinks(n_dp, slow, slow, N, kk), cluster) for N, kk in shapes)
        rs = max(cost.collective_time("reduce_scatter", k.layer_params * g_bytes, GroupLinks(n_dp, slow, slow, N, kk),
                                      cluster) for N, kk in shapes)
    replica, r = sharding.layer_replica_bytes(inst, tpl, k.layer_params), tpl.dp_replicate
    if replica:  # (C12) the replicas' all-reduce of the layer's shard, at its worst shape
        rs += max(cost.collective_time("all_reduce", replica, GroupLinks(r, slow, slow, N, kk), cluster)
                  for N in range(1, r + 1) for kk in range(1, r // N + 1))
    lt = layer_time(k, inst.training.tp_comm_overlap, tp, cp, ag, rs, expert_layer_upper_bound(b) if experts else 0.0)
    return (lt.step if step else lt.forward + lt.backward) * 1.001 + 1e-9


def _dp_sync(b: _Builder, i: int) -> int | None:
    """(P9) exposed data-parallel sync of stage i: E_i >= sum over parts of max(0, T_part - window(l_i),
    num/den T_part) (the last for overlapped parts: cost.dp_overlap_exposed).
    The message grows with l_i, so each part's time is selected by (shape, level, layer count) together:
    X >= A(s, b_k, q) (sigma_s + zeta_k + lambda[i, q] - 2) (exact_groups.sync_time, as the replicas' (P9') and
    the experts' (P15) syncs)."""
    prog, c = b.prog, b.c
    edp = expert_dp_groups(b, i) if c.zero_stage < 3 else []  # (P15) mixture-of-experts: the experts' sync
    if (c.dp * c.cp == 1 and not edp) or (c.zero_stage >= 3 and not sharding.replica_reduce_once_per_step(
            b.inst.training, c)):
        return None
    k = b.stage_constants[i]
    qs = sorted(q for (stage, q) in prog.layers if stage == i)

    # the parts' kinds from a count or mix with experts (a mix of dense layers only syncs no experts, (E9))
    reference = next((q for q in qs if getattr(q, "moe", 1) > 0), qs[0])

    def parts_at(q):
        if c.dp * c.cp > 1:
            return dp_sync_parts(b.inst, b.template, k, q)
        return expert_only_parts(b.inst, k, q, expert_dp_messages(b.inst, b.template, k, reference))

    exposed = prog.var(f"E[{i}]")
    parts_exposed = []
    for part, (kind, _, overlapped, _) in enumerate(parts_at(reference)):
        groups = b.dp_groups.get(i, [])  # none with dp x cp = 1 (the expert-only parts)
        messages = {q: dp_sync_parts(b.inst, b.template, k, q)[part][1] for q in qs} if groups else {}
        slowest = sync_time(b, i, groups, kind, messages, str(part), "dp", "P9")
        if slowest is None:  # no dp groups, or zero 2 with a shard group of one rank: only the replicas exchange (P9')
            slowest = prog.var(f"DP[{i},{part}]")
        experts = expert_sync_time(b, i, edp, kind, qs, str(part))
        if c.dp_replicate > 1:  # (P9') the replicas' all-reduce of the gradient shard, in the same window
            experts = sync_time(b, i, b.rep_groups[i], "all_reduce", {q: sharding.replica_messages(
                b.inst, b.template, k.stage_params(q)).get(kind, 0.0) for q in qs}, str(part), "rep", "P9'")
        if experts is not None:  # (P15) plus the same collective of the expert gradients, in the same window
            dense, slowest = slowest, prog.var(f"DPE[{i},{part}]")
            prog.add({slowest: 1, dense: -1, experts: -1}, ">=", 0, "P15 dp and edp collective")
        e = prog.var(f"Epart[{i},{part}]")
        terms = {e: 1, slowest: -1}
        if overlapped:
            for q in qs:
                window = parts_at(q)[part][3]
                terms[prog.layers[(i, q)]] = terms.get(prog.layers[(i, q)], 0) + b.t(window)
        prog.add(terms, ">=", 0, "P9 dp exposed")
        num, den = cost.dp_overlap_exposed()
        if overlapped and num:  # contention: at least num/den of the overlapped collective
            prog.add({e: den, slowest: -num}, ">=", 0, "P9 dp exposed share")
        parts_exposed.append(e)
    prog.add({exposed: 1, **{e: -1 for e in parts_exposed}}, ">=", 0, "P9 dp exposed total")
    return exposed


def _p2p_chain(b: _Builder) -> dict[int, float]:
    """(P10) c_j >= p2p(u, v) (x[r, u] + x[r', v] - 1) for ranks r of stage j and r' = its counterpart in
    stage j + 1 (same dp, cp, tp coordinate); the chain is rounds x 2 x (vpp sum_j c_j + (vpp - 1) c_wrap)."""
    prog, c, inst, tpl = b.prog, b.c, b.inst, b.template
    if c.pp == 1:
        return {}
    sp = inst.training.sequence_parallel_size(c.tp)
    message = cost.activation_message_bytes(inst.model, inst.training, tpl) / sp
    m = tpl.num_micro_batches(inst.training.global_batch_size)
    rounds = math.ceil(m / c.pp) if c.vpp == 1 else 1
    wraps = c.vpp > 1 and c.schedule not in v_schedules.V_FAMILIES  # a V sends no wrap (S3)
    boundaries = [(j, j + 1) for j in range(c.pp - 1)] + ([(c.pp - 1, 0)] if wraps else [])
    weights: dict[int, float] = {}
    for a, z in boundaries:
        var = prog.var(f"c[{a}->{z}]")
        for r, r2 in zip(tpl.stage_gpus(a), tpl.stage_gpus(z)):
            for u in range(len(prog.classes)):
                for v in range(len(prog.classes)):
                    if u == v and len(prog.classes[u]) < 2:
                        continue
                    time = b.t(cost.p2p_time(message, b._bw(u, v), b.class_node[u] == b.class_node[v], b.cluster))
                    prog.add({var: 1, prog.assign[(int(r), u)]: -time, prog.assign[(int(r2), v)]: -time}, ">=",
                             -time, "P10 p2p boundary")
        weights[var] = rounds * 2 * (c.vpp if z == a + 1 else c.vpp - 1)
    return weights


def _objective(b: _Builder, stage_time: list[int], dp_exposed: list, chain: dict[int, float]) -> None:
    """(P11) optimizer: opt >= sum_q opt(i, q) lambda[i, q] (or over mixes, (P2b)). (P12) minimise, times vpp to keep integer
    coefficients: vpp m tau + sum_i t_i - tau + vpp (chain + delta + opt + overhead), tau >= t_i, delta >= E_i."""
    prog, c, inst, tpl = b.prog, b.c, b.inst, b.template
    m = tpl.num_micro_batches(inst.training.global_batch_size)
    tau = prog.var("tau")
    for t_i in stage_time:
        prog.add({tau: 1, t_i: -1}, ">=", 0, "P12 slowest stage")
    delta = prog.var("delta")
    for e in dp_exposed:
        if e is not None:
            prog.add({delta: 1, e: -1}, ">=", 0, "P12 slowest dp sync")
    opt = prog.var("opt")
    o_bytes = inst.training.bytes_per_param_state[2]
    for i in range(c.pp):
        coef = memory_coefficients(inst, tpl, i).optimizer
        dense = memory_coefficients(inst, tpl, i, "dense").optimizer[1] if b.mixed else 0.0
        terms = {opt: 1}
        for (stage, q), lam in prog.layers.items():
            if stage == i:  # a mix (P2b): fixed + per MoE layer x n_m + per dense layer x n_d, as the evaluator
                state = coef[0] + coef[1] * q.moe + dense * q.dense if b.mixed else coef[0] + coef[1] * q
                terms[lam] = -b.t(cost.optimizer_step_time(state / o_bytes, b.gpu_type))
        prog.add(terms, ">=", 0, "P11 optimizer step")
    v = c.vpp
    prog.objective = {tau: v * m - 1, delta: v, opt: v, **{t: 1 for t in stage_time}}
    if c.schedule == "zero_bubble":  # (P12')
        zero_bubble_objective(b, stage_time, tau, v * m - 1)
    for var, weight in chain.items():
        prog.objective[var] = v * weight
    prog.objective_constant += v * b.t(b.gpu_type.iteration_overhead_s)
    prog.objective_divisor = v
    if c.schedule in v_schedules.V_FAMILIES:  # (P12''), the objective then taken times 2 (pp - 1)
        v_objective(b, stage_time, tau, m)
