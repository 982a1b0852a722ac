"""What both bound-and-prune searches share (solvers/search/uniform.py for one GPU type, mixed.py for islands
of several): the K-th best value that a bound must beat (`--top K`), the record of improvements over time,
and the closing status from the best plan and the proven bound. A fix to any of these is made here once.
"""

from __future__ import annotations

import time
from typing import Iterable

INF = float("inf")
# relative gap at or below which a plan is reported optimal
OPTIMAL_GAP = 1e-6
# a bound prunes a configuration when it is at least the K-th best less this relative margin (float noise)
PRUNE_MARGIN = 1e-9


def kth_best(values: Iterable[float | None], top: int) -> float:
    """The `top`-th smallest known value (inf while fewer than `top` are known): what a bound must beat."""
    known = sorted(v for v in values if v is not None)
    return known[top - 1] if len(known) >= top else INF


def prunes(bound: float, kth: float) -> bool:
    """Whether a lower bound shows that nothing under it can beat the K-th best."""
    return bound >= kth * (1 - PRUNE_MARGIN)


def record_improvement(history: list, started: float, value: float) -> None:
    """Append (seconds since `started`, value) when `value` beats the last best: the gap over time follows."""
    if not history or value < history[-1][1]:
        history.append((time.perf_counter() - started, value))


def closing_status(best: float, bound: float, stopped: str) -> tuple[float, str]:
    """(relative gap, status): optimal when the bound meets the plan, timeout when a time limit or Ctrl-C ended
    the search first, else feasible (the search ended without closing the gap: a backend gave up)."""
    gap = (best - bound) / best if best else 0.0
    return gap, "optimal" if gap <= OPTIMAL_GAP else ("timeout" if stopped else "feasible")
