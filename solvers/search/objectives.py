"""The objectives a plan can minimise, as objects: each knows its value, its unit, how a value it must beat
becomes an iteration-time cutoff for a composition program (solvers/search/mixed.py), what a program's outcome
proves and how the report states it (solvers/search/islands.py), so that neither asks an objective by name and a
new objective is one class here.

time: seconds per iteration. cost: the used GPUs' price per million tokens (price per second x iteration time
/ tokens, in the catalog's or the instance's currency). gpus: the fewest GPUs whose plan reaches the required
tokens/s, ties broken by time (a tenth of a GPU at most, so the GPU count always dominates).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

INF = float("inf")


def price_per_s(instance, placement) -> float:
    """Price of the GPUs a placement uses, per second."""
    cluster = instance.cluster
    return sum(cluster.gpu_type_of(int(g)).price_per_hour for g in placement.gpus) / 3600.0


def tokens_per_iteration(instance) -> int:
    return instance.training.global_batch_size * instance.training.seq_length


def cost_per_million_tokens(instance, rate_per_s: float, time_s: float) -> float:
    """The cost objective: GPUs priced at `rate_per_s` for one iteration of `time_s`, per million tokens."""
    return rate_per_s * time_s / tokens_per_iteration(instance) * 1e6


def gpus_value(world: int, time_s: float, max_time: float) -> float:
    """The GPU-count objective: GPUs first, then time as a fraction below a tenth of a GPU."""
    return float(world) + (time_s / (10 * max_time) if max_time < INF else 0.0)


@dataclass(frozen=True)
class Objective:
    """What a search minimises, and everything about it that the composition search and its report must not
    ask by name: how a time becomes a value, how a value to beat becomes a time cutoff, what a program's
    outcome proves, and how the report speaks of it."""

    name: str
    unit: str
    # the value is the iteration time itself: a program's bound in seconds bounds it, and the type-blind
    # Megatron default (which spans GPU types, outside every composition) competes with the plans on it
    value_is_time: ClassVar[bool] = False
    # every vector of stage counts per GPU type is a program of its own, so that the used GPUs' price is a
    # constant of each program
    per_type_programs: ClassVar[bool] = False
    # the time cutoff is a requirement (the throughput asked for), not the incumbent's: a program with nothing
    # under it, or whose optimum the evaluator finds too slow, holds no plan at all
    required_cutoff: ClassVar[bool] = False
    # why an island's GPUs stay idle when they could host stages (the island report)
    idle_reason: ClassVar[str] = ""

    def value(self, instance, placement, estimate, max_time: float = INF) -> float:
        raise NotImplementedError

    def of_time(self, time_s: float, instance, world: int, rate_per_s: float | None, max_time: float) -> float:
        """The value of a plan on `world` GPUs priced `rate_per_s` that takes `time_s`: monotone in the time, so a
        time lower bound gives a lower bound in the objective's unit."""
        raise NotImplementedError

    def time_cutoff(self, kth: float, instance, rate_per_s: float | None, max_time: float) -> float | None:
        """The iteration time a program's plan must beat for its value to beat `kth` (None: no cutoff)."""
        raise NotImplementedError

    def max_time(self, instance, required_tokens_per_s: float | None) -> float:
        """The slowest iteration a plan may take (inf: any)."""
        return INF

    def reaches(self, time_s: float, max_time: float, slack: float = 0.0) -> bool:
        """Whether an iteration of `time_s` is fast enough (`slack`: the float noise a program's answer may carry)."""
        return True

    def refuted_bound(self, kth: float, cutoff: float | None) -> float:
        """The bound a program left infeasible under `cutoff` proves: nothing in it beats the K-th best `kth`; with
        no cutoff, or a required one, nothing is in it at all."""
        return INF if cutoff is None or self.required_cutoff else kth

    def bound_after(self, lower_bound: float, program_bound_s: float | None) -> float:
        """The bound a program that ended without a proof leaves: its own bound is an iteration time, which
        bounds the value only when the value is that time."""
        if self.value_is_time and program_bound_s is not None:
            return max(lower_bound, program_bound_s)
        return lower_bound

    def no_plan(self, required_tokens_per_s: float | None) -> str:
        """The error when every program was solved and none gave a plan."""
        return "no composition fits"

    def unreachable(self, required_tokens_per_s: float | None) -> str | None:
        """The error when configurations fit but none has a program worth solving (None: not this objective's
        doing, so the memory message stands)."""
        return None

    def note(self, required_tokens_per_s: float | None) -> str:
        """What the report's note adds about the objective."""
        return ""

    def reported(self, value: float, bound: float, placement) -> tuple[float, float]:
        """The value and bound the report states."""
        return value, bound


class Time(Objective):
    value_is_time = True
    idle_reason = ("the proven fastest plan leaves them out: using more of them is no faster (a slower type or "
                   "link would set the pace, or the stages would not balance)")

    def value(self, instance, placement, estimate, max_time: float = INF) -> float:
        return estimate.iteration_time_s

    def of_time(self, time_s, instance, world, rate_per_s, max_time):
        return time_s

    def time_cutoff(self, kth, instance, rate_per_s, max_time):
        return kth if kth < INF else None


class Cost(Objective):
    per_type_programs = True
    idle_reason = "the proven cheapest plan per token leaves them out: they would add more price than speed"

    def value(self, instance, placement, estimate, max_time: float = INF) -> float:
        return cost_per_million_tokens(instance, price_per_s(instance, placement), estimate.iteration_time_s)

    def of_time(self, time_s, instance, world, rate_per_s, max_time):
        return cost_per_million_tokens(instance, rate_per_s, time_s)

    def time_cutoff(self, kth, instance, rate_per_s, max_time):  # cost_per_million_tokens solved for the time
        return kth * tokens_per_iteration(instance) / (rate_per_s * 1e6) if kth < INF else None


class Gpus(Objective):
    required_cutoff = True
    idle_reason = "the required throughput is reached with fewer GPUs"

    def value(self, instance, placement, estimate, max_time: float = INF) -> float:
        return gpus_value(placement.world_size, estimate.iteration_time_s, max_time)

    def of_time(self, time_s, instance, world, rate_per_s, max_time):
        return gpus_value(world, time_s, max_time)

    def time_cutoff(self, kth, instance, rate_per_s, max_time):
        return max_time

    def max_time(self, instance, required_tokens_per_s):
        if not required_tokens_per_s:
            raise ValueError("objective 'gpus' needs required_tokens_per_s (--required-tokens-per-s)")
        return tokens_per_iteration(instance) / required_tokens_per_s

    def reaches(self, time_s, max_time, slack=0.0):
        return time_s <= max_time * (1 + slack)

    def no_plan(self, required_tokens_per_s):
        return f"no plan reaches {required_tokens_per_s:g} tokens/s"

    def unreachable(self, required_tokens_per_s):
        return (f"no configuration can reach {required_tokens_per_s:g} tokens/s on this cluster (its lower bounds "
                f"are all slower)")

    def note(self, required_tokens_per_s):
        return f"; fewest GPUs reaching {required_tokens_per_s:g} tokens/s"

    def reported(self, value, bound, placement):  # the value carries the time as a tie-break fraction: whole GPUs
        return float(placement.world_size), float(int(bound))


OBJECTIVES: dict[str, Objective] = {"time": Time("time", "s per iteration"),
                                    "cost": Cost("cost", "price per million tokens"), "gpus": Gpus("gpus", "GPUs")}


def objective_value(instance, objective: str, placement, estimate) -> float:
    """time: s per iteration; cost: price per million tokens; gpus: GPUs used (ties broken by time outside)."""
    return OBJECTIVES[objective].value(instance, placement, estimate)
