"""The op order of each pipeline schedule on each rank, as torch.distributed.pipelining generates it (torch 2.x
`torch/distributed/pipelining/schedules.py`, which torchtitan runs; Megatron-LM runs the same 1F1B and interleaved
orders). An op is (kind, virtual stage, micro-batch): "F" forward, "B" the whole backward, "I" the input-gradient
backward alone, "W" the weight-gradient backward alone (Qi et al., ICLR 2024). DualPipeV's overlapped forward and
backward pair is two ops in that order. tests/test_schedules.py compares every order with torch's own.
"""

from __future__ import annotations

from collections import defaultdict

Op = tuple[str, int, int]


def one_f_one_b(rank: int, pp: int, m: int) -> list[Op]:
    """1F1B (Schedule1F1B, Megatron-LM's non-interleaved order): pp - 1 - rank warm-up forwards, steady pairs of
    a forward and a backward, cool-down backwards."""
    warmup = min(pp - 1 - rank, m)
    ops = [("F", rank, k) for k in range(warmup)]
    for k in range(m - warmup):
        ops += [("F", rank, warmup + k), ("B", rank, k)]
    return ops + [("B", rank, k) for k in range(m - warmup, m)]


def peak_held(order: list[Op]) -> int:
    """The most chunks a rank has forwarded whose weight gradient (W, or the whole backward B) has not run, along
    its `order`: the activations it holds at its peak (docs/schedules.md (S4))."""
    held = peak = 0
    for kind, _, _ in order:
        held += 1 if kind == "F" else -1 if kind in ("W", "B") else 0
        peak = max(peak, held)
    return peak


def _warmup(rank: int, vpp: int, per_round: int, pp: int, m: int, factor: int) -> int:
    """torch's `_get_warmup_ops`."""
    return min((vpp - 1) * per_round + factor * (pp - 1 - rank), m * vpp)


def _rounds(pp: int, m: int) -> int:
    """Micro-batches per round of the looped schedules: m // max(1, m // pp) (torch's flexible rounds)."""
    rounds = max(1, m // pp)
    if m % rounds:
        raise ValueError(f"{m} micro-batches are not a multiple of {rounds} rounds")
    return m // rounds


def looped(rank: int, pp: int, m: int, vpp: int, zero_bubble: bool) -> list[Op]:
    """Interleaved1F1B (zero_bubble False, warm-up 2 per hop) and InterleavedZeroBubble (ZB1P: warm-up 1 per hop,
    backward split into I and W, the W of the k-th oldest backward placed after each steady pair once `rank`
    pairs have run): torch's `_get_1f1b_rank_ops`. Virtual stage of chunk c on this rank: c x pp + rank."""
    per_round = _rounds(pp, m) if vpp > 1 else m
    warmup = _warmup(rank, vpp, per_round, pp, m, 1 if zero_bubble else 2)
    total = m * vpp
    steady = total - warmup

    def fwd_stage(step: int) -> int:
        return ((step // per_round) % vpp) * pp + rank

    def bwd_stage(step: int) -> int:
        return (vpp - 1 - ((step - warmup) // per_round) % vpp) * pp + rank

    count = defaultdict(int)

    def take(kind: str, stage: int) -> Op:
        mb = count[(kind, stage)]
        count[(kind, stage)] += 1
        return kind, stage, mb

    backward = "I" if zero_bubble else "B"
    ops: list[Op] = []
    pending: list[int] = []  # steps of the backwards whose W is still to run
    for step in range(warmup + steady + warmup):
        if step < warmup:
            ops.append(take("F", fwd_stage(step)))
            continue
        if step < warmup + steady:
            ops.append(take("F", fwd_stage(step)))
        ops.append(take(backward, bwd_stage(step)))
        pending.append(step)
        if zero_bubble and step - warmup >= rank:
            ops.append(take("W", bwd_stage(pending.pop(0))))
    if zero_bubble:
        ops += [take("W", bwd_stage(step)) for step in pending]
    return ops


def zbv(rank: int, pp: int, m: int) -> list[Op]:
    """ZBVZeroBubble (ScheduleZBVZeroBubble, Qi et al. section 6): two chunks per rank in a V, chunk 0 = virtual
    stage rank, chunk 1 = 2 pp - 1 - rank. Micro-batches beyond m (torch pads to 2 pp - 1) are dropped."""
    n = max(2 * pp - 1, m)
    s0, s1 = rank, 2 * pp - 1 - rank
    ops: list[Op] = []
    f0 = f1 = b0 = b1 = 0
    for _ in range(2 * (pp - rank) - 1):
        ops.append(("F", s0, f0))
        f0 += 1
    for _ in range(rank):
        ops += [("F", s1, f1), ("F", s0, f0)]
        f1, f0 = f1 + 1, f0 + 1
    for _ in range(pp - rank):
        ops += [("F", s1, f1), ("I", s1, b1), ("W", s1, b1)]
        f1, b1 = f1 + 1, b1 + 1
    while f1 < f0 or f0 < n:
        if f0 < n:
            ops.append(("F", s0, f0))
            f0 += 1
        ops += [("I", s0, b0), ("W", s0, b0), ("F", s1, f1), ("I", s1, b1), ("W", s1, b1)]
        b0, f1, b1 = b0 + 1, f1 + 1, b1 + 1
    w0, w1 = b0, b1
    for _ in range(rank):
        ops += [("I", s0, b0), ("I", s1, b1)]
        b0, b1 = b0 + 1, b1 + 1
    for _ in range(pp - rank):
        ops += [("I", s0, b0), ("W", s0, w0)]
        b0, w0 = b0 + 1, w0 + 1
    ops += [("W", s1, k) for k in range(w1, b1)] + [("W", s0, k) for k in range(w0, b0)]
    return [op for op in ops if op[2] < m]


def dualpipev(rank: int, pp: int, m: int) -> list[Op]:
    """DualPipeV (ScheduleDualPipeV, DeepSeek's DualPipe cut in half): two chunks per rank in a V; the steady
    state pairs a forward of one chunk with a full backward of the other (OVERLAP_F_B, here the two ops in that
    order); the last backwards split into I and W where the W fill the cool-down. Needs m >= 2 pp."""
    if m < 2 * pp:
        raise ValueError(f"DualPipeV needs at least 2 x pp = {2 * pp} micro-batches, got {m}")
    s0, s1 = rank, 2 * pp - 1 - rank
    count: dict = defaultdict(int)
    weights: list[tuple[int, int]] = []
    ops: list[Op] = []

    def add(stage: int, kind: str) -> None:
        key = (stage, "I" if kind == "B" else kind)
        mb = count[key]
        ops.append((kind, stage, mb))
        if kind == "B":
            count[(stage, "I")] += 1
            count[(stage, "W")] += 1
        else:
            if kind == "I":
                weights.append((stage, mb))
            count[key] = mb + 1

    def weight() -> None:
        if weights:
            stage, mb = weights.pop(0)
            ops.append(("W", stage, mb))
            count[(stage, "W")] += 1

    for _ in range((pp - rank - 1) * 2):
        add(s0, "F")
    for _ in range(rank + 1):
        add(s0, "F")
        add(s1, "F")
    for _ in range(pp - rank - 1):
        add(s1, "I")
        weight()
        add(s1, "F")
    for i in range(m - pp * 2 + rank + 1):
        add(s0, "F")  # (the last rank's first pair runs unoverlapped: the same two ops in this model)
        add(s1, "B")
        add(s1, "F")
        add(s0, "B")
    for _ in range(pp - rank - 1):
        add(s1, "B")
        add(s1, "F")
        add(s0, "B")
    _dualpipev_drain(rank, pp, s0, s1, add, weight)
    return ops


def _dualpipev_drain(rank: int, pp: int, s0: int, s1: int, add, weight) -> None:
    """DualPipeV's last steps: the second half of the backwards split into I and W, the W filling the drain."""
    split = False
    for i in range(rank + 1):
        if i == (rank + 1) // 2 and rank % 2 == 1:
            split = True
        add(s1, "I" if split else "B")
        if i == (rank + 1) // 2 and rank % 2 == 0:
            split = True
        add(s0, "I" if split else "B")
    for _ in range(pp - rank - 1):
        weight()
        add(s0, "I" if split else "B")
    for _ in range(rank + 1):
        weight()
