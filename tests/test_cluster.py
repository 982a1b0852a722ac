"""The bandwidth model: nominal links, per-node NIC caps, node-pair and GPU-pair overrides, measured matrices,
interchangeable node classes, and the hierarchical ring collective time against hand-computed values."""

from __future__ import annotations

import math

import pytest

from conftest import build_instance, small_instance_dict
from formulation.physics import cost


def cluster_of(num_nodes=2, gpus=4, intra=400.0, inter=50.0, **network):
    return build_instance(small_instance_dict(num_nodes, gpus, intra=intra, inter=inter, **network)).cluster


def gpu(cluster, name: str) -> int:
    return cluster.gpu_index(name)


def test_nominal_bandwidths_and_default_latencies():
    c = cluster_of(3)
    assert c.num_gpus == 12 and c.gpu_name(5) == "n1:1" and gpu(c, "n2:3") == 11
    assert c.bandwidth(gpu(c, "n0:0"), gpu(c, "n0:3")) == 400.0
    assert c.bandwidth(gpu(c, "n0:0"), gpu(c, "n2:3")) == 50.0
    assert c.bandwidth(gpu(c, "n2:3"), gpu(c, "n0:0")) == 50.0
    assert c.intra_latency_s == pytest.approx(5e-6) and c.inter_latency_s == pytest.approx(15e-6)


def test_latencies_are_read_in_microseconds():
    c = cluster_of(intra_node_latency_us=2.0, inter_node_latency_us=0.0)
    assert c.intra_latency_s == pytest.approx(2e-6) and c.inter_latency_s == 0.0


def test_node_nic_cap_gives_the_min_of_both_ends():
    c = cluster_of(4, nodes=[{"node": "n1", "inter_node_gb_per_s": 24.0}, {"node": "n2", "inter_node_gb_per_s": 12.0}])
    n = c.node_index
    assert c.inter_gb_per_s[n["n0"], n["n3"]] == 50.0
    assert c.inter_gb_per_s[n["n0"], n["n1"]] == 24.0
    assert c.inter_gb_per_s[n["n1"], n["n2"]] == 12.0 == c.inter_gb_per_s[n["n2"], n["n1"]]
    assert c.inter_gb_per_s[n["n3"], n["n2"]] == 12.0
    assert c.bandwidth(gpu(c, "n1:3"), gpu(c, "n2:0")) == 12.0
    assert c.bandwidth(gpu(c, "n1:0"), gpu(c, "n1:1")) == 400.0  # the NIC cap does not touch NVLink


def test_per_node_intra_override_changes_only_that_node():
    c = cluster_of(2, nodes=[{"node": "n1", "intra_node_gb_per_s": 150.0}])
    assert c.bandwidth(gpu(c, "n1:0"), gpu(c, "n1:3")) == 150.0
    assert c.bandwidth(gpu(c, "n0:0"), gpu(c, "n0:3")) == 400.0
    assert c.bandwidth(gpu(c, "n0:0"), gpu(c, "n1:0")) == 50.0


def test_node_pair_override_is_symmetric_and_replaces_the_nominal_and_the_nic_cap():
    c = cluster_of(3, nodes=[{"node": "n1", "inter_node_gb_per_s": 24.0}],
                   node_pairs=[{"nodes": ["n0", "n2"], "gb_per_s": 10.0}, {"nodes": ["n1", "n2"], "gb_per_s": 30.0}])
    n = c.node_index
    assert c.inter_gb_per_s[n["n0"], n["n2"]] == 10.0 == c.inter_gb_per_s[n["n2"], n["n0"]]
    assert c.inter_gb_per_s[n["n1"], n["n2"]] == 30.0  # measured: wins over the cap
    assert c.inter_gb_per_s[n["n0"], n["n1"]] == 24.0
    assert c.bandwidth(gpu(c, "n2:1"), gpu(c, "n0:2")) == 10.0


def test_gpu_pair_override_inside_a_node():
    c = cluster_of(2, gpu_pairs=[{"gpus": ["n0:1", "n0:2"], "gb_per_s": 100.0}])
    a, b = gpu(c, "n0:1"), gpu(c, "n0:2")
    assert c.bandwidth(a, b) == 100.0 == c.bandwidth(b, a)
    assert c.bandwidth(a, gpu(c, "n0:3")) == 400.0
    assert c.bandwidth(gpu(c, "n1:1"), gpu(c, "n1:2")) == 400.0  # same local indices on another node
    assert c.gpu_pair_gb_per_s == {}  # intra pairs live in the node's matrix, not the cross-node table


def test_gpu_pair_override_across_nodes():
    c = cluster_of(2, gpu_pairs=[{"gpus": ["n1:2", "n0:1"], "gb_per_s": 7.0}])
    a, b = gpu(c, "n0:1"), gpu(c, "n1:2")
    assert c.bandwidth(a, b) == 7.0 == c.bandwidth(b, a)
    assert c.bandwidth(a, gpu(c, "n1:3")) == 50.0
    assert c.gpu_pair_gb_per_s == {(a, b): 7.0}
    assert c.group_links([a, b])[1] == 7.0
    assert c.group_links([a, gpu(c, "n1:3")])[1] == 50.0


def test_node_matrix_sets_inter_node_bandwidth_and_explicit_nic_caps_still_apply():
    matrix = [[0, 40.0, 30.0], [40.0, 0, 20.0], [30.0, 20.0, 0]]
    c = cluster_of(3, node_matrix_gb_per_s=matrix)
    assert c.bandwidth(gpu(c, "n0:0"), gpu(c, "n1:0")) == 40.0
    assert c.bandwidth(gpu(c, "n2:0"), gpu(c, "n0:0")) == 30.0
    assert c.bandwidth(gpu(c, "n1:0"), gpu(c, "n2:0")) == 20.0
    capped = cluster_of(3, node_matrix_gb_per_s=matrix, nodes=[{"node": "n0", "inter_node_gb_per_s": 35.0}])
    assert capped.inter_gb_per_s[0, 1] == 35.0 and capped.inter_gb_per_s[0, 2] == 30.0
    assert capped.inter_gb_per_s[1, 2] == 20.0  # the nominal 50 is not a cap when a matrix is given


def test_group_links_reports_bottlenecks_nodes_and_fewest_members_per_node():
    c = cluster_of(3, gpu_pairs=[{"gpus": ["n0:0", "n0:1"], "gb_per_s": 100.0}],
                   node_pairs=[{"nodes": ["n1", "n2"], "gb_per_s": 20.0}])
    intra, inter, nodes, per_node = c.group_links([gpu(c, x) for x in ("n0:0", "n0:1", "n0:2", "n1:0")])
    assert (intra, inter, nodes, per_node) == (100.0, 50.0, 2, 1)
    intra, inter, nodes, per_node = c.group_links([gpu(c, x) for x in ("n1:0", "n1:1", "n2:0", "n2:1")])
    assert (intra, inter, nodes, per_node) == (400.0, 20.0, 2, 2)
    intra, inter, nodes, per_node = c.group_links([gpu(c, "n0:2")])
    assert math.isinf(intra) and math.isinf(inter) and (nodes, per_node) == (1, 1)


def test_uniform_cluster_is_one_interchangeable_class():
    c = cluster_of(4)
    assert c.interchangeable_nodes() == [[0, 1, 2, 3]]
    assert c.interchangeable_gpus(0) == [[0, 1, 2, 3]]


@pytest.mark.parametrize("network, classes", [
    ({"nodes": [{"node": "n2", "inter_node_gb_per_s": 25.0}]}, [[0, 1, 3], [2]]),
    ({"nodes": [{"node": "n1", "intra_node_gb_per_s": 200.0}]}, [[0, 2, 3], [1]]),
    ({"node_pairs": [{"nodes": ["n0", "n1"], "gb_per_s": 20.0}]}, [[0, 1], [2, 3]]),
    ({"gpu_pairs": [{"gpus": ["n3:0", "n0:0"], "gb_per_s": 20.0}]}, [[0], [1, 2], [3]]),
])
def test_a_degraded_node_or_link_splits_the_interchangeable_classes(network, classes):
    assert cluster_of(4, **network).interchangeable_nodes() == classes


def test_a_slow_gpu_pair_splits_the_node_into_gpu_classes():
    c = cluster_of(1, gpu_pairs=[{"gpus": ["n0:0", "n0:1"], "gb_per_s": 100.0}])
    assert c.interchangeable_gpus(0) == [[0, 1], [2, 3]]


def test_different_gpu_counts_are_not_interchangeable():
    data = small_instance_dict(3, 4)
    data["cluster"]["nodes"][2]["gpus"] = 8
    assert build_instance(data).cluster.interchangeable_nodes() == [[0, 1], [2]]


# ---- collective_time: hand-computed with M = 1 GB, intra 400 GB/s, inter 50 GB/s, alpha 5 us / 15 us ------

M = 1e9


def links(c, names):
    return cost.group_links(c, [gpu(c, x) for x in names])


@pytest.fixture
def line_rate(monkeypatch):
    """The ring formula at the links' own speed: NCCL's share of a nominal speed (collective_efficiency) is a
    separate factor, checked against nccl-tests in tests/test_physics.py. The one-ring latency of (C5), alpha per
    ring step: NCCL's tuning model (`nccl_algorithms`) is checked in tests/test_collectives.py."""
    monkeypatch.setitem(cost.PHYSICS_TERMS, "collective_efficiency", False)
    monkeypatch.setitem(cost.PHYSICS_TERMS, "nccl_algorithms", False)


def test_ring_all_reduce_inside_one_node(line_rate):
    c = cluster_of(2)
    # 2 (n-1)/n x M / B + 2 (n-1) alpha = 1.5 / 400 s + 6 x 5 us
    t = cost.collective_time("all_reduce", M, links(c, ["n0:0", "n0:1", "n0:2", "n0:3"]), c)
    assert t == pytest.approx(3.75e-3 + 30e-6, rel=1e-12)


def test_reduce_scatter_and_all_gather_move_half_of_an_all_reduce(line_rate):
    c = cluster_of(2)
    group = links(c, ["n0:0", "n0:1", "n0:2", "n0:3"])
    # (n-1)/n x M / B + (n-1) alpha = 0.75 / 400 s + 3 x 5 us
    for kind in ("reduce_scatter", "all_gather"):
        assert cost.collective_time(kind, M, group, c) == pytest.approx(1.875e-3 + 15e-6, rel=1e-12)


def test_hierarchical_all_reduce_across_two_nodes(line_rate):
    c = cluster_of(2)
    group = links(c, [f"n{i}:{j}" for i in range(2) for j in range(4)])
    assert (group.size, group.nodes, group.per_node) == (8, 2, 4)
    # one ring of 8 moving 2 x 7/8 M per GPU, both levels at once (rail_ring): 3/4 of it over NVLink, 1/4 over
    # each GPU's NIC; latency: 6 steps of the k = 4 local GPUs, 2 of the N = 2 nodes
    nvlink = 1.75 * (3 / 4) * M / 400e9
    nics = 1.75 * M / (4 * 50e9)
    assert max(nvlink, nics) + 6 * 5e-6 + 2 * 15e-6 == pytest.approx(8.81e-3, rel=1e-12)
    assert cost.collective_time("all_reduce", M, group, c) == pytest.approx(8.81e-3, rel=1e-12)
    # the two levels one after the other (the term off) give the same here by coincidence, not in general
    assert 1.5 * M / 400e9 + (1 / 2) * 2 * M / (4 * 50e9) + 60e-6 == pytest.approx(8.81e-3, rel=1e-12)


def test_one_gpu_per_node_is_a_flat_ring_over_the_slowest_inter_node_link(line_rate):
    c = cluster_of(4, node_pairs=[{"nodes": ["n1", "n3"], "gb_per_s": 25.0}])
    group = links(c, ["n0:0", "n1:0", "n2:0", "n3:0"])
    # 2 x 3/4 x M / 25 GB/s + 6 x 15 us
    assert cost.collective_time("all_reduce", M, group, c) == pytest.approx(0.06 + 90e-6, rel=1e-12)


def test_uneven_group_uses_the_fewest_members_per_node_for_the_inter_node_shard(line_rate):
    c = cluster_of(2)
    group = links(c, ["n0:0", "n0:1", "n0:2", "n1:0"])  # k = 1: n1:0 sends its whole ring share over its NIC
    assert cost.collective_time("all_reduce", M, group, c) == pytest.approx(1.5 * M / 50e9 + 2 * 15e-6, rel=1e-12)


def test_trivial_collectives_cost_nothing():
    c = cluster_of(2)
    assert cost.collective_time("all_reduce", M, links(c, ["n0:0"]), c) == 0.0
    assert cost.collective_time("all_reduce", 0.0, links(c, ["n0:0", "n1:0"]), c) == 0.0


def test_slower_intra_pair_in_the_group_slows_the_collective(line_rate):
    c = cluster_of(1, gpu_pairs=[{"gpus": ["n0:2", "n0:3"], "gb_per_s": 100.0}])
    fast = cost.collective_time("all_reduce", M, links(c, ["n0:0", "n0:1"]), c)
    slow = cost.collective_time("all_reduce", M, links(c, ["n0:0", "n0:1", "n0:2", "n0:3"]), c)
    assert fast == pytest.approx(M / 400e9 + 2 * 5e-6, rel=1e-12)
    assert slow == pytest.approx(1.5 * M / 100e9 + 6 * 5e-6, rel=1e-12)
