"""The bounds' least collective time over group shapes (solvers/bounds/parts.py `best_group_time`): calling NCCL's
least option only at k = 1 and at the k of least level part for each node count (`least_part`) finds the same minimum,
to the last bit, as the scan over every k, on clusters with and without NVLink domains."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from conftest import H100_128, REPO

from formulation import load_instance
from formulation.physics import cost
from solvers.bounds.levels import cluster_extremes, level_units
from solvers.bounds.parts import best_group_time, least_part, least_part_shapes

CLUSTERS = [H100_128, *(REPO / "instances" / f"{name}.json" for name in ("gb300_nvl72_4608", "mi300x_256", "measured_16"))]


@pytest.mark.parametrize("path", CLUSTERS, ids=lambda p: p.stem)
def test_the_least_part_shapes_give_the_full_scans_minimum(path):
    cluster = load_instance(path).cluster
    intra, inter = cluster_extremes(cluster)
    units, most = level_units(cluster)
    part = least_part(cluster)
    assert part is not None
    rng = np.random.default_rng(0)
    span = np.sort(rng.uniform(0.3, 1.0, units + 1))[::-1] * inter  # a slower best pair over more units
    checked = 0
    for kind, message, size, cap, min_nodes, spans in itertools.product(
            ("all_reduce", "reduce_scatter", "all_gather"), (4e3, 3e7, 6e9), (2, 9, 48, 192), (1, 4, 9, most),
            (1, 2), (None, span)):
        def fn(links, kind=kind, message=message):
            return cost.collective_time(kind, message, links, cluster, least=True)

        full = best_group_time(fn, size, intra, inter, units, cap, min_nodes, spans)
        fast = best_group_time(fn, size, intra, inter, units, cap, min_nodes, spans, part)
        assert fast == full, (kind, message, size, cap, min_nodes)
        checked += full < float("inf")
    assert checked > 100


def test_the_bisection_finds_the_least_of_a_quasi_convex_part():
    """max(increasing, decreasing-then-constant): the least is found whatever the crossing and the plateau."""
    for crossing, plateau, top in itertools.product(range(1, 30), (3, 12, 1000), (2, 5, 17, 64)):
        def part(k):
            return max(k - crossing, 100.0 / min(k, plateau) - 100.0 / plateau)

        shapes = least_part_shapes(part, top)
        assert shapes[0] == 1
        assert part(shapes[1]) == min(part(k) for k in range(2, top + 1))
