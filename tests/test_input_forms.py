"""Inputs take the forms the documentation shows: the compact `nodes` form with or without its list, and a
placement given to `formulation.evaluate` as a dict, read as a placement file is (issue 42, findings 4 and 8)."""

from __future__ import annotations

import json

import pytest

from conftest import H100_128, build_instance, run_solve, small_instance_dict, write_instance
from formulation import InputError, default_placement, evaluate, load_instance
from formulation.placement_file import load_placement


def _compact(nodes) -> dict:
    data = small_instance_dict(4, 8)
    data["cluster"]["nodes"] = nodes
    return data


def test_compact_nodes_alone_or_in_a_list_give_the_cluster_the_named_nodes_give():
    """docs/instance-format.md: `{"count", "prefix", "gpu_type", "gpus"}` stands for count identical nodes,
    alone or as an item of the list."""
    compact = {"count": 4, "prefix": "n", "gpu_type": "h100-sxm-80gb", "gpus": 8}
    named = build_instance(_compact([{"name": f"n{i:02d}", "gpu_type": "h100-sxm-80gb", "gpus": 8}
                                     for i in range(4)])).cluster
    for form in (compact, [compact]):
        cluster = build_instance(_compact(form)).cluster
        assert cluster.nodes == named.nodes
        assert [n.name for n in cluster.nodes] == ["n00", "n01", "n02", "n03"]
    mixed = build_instance(_compact([{"name": "head", "gpu_type": "h100-sxm-80gb", "gpus": 8},
                                     dict(compact, count=3)])).cluster
    assert [n.name for n in mixed.nodes] == ["head", "n01", "n02", "n03"]  # numbering continues across the list


def test_the_compact_form_of_the_docs_loads_from_a_file(tmp_path):
    data = _compact({"count": 2, "prefix": "h100-", "gpu_type": "h100-sxm-80gb", "gpus": 8})
    path = write_instance(tmp_path, data)
    result = run_solve("--instance", path, "--method", "baseline", "--json")
    assert result.returncode == 0, result.stderr
    gpus = json.loads(result.stdout)["placement"]["gpus"]
    assert {g.split(":")[0] for g in gpus} == {"h100-00", "h100-01"}


@pytest.mark.parametrize("nodes, field, problem", [
    ({"name": "n0", "gpu_type": "h100-sxm-80gb", "gpus": 8}, "cluster.nodes", 'without "count"'),
    ({"count": 2, "gpu_type": "a100", "gpus": 8}, "cluster.nodes.gpu_type", "not defined"),
    ({"count": 2, "gpu_type": "h100-sxm-80gb", "gpus": 8, "extra": 1}, "cluster.nodes.extra", "unknown key"),
    ("n0", "cluster.nodes", "expected a list, got string"),
])
def test_bad_nodes_name_the_field_and_the_form_expected(nodes, field, problem):
    with pytest.raises(InputError) as err:
        build_instance(_compact(nodes))
    assert err.value.field == field and problem in err.value.problem


def test_evaluate_takes_a_dict_placement_with_the_placement_files_defaults(tmp_path):
    """README: a placement may omit `dp` (the GPUs left), `layers_per_stage` (even split) and `gpus` (ranks
    filled node by node), `zero_stage` (0) and more; `formulation.evaluate` reads a dict the way `--evaluate` reads the file."""
    instance = load_instance(H100_128)
    by_dict = evaluate(instance, {"tp": 8, "pp": 4})
    path = tmp_path / "placement.json"
    path.write_text(json.dumps({"tp": 8, "pp": 4}))
    from_file = load_placement(path, instance)
    # zero_stage 0 unless distributed_optimizer is true: Megatron-LM's default
    assert from_file == default_placement(instance, tp=8, pp=4, zero_stage=0, micro_batch_size=1, recompute="none")
    assert by_dict == evaluate(instance, from_file)
    plan_file = {"placement": from_file.to_dict(instance.cluster), "estimate": {}}  # a plan file works too
    assert evaluate(instance, plan_file) == by_dict


@pytest.mark.parametrize("placement, field", [
    ({"tp": 8, "pp": 4, "tpp": 2}, "tpp"),
    ({"tp": 3, "pp": 4}, "tp"),
    ({"pp": 4}, "tp"),
    ("tp=8 pp=4", "<root>"),
])
def test_a_bad_dict_placement_is_one_input_error(placement, field):
    with pytest.raises(InputError) as err:
        evaluate(load_instance(H100_128), placement)
    assert err.value.file == "<placement>" and err.value.field == field and "\n" not in str(err.value)
