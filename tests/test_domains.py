"""NVLink domains (racks of trays, docs/links.md (L5)): the instance format's strict reading, the bandwidth model's
levels, and the exact program and the bounds against brute force on small "racks".

The brute force shares nothing with the program but `evaluate()`: every configuration, layer partition and
tray-level map (the GPUs of a tray are interchangeable in these instances: one figure inside each tray), the
fastest that fits. Both racks instances make the tray, the domain and the network three different figures, so a
group inside a tray, one across trays of a rack and one across racks all cost differently.
"""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
from conftest import ALL_BACKENDS, REPO
from test_bounds import brute_force_optimum
from test_exact import programs_match_evaluator

from formulation import InputError, instance_from_dict, load_instance
from formulation.space import configurations
from solvers import solve
from solvers.search.uniform import lower_bound


def racks(trays: list[list[int]], tray_gb: float = 400.0, domain_gb: float = 120.0, nic_gb: float = 12.0) -> dict:
    """Racks of trays (GPUs per tray per rack); each rack one NVLink domain."""
    nodes, domains = [], []
    for r, rack in enumerate(trays):
        names = [f"r{r}t{t}" for t in range(len(rack))]
        nodes += [{"name": n, "gpu_type": "h100-sxm-80gb", "gpus": g} for n, g in zip(names, rack)]
        domains.append({"name": f"rack{r}", "nodes": names, "gb_per_s": domain_gb})
    return {
        "name": "racks",
        "model": {"num_hidden_layers": 4, "hidden_size": 1024, "intermediate_size": 3072, "num_attention_heads": 8,
                  "num_key_value_heads": 4, "vocab_size": 32000},
        "training": {"global_batch_size": 8, "seq_length": 2048, "recompute": ["none"], "zero_stage": [1],
                     "max_micro_batch_size": 1},
        "cluster": {"gpu_types": {"h100-sxm-80gb": {}}, "nodes": nodes, "nvlink_domains": domains,
                    "network": {"intra_node_gb_per_s": tray_gb, "inter_node_gb_per_s": nic_gb}},
    }


TWO_RACKS = [[2, 2], [2, 2]]  # two racks of 2 trays x 2 GPUs
THREE_GPU_TRAY = [[3, 1], [2, 2]]  # a rack of a 3-GPU and a 1-GPU tray beside one of 2 x 2


def tray_maps(cluster):
    """Every assignment of ranks to trays (GPUs inside a tray in order): the tray-level maps."""
    sizes = [n.num_gpus for n in cluster.nodes]
    labels = [n for n, g in enumerate(sizes) for _ in range(g)]
    for order in set(itertools.permutations(labels)):
        used = [0] * len(sizes)
        gpus = []
        for n in order:
            gpus.append(int(cluster.node_offset[n]) + used[n])
            used[n] += 1
        yield tuple(gpus)


def brute_force_by_config(instance) -> dict:
    """config -> least evaluated time over every partition and tray-level map (inf: none fits)."""
    maps = list(tray_maps(instance.cluster))
    return {config: brute_force_optimum(instance, config, maps) for config in configurations(instance)}


@pytest.fixture(scope="module", params=[TWO_RACKS, THREE_GPU_TRAY], ids=["two-racks", "three-gpu-tray"])
def case(request):
    instance = instance_from_dict(racks(request.param))
    return instance, brute_force_by_config(instance)


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_exact_search_on_racks_equals_brute_force(case, backend):
    instance, best = case
    result = solve(instance, solver=backend, method="exact")
    assert result.solver.status == "optimal", result.solver
    assert result.estimate.iteration_time_s == pytest.approx(min(best.values()), rel=1e-6)
    assert result.solver.bound_s <= result.estimate.iteration_time_s * (1 + 1e-9)


# CBC's pass over every program takes 30 s here: it runs with the slow checks (CP-SAT's in the quick suite)
@pytest.mark.parametrize("backend", [pytest.param(*p.values, marks=[*p.marks, pytest.mark.slow]) if p.values[0] == "cbc"
                                     else p for p in ALL_BACKENDS])
def test_program_objective_on_racks_equals_evaluator(case, backend):
    instance, _ = case
    assert programs_match_evaluator(instance, backend) >= 5


def test_bounds_on_racks_never_exceed_brute_force(case):
    instance, best = case
    for config, value in best.items():
        assert lower_bound(instance, config) <= value * (1 + 1e-9), config


def test_the_domain_is_a_level_of_its_own():
    """Inside a tray, across trays of a rack, across racks: three figures, and N counts racks, not trays."""
    cluster = instance_from_dict(racks(TWO_RACKS)).cluster
    assert cluster.group_links(np.array([0, 1])) == (400.0, math.inf, 1, 2)
    assert cluster.group_links(np.array([0, 1, 2, 3])) == (120.0, math.inf, 1, 4)
    assert cluster.group_links(np.array([0, 2, 4])) == (120.0, 12.0, 2, 1)
    assert cluster.bandwidth(0, 2) == 120.0 and cluster.bandwidth(0, 4) == 12.0
    # tp may span a rack's trays (4 GPUs here), never two racks
    assert {c.tp for c in configurations(instance_from_dict(racks(TWO_RACKS)))} == {1, 2, 4}


def test_a_rack_beats_the_same_trays_without_a_domain():
    """The same GPUs described as separate nodes (every tray its own node) plan no faster: the domain only adds
    bandwidth between trays."""
    with_domains = racks(TWO_RACKS)
    without = json.loads(json.dumps(with_domains))
    del without["cluster"]["nvlink_domains"]
    a = solve(instance_from_dict(with_domains), solver="cpsat", method="exact")
    b = solve(instance_from_dict(without), solver="cpsat", method="exact")
    assert a.estimate.iteration_time_s < b.estimate.iteration_time_s


def _error(data: dict) -> str:
    with pytest.raises(InputError) as info:
        instance_from_dict(data)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_compact_form_cuts_listed_nodes_into_domains():
    data = racks(TWO_RACKS)
    data["cluster"]["nvlink_domains"] = {"nodes_per_domain": 2, "gb_per_s": 120.0, "prefix": "rack"}
    cluster = instance_from_dict(data).cluster
    assert cluster.domain_names == ("rack00", "rack01")
    assert list(cluster.gpu_domain) == [0, 0, 0, 0, 1, 1, 1, 1]
    data["cluster"]["nvlink_domains"] = {"nodes_per_domain": 3}
    assert "4 nodes do not divide into domains of 3" in _error(data)


@pytest.mark.parametrize("change,expected", [
    (lambda d: d[0].update(nodes=["r0t0", "r1t0"]), "listed consecutively"),
    (lambda d: d[1].update(nodes=["r0t1", "r1t0"]), "already in domain 'rack0'"),
    (lambda d: d[1].update(name="rack0"), "duplicate domain name"),
    (lambda d: d[0].update(nodes=["r0t0", "nope"]), "expected names of listed nodes"),
    (lambda d: d[0].update(gb_per_s=-1), "cluster.nvlink_domains[0].gb_per_s"),
    (lambda d: d[0].update(speed=3), "unknown key"),
])
def test_bad_domains_are_one_line_errors(change, expected):
    data = racks(TWO_RACKS)
    change(data["cluster"]["nvlink_domains"])
    assert expected in _error(data)


def test_a_node_above_64_gpus_needs_a_domain():
    data = racks([[72]])
    assert instance_from_dict(data).cluster.num_gpus == 72
    del data["cluster"]["nvlink_domains"]
    assert "cluster.nodes[0].gpus" in _error(data)


def test_no_domains_is_the_node_model():
    """Without a declared domain every node is its own: the domain arrays are the node arrays."""
    cluster = load_instance("instances/h100_128.json").cluster
    assert not cluster.has_domains and cluster.gpu_domain is cluster.gpu_node
    assert list(cluster.domain_gpus) == [n.num_gpus for n in cluster.nodes]


def test_each_rack_of_a_mixed_cluster_is_an_island():
    """H100 nodes beside two GB200 racks: the islands are the H100 pod and each rack whole (a tray of a rack sees
    its rack at NVLink speed and the other rack over the NICs, yet is never parted from its rack)."""
    from formulation.programs.islands import find_islands
    cluster = load_instance("instances/h100_gb200_256.json").cluster
    islands = find_islands(cluster)
    assert [(i.gpu_type, i.num_gpus) for i in islands] == [("h100-sxm-80gb", 112), ("gb200", 72), ("gb200", 72)]
    assert [cluster.domain_name(int(cluster.node_domain[i.nodes[0]])) for i in islands[1:]] == ["rack0", "rack1"]


def test_a_mixed_rack_cluster_prices_each_type_at_its_own_levels():
    """(B5) `type_links` on a mixed cluster with NVLink domains: a GB200 tray's fast level is its rack's NVLink
    (900 GB/s across trays), an H100 node's its own NVLink; the slow level the network beyond (review finding: the
    domain matrix was indexed by node)."""
    from solvers.bounds.every_placement import type_links
    cluster = load_instance(f"{REPO}/instances/h100_gb200_256.json").cluster
    assert type_links(cluster, "gb200") == (900.0, 48.0)
    assert type_links(cluster, "h100-sxm-80gb") == (450.0, 48.0)


def test_survivors_keep_their_racks_when_a_partial_tray_is_listed_last():
    """A re-plan lists a tray that lost GPUs after the whole ones, away from its rack-mates: the bounds group the
    cluster by domain number, so the domain matrix and the level units agree (review finding: the weakest cuts
    raised an IndexError) and the partial tray still reaches its rack at NVLink speed."""
    from formulation.inputs.failures import Survivors, parse_failed
    from solvers.bounds.levels import cluster_extremes, level_units, node_links, weakest_cuts
    instance = load_instance(f"{REPO}/instances/gb200_nvl72_576.json")
    reduced, _ = Survivors.of(instance, parse_failed("tray000:3", instance.cluster)).all
    cluster = reduced.cluster
    assert cluster.node_domain[-1] == 0 and cluster.node_domain[-2] == 7  # rack 0's partial tray listed last
    assert node_links(cluster).shape == (8, 8) and level_units(cluster) == (8, 72)
    assert cluster_extremes(cluster) == (900.0, 48.0)
    assert weakest_cuts(cluster)[0] == (48.0, 72)
