"""The objectives a plan can minimise, each knowing its value, its unit and how a value it must beat becomes an
iteration-time cutoff for a composition program (solvers/search/mixed.py).

time: seconds per iteration. cost: the used GPUs' price per million tokens (price per second x iteration time
/ tokens, in the catalog's or the instance's currency). gpus: the fewest GPUs whose plan reaches the required
tokens/s, ties broken by time (a tenth of a GPU at most, so the GPU count always dominates).
"""

from __future__ import annotations

from dataclasses import dataclass

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
    name: str
    unit: str

    def value(self, instance, placement, estimate, max_time: float = INF) -> float:
        raise NotImplementedError

    def time_cutoff(self, kth: float, instance, rate_per_s: float | None, max_time: float) -> float | None:
        """The iteration time a program's plan must beat for its value to beat `kth` (None: no cutoff)."""
        raise NotImplementedError


class Time(Objective):
    def value(self, instance, placement, estimate, max_time: float = INF) -> float:
        return estimate.iteration_time_s

    def time_cutoff(self, kth, instance, rate_per_s, max_time):
        return kth if kth < INF else None


class Cost(Objective):
    def value(self, instance, placement, estimate, max_time: float = INF) -> float:
        return cost_per_million_tokens(instance, price_per_s(instance, placement), estimate.iteration_time_s)

    def time_cutoff(self, kth, instance, rate_per_s, max_time):  # cost_per_million_tokens solved for the time
        return kth * tokens_per_iteration(instance) / (rate_per_s * 1e6) if kth < INF else None


class Gpus(Objective):
    def value(self, instance, placement, estimate, max_time: float = INF) -> float:
        return gpus_value(placement.world_size, estimate.iteration_time_s, max_time)

    def time_cutoff(self, kth, instance, rate_per_s, max_time):
        return max_time


OBJECTIVES: dict[str, Objective] = {"time": Time("time", "s per iteration"),
                                    "cost": Cost("cost", "price per million tokens"), "gpus": Gpus("gpus", "GPUs")}


def objective_value(instance, objective: str, placement, estimate) -> float:
    """time: s per iteration; cost: price per million tokens; gpus: GPUs used (ties broken by time outside)."""
    return OBJECTIVES[objective].value(instance, placement, estimate)
