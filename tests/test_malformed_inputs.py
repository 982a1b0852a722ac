"""Bad input never crashes: exit code 2, one line on stderr naming the file and the field, no traceback.

tests/malformed/*.{json,yaml} are instance files, each with one realistic mistake; expected.json maps each
to the field path its error must name. tests/malformed/placements/ holds bad placements for h100_128.json.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import H100_128, TESTS, build_instance, run_solve, small_instance_dict
from formulation import InputError, load_instance
from formulation.placement import load_placement

MALFORMED = TESTS / "malformed"
PLACEMENTS = MALFORMED / "placements"
EXPECTED = json.loads((MALFORMED / "expected.json").read_text())
EXPECTED_PLACEMENTS = json.loads((PLACEMENTS / "expected.json").read_text())
# Errors about the whole document name no field; their problem text must still say what is wrong.
ROOT_PROBLEMS = {
    "truncated.json": "invalid JSON at line",
    "latin1_bytes.json": "not valid UTF-8",
    "top_level_list.json": "expected an object",
    "yaml_syntax_error.yaml": "invalid YAML at line",
}


def corpus(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.is_file() and p.name != "expected.json")


def parse_error_line(stderr: str) -> tuple[str, str, str]:
    """`error: FILE: FIELD: PROBLEM` -> (FILE, FIELD, PROBLEM); asserts there is exactly one line."""
    lines = stderr.splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{stderr}"
    assert "Traceback" not in stderr
    prefix, file, field, problem = lines[0].split(": ", 3)
    assert prefix == "error"
    return file, field, problem


def test_corpus_is_complete_and_large_enough():
    assert sorted(EXPECTED) == corpus(MALFORMED)
    assert sorted(EXPECTED_PLACEMENTS) == corpus(PLACEMENTS)
    assert len(EXPECTED) >= 20


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_cli_rejects_malformed_instance_with_one_line_naming_file_and_field(name):
    path = MALFORMED / name
    result = run_solve("--instance", path)
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    file, field, problem = parse_error_line(result.stderr)
    assert file == str(path)
    assert field == EXPECTED[name]
    assert EXPECTED[name] in result.stderr
    if name in ROOT_PROBLEMS:
        assert ROOT_PROBLEMS[name] in problem


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_load_instance_raises_input_error_with_the_same_field(name):
    with pytest.raises(InputError) as info:
        load_instance(MALFORMED / name)
    assert info.value.field == EXPECTED[name]
    assert info.value.file == str(MALFORMED / name)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("name", sorted(EXPECTED_PLACEMENTS))
def test_cli_rejects_bad_placement_for_h100_128(name):
    path = PLACEMENTS / name
    result = run_solve("--instance", H100_128, "--evaluate", path, "--json")
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    file, field, _ = parse_error_line(result.stderr)
    assert file == str(path)
    assert field == EXPECTED_PLACEMENTS[name]


@pytest.fixture(scope="module")
def h100_128():
    return load_instance(H100_128)


@pytest.mark.parametrize("name", ["tp_not_dividing_kv_heads.json", "gpu_used_twice.json", "zero_stage_as_string.json"])
def test_load_placement_raises_input_error_with_the_same_field(h100_128, name):
    with pytest.raises(InputError) as info:
        load_placement(PLACEMENTS / name, h100_128)
    assert info.value.field == EXPECTED_PLACEMENTS[name]


def test_nan_in_yaml_is_rejected_at_its_field(tmp_path):
    path = tmp_path / "nan.yaml"
    data = small_instance_dict()
    data["cluster"]["network"]["inter_node_gb_per_s"] = "NAN_HERE"
    path.write_text(json.dumps(data).replace('"NAN_HERE"', ".nan"))  # JSON is valid YAML
    with pytest.raises(InputError) as info:
        load_instance(path)
    assert info.value.field == "cluster.network.inter_node_gb_per_s"
    assert "finite" in info.value.problem


def test_integer_too_large_for_a_float_is_an_input_error_not_a_crash():
    data = small_instance_dict(node_matrix_gb_per_s=[[0, 10 ** 400], [10 ** 400, 0]])
    with pytest.raises(InputError) as info:
        build_instance(data)
    assert info.value.field == "cluster.network.node_matrix_gb_per_s[0][1]"
    data = small_instance_dict(inter=10 ** 400)
    with pytest.raises(InputError) as info:
        build_instance(data)
    assert info.value.field == "cluster.network.inter_node_gb_per_s"
    data = small_instance_dict(global_batch_size=10 ** 400)  # would overflow in the first float operation
    with pytest.raises(InputError) as info:
        build_instance(data)
    assert info.value.field == "training.global_batch_size"


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_integer_beyond_pythons_digit_limit_is_an_input_error(tmp_path, suffix):
    path = tmp_path / f"digits{suffix}"
    path.write_text(json.dumps(small_instance_dict()).replace('"global_batch_size": 16', '"global_batch_size": '
                                                                                        + "9" * 5000))
    with pytest.raises(InputError) as info:
        load_instance(path)
    assert info.value.field == "<root>" and "4300 digits" in info.value.problem


def test_node_pair_naming_a_list_instead_of_a_node_is_an_input_error():
    data = small_instance_dict(node_pairs=[{"nodes": [["n0"], "n1"], "gb_per_s": 20.0}])
    with pytest.raises(InputError) as info:
        build_instance(data)
    assert info.value.field == "cluster.network.node_pairs[0].nodes"


def test_missing_instance_file_is_an_input_error(tmp_path):
    result = run_solve("--instance", tmp_path / "nope.json")
    assert result.returncode == 2
    file, field, problem = parse_error_line(result.stderr)
    assert file == str(tmp_path / "nope.json") and field == "<root>" and "not found" in problem


# ---- fuzz: any single-value mutation of a valid instance loads or raises InputError, nothing else -----------

FUZZ_BASE = small_instance_dict(
    nodes=[{"node": "n1", "inter_node_gb_per_s": 24.0}],
    node_pairs=[{"nodes": ["n0", "n1"], "gb_per_s": 20.0}],
    gpu_pairs=[{"gpus": ["n0:0", "n1:0"], "gb_per_s": 20.0}, {"gpus": ["n0:0", "n0:1"], "gb_per_s": 200.0}],
    node_matrix_gb_per_s=[[0.0, 40.0], [40.0, 0.0]])


def _leaf_paths(value, prefix=()):
    yield prefix
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        yield from _leaf_paths(item, prefix + (key,))


FUZZ_PATHS = list(_leaf_paths(FUZZ_BASE))[1:]
FUZZ_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 10 ** 6), st.just(10 ** 400), st.floats(allow_nan=True),
    st.text(max_size=6), st.sampled_from(["n0", "n1:3", "n2:0", "h100-sxm-80gb", "full", "silu"]),
    st.lists(st.one_of(st.integers(-1, 4), st.text(max_size=3)), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


def test_fuzz_base_instance_is_valid_and_uses_every_override_kind():
    cluster = build_instance(FUZZ_BASE).cluster
    assert cluster.inter_gb_per_s[0, 1] == 20.0 and cluster.gpu_pair_gb_per_s == {(0, 4): 20.0}
    assert cluster.bandwidth(0, 1) == 200.0


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(path=st.sampled_from(FUZZ_PATHS), value=FUZZ_VALUES)
def test_any_single_field_mutation_loads_or_raises_input_error(path, value):
    data = copy.deepcopy(FUZZ_BASE)
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    try:
        instance = build_instance(data)
    except InputError as exc:
        assert "\n" not in str(exc) and exc.field
        return
    # It loaded: every bandwidth the model will use must be a positive finite number.
    cluster = instance.cluster
    off_diagonal = [m[~np.eye(len(m), dtype=bool)] for m in (*cluster.intra_gb_per_s, cluster.inter_gb_per_s)]
    assert all(math.isfinite(x) and x > 0 for values in off_diagonal for x in values)
    assert all(math.isfinite(x) and x > 0 for x in cluster.gpu_pair_gb_per_s.values())
