"""The one bound-and-prune driver that both searches run: solvers/search/uniform.py over the configurations of
one GPU type, mixed.py over the island compositions of several. The driver owns the loop (items in order of
lower bound, each solved unless its bound cannot beat the K-th best of `--top K` or the time is up), the
counters, the record of improvements, Ctrl-C, the global bound and the closing status; a search supplies only
how to solve one item. A fix to the loop is made here once and holds for both.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterable

from formulation.evaluate import Estimate
from formulation.space import Config

INF = float("inf")
# relative gap at or below which a plan is reported optimal
OPTIMAL_GAP = 1e-6
# a bound prunes an item when it is at least the K-th best less this relative margin (float noise)
PRUNE_MARGIN = 1e-9


class NoPlanInTime(Exception):
    """The time limit ended before any item had a plan that fits."""


@dataclass
class Item:
    """One thing a search may solve: a configuration (one GPU type), or a configuration with its stage counts
    per GPU type (mixed types). Values and bounds are in the objective's unit (seconds for one GPU type)."""

    config: Config
    lower_bound: float  # valid for every plan of the item, known before it is solved
    status: str = "unsolved"
    bound: float | None = None  # after solving: what the program proved (inf: nothing here; its optimum)
    placement: object = None
    estimate: Estimate | None = None
    value: float | None = None  # best value known here, what counts against the K-th best

    @property
    def open_bound(self) -> float:
        """The least value this item may still hold: its bound once solved, else its lower bound."""
        return self.lower_bound if self.bound is None else self.bound


@dataclass(kw_only=True)
class Tally:
    """What a search reports whatever it searched: its plans, how it ended, and what it did on the way."""

    ranked: list = field(default_factory=list)  # the best items with a plan, best first, at most `top`
    status: str = "feasible"
    wall_time_s: float = 0.0
    candidates: int = 0  # items bounded
    examined: int = 0  # items the driver handed to the search to solve
    solved: int = 0  # of them, solved to optimality
    pruned: int = 0
    infeasible: int = 0
    stopped: str = ""  # "time limit" or "interrupted" when the search ended early
    errors: list[str] = field(default_factory=list)  # backend failures (item: message)
    history: list = field(default_factory=list)  # (seconds since start, best value) at every improvement
    started: float = field(default_factory=time.perf_counter)

    def improved(self, value: float) -> None:
        """Record `value` when it beats the last best: the gap over time follows."""
        if not self.history or value < self.history[-1][1]:
            self.history.append((time.perf_counter() - self.started, value))


def bound_and_prune(items: list[Item], solve_one: Callable[[Item, float], None], tally: Tally, top: int,
                    deadline: float, progress=None, until: float | None = None) -> int:
    """Sort `items` by lower bound and hand each to `solve_one(item, kth)` (kth: the K-th best value it must
    beat) until the next bound cannot beat the K-th best: then no later one can either, and their count is
    returned as pruned (else 0). Stops at `until` (default: the deadline); reaching the deadline sets
    `tally.stopped`. `progress(examined, total, kth, global bound)` after each item."""
    items.sort(key=lambda i: (i.lower_bound, i.config))
    until = deadline if until is None else until
    for n, item in enumerate(items):
        kth = kth_of(items, top)
        if prunes(item.lower_bound, kth):
            return len(items) - n
        now = time.perf_counter()
        if now >= until:
            if now >= deadline:
                tally.stopped = "time limit"
            return 0
        tally.examined += 1
        solve_one(item, kth)
        if progress:
            progress(tally.examined, len(items), kth_of(items, top), global_bound(items))
    return 0


@contextmanager
def interruptible(tally: Tally):
    """Ctrl-C ends the search with what it has: every plan and bound found so far stays valid."""
    try:
        yield
    except KeyboardInterrupt:
        tally.stopped = "interrupted"


def time_left(deadline: float, cap: float | None = None) -> float | None:
    """A program's time limit: what is left before the deadline (None: none), at most `cap`, and never so
    little that a backend refuses it."""
    left = None if deadline == INF else max(0.05, deadline - time.perf_counter())
    if cap is not None:
        left = cap if left is None else min(left, cap)
    return left


def kth_best(values: Iterable[float | None], top: int) -> float:
    """The `top`-th smallest known value (inf while fewer than `top` are known): what a bound must beat."""
    known = sorted(v for v in values if v is not None)
    return known[top - 1] if len(known) >= top else INF


def kth_of(items: Iterable[Item], top: int) -> float:
    return kth_best((i.value for i in items), top)


def prunes(bound: float, kth: float) -> bool:
    """Whether a lower bound shows that nothing under it can beat the K-th best."""
    return bound >= kth * (1 - PRUNE_MARGIN)


def global_bound(items: Iterable[Item]) -> float:
    """The least value anything not ruled out may still hold (proven optima included)."""
    return min(i.open_bound for i in items)


def closing_status(best: float, bound: float, stopped: str) -> tuple[float, str]:
    """(relative gap, status): optimal when the bound meets the plan, timeout when a time limit or Ctrl-C ended
    the search first, else feasible (the search ended without closing the gap: a backend gave up)."""
    gap = (best - bound) / best if best else 0.0
    return gap, "optimal" if gap <= OPTIMAL_GAP else ("timeout" if stopped else "feasible")
