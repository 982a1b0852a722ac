"""Bad input never crashes: exit code 2, one line on stderr naming the file and the field, no traceback.

tests/malformed/*.{json,yaml} are instance files, each with one realistic mistake; expected.json maps each
to the field path its error must name. tests/malformed/placements/ holds bad placements for h100_128.json.
tests/infeasible/ holds valid instances no plan fits (exit code 1); its expected.json maps each to a phrase
the one-line reason must contain.
"""

from __future__ import annotations

import codecs
import contextlib
import copy
import io
import json
import math
import subprocess
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import H100_128, TESTS, build_instance, run_solve, small_instance_dict
from formulation import InputError, load_instance
from formulation.inputs.cluster import MAX_GPUS, MAX_GPUS_PER_NODE, MAX_NODES
from formulation.inputs.model import read_json_file
from formulation.placement_file import load_placement
from solvers.outputs.cli import main as cli_main

MALFORMED = TESTS / "malformed"
PLACEMENTS = MALFORMED / "placements"
INFEASIBLE = TESTS / "infeasible"
EXPECTED = json.loads((MALFORMED / "expected.json").read_text())
EXPECTED_PLACEMENTS = json.loads((PLACEMENTS / "expected.json").read_text())
EXPECTED_INFEASIBLE = json.loads((INFEASIBLE / "expected.json").read_text())
# Errors about the whole document name no field; their problem text must still say what is wrong.
ROOT_PROBLEMS = {
    "truncated.json": "invalid JSON at line",
    "latin1_bytes.json": "not valid UTF-8",
    "top_level_list.json": "expected an object",
    "yaml_syntax_error.yaml": "invalid YAML at line",
    "empty_file.json": "file is empty",
    "whitespace_only.yaml": "file is empty (only whitespace)",
    "utf16_with_bom.json": "file is UTF-16",
    "yaml_top_level_list.yaml": "expected an object",
    "deeply_nested.json": "nested too deeply",
    "deeply_nested.yaml": "nested too deeply",
}
# Cases where the field alone does not show that the right thing was caught.
FIELD_PROBLEMS = {
    "million_nodes.json": f"expected an integer <= {MAX_NODES:,}, got 1,000,000",
    "too_many_gpus_in_total.json": f"exceed the supported maximum of {MAX_NODES:,} nodes and {MAX_GPUS:,} GPUs",
    "duplicate_key.json": "duplicate key",
    "duplicate_key.yaml": "duplicate key",
    "boolean_batch_size.json": "expected an integer, got boolean",
    "fractional_batch_size.json": "expected an integer, got number 512.5",
    "hf_config_self_reference.json": "refers to the instance file itself",
    "hf_config_not_json.json": "README.md: invalid JSON at line 1",
    "hf_config_is_a_directory.json": "is a directory",
    "nan_token_in_node_matrix.json": "NaN is not a valid number",
    "negative_infinity_latency.json": "-Infinity is not a valid number",
    "seq_length_not_divisible_by_cp.json": "context-parallel size 2 does not divide seq_length 4097",
    "megabyte_string.json": "(1,000,039 characters)",
    # found by fuzzing the CLI (2026-11-27): each crashed, hung or was accepted
    "global_batch_beyond_any_cluster.json": "expected an integer <= 1,000,000,000",  # hung enumerating divisors
    "hidden_size_1e308.json": "expected an integer <= 1,000,000,000",  # OverflowError in the memory model
    "latency_1e308_us.json": "expected a number <= 1e+06",  # CP-SAT domain overflow
    "bandwidth_1e-300.json": "expected a positive number",  # CP-SAT domain overflow
    "peak_tflops_1e308.json": "expected a number <= 1e+09",  # accepted: a plan at MFU 0
    "name_with_lone_surrogate.json": "unpaired UTF-16 surrogate",  # crashed writing the report
    "experts_per_tok_without_experts.json": "without an expert count",  # planned as a dense model
    "hf_config_is_a_device.json": "expected a regular file",  # /dev/zero read until memory ran out
}
MAX_LINE = 1000  # an error line repeats at most a clipped value (formulation.errors.MAX_ERROR_TEXT)


def run_cli(*args: str | Path) -> subprocess.CompletedProcess:
    """`solve ARGS` in this process: `solvers.outputs.cli.main`, as the console script calls it. All of the CLI but the
    interpreter start, which would be most of the time of 70 cases (a few run as real subprocesses below)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exit_:
        cli_main([str(a) for a in args])
    return subprocess.CompletedProcess(args, exit_.value.code, out.getvalue(), err.getvalue())


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
    assert sorted(EXPECTED_INFEASIBLE) == corpus(INFEASIBLE)
    assert len(EXPECTED) >= 40
    assert len(EXPECTED_INFEASIBLE) >= 2
    assert set(ROOT_PROBLEMS) == {name for name, field in EXPECTED.items() if field == "<root>"}
    assert set(FIELD_PROBLEMS) <= set(EXPECTED) and not set(FIELD_PROBLEMS) & set(ROOT_PROBLEMS)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_cli_rejects_malformed_instance_with_one_line_naming_file_and_field(name):
    path = MALFORMED / name
    result = run_cli("--instance", path)
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert len(result.stderr) < MAX_LINE, result.stderr[:MAX_LINE]
    file, field, problem = parse_error_line(result.stderr)
    assert file == str(path)
    assert field == EXPECTED[name]
    assert EXPECTED[name] in result.stderr
    if name in ROOT_PROBLEMS:
        assert ROOT_PROBLEMS[name] in problem
    if name in FIELD_PROBLEMS:
        assert FIELD_PROBLEMS[name] in problem


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
    result = run_cli("--instance", H100_128, "--evaluate", path, "--json")
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    file, field, _ = parse_error_line(result.stderr)
    assert file == str(path)
    assert field == EXPECTED_PLACEMENTS[name]


@pytest.mark.parametrize("name", sorted(EXPECTED_INFEASIBLE))
def test_cli_reports_infeasible_instance_with_one_line_reason(name):
    result = run_cli("--instance", INFEASIBLE / name, "--quiet")
    assert result.returncode == 1, result.stderr
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("infeasible: "), result.stderr
    assert EXPECTED_INFEASIBLE[name] in lines[0]


@pytest.mark.parametrize("args", [("--instance", MALFORMED / "truncated.json"),
                                  ("--instance", MALFORMED / "utf16_with_bom.json"),
                                  ("--instance", MALFORMED / "million_nodes.json"),
                                  ("--instance", H100_128, "--evaluate", PLACEMENTS / "gpu_used_twice.json"),
                                  ("--instance", INFEASIBLE / "prime_batch_no_dp.json", "--quiet")])
def test_the_solve_process_answers_as_the_in_process_cli_does(args):
    process, in_process = run_solve(*args), run_cli(*args)
    assert process.returncode == in_process.returncode in (1, 2)
    assert (process.stdout, process.stderr) == (in_process.stdout, in_process.stderr)


@pytest.mark.parametrize("name", sorted(EXPECTED_INFEASIBLE))
def test_infeasible_instances_are_valid_and_small(name):
    """Infeasible is not bad input: each loads, and is small enough for its search to end in about a second."""
    assert load_instance(INFEASIBLE / name).cluster.num_gpus <= 16


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
    st.dictionaries(st.one_of(st.text(max_size=3), st.integers(), st.none()), st.integers(), max_size=3))  # YAML keys


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


# ---- guards, encodings, duplicate keys, referenced files ------------------------------------------------------

@pytest.mark.parametrize("name", ["million_nodes.json", "too_many_gpus_in_total.json", "yaml_anchor_bomb.yaml"])
def test_huge_inputs_are_refused_before_anything_is_sized_by_them(name):
    """What shows it whatever the machine's load is memory, not time: sizing a million nodes (or expanding the
    anchor bomb) would allocate gigabytes; refusing them first allocates a little more than the file."""
    import tracemalloc
    tracemalloc.start()
    try:
        with pytest.raises(InputError) as info:
            load_instance(MALFORMED / name)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 * 2**20 + 20 * (MALFORMED / name).stat().st_size, peak
    assert info.value.field == EXPECTED[name]


def test_cluster_of_exactly_max_gpus_loads_and_one_more_gpu_or_node_does_not():
    data = small_instance_dict()
    nodes = data["cluster"]["nodes"] = [{"count": MAX_GPUS // MAX_GPUS_PER_NODE, "gpu_type": "h100-sxm-80gb",
                                         "gpus": MAX_GPUS_PER_NODE}]
    assert build_instance(data).cluster.num_gpus == MAX_GPUS
    nodes.append({"name": "one-more", "gpu_type": "h100-sxm-80gb", "gpus": 1})
    with pytest.raises(InputError) as info:
        build_instance(data)
    assert info.value.field == "cluster.nodes" and f"{MAX_GPUS:,} GPUs" in info.value.problem
    data["cluster"]["nodes"] = [{"count": MAX_NODES, "gpu_type": "h100-sxm-80gb", "gpus": 1},
                                {"name": "one-more", "gpu_type": "h100-sxm-80gb", "gpus": 1}]
    with pytest.raises(InputError) as info:
        build_instance(data)
    assert info.value.field == "cluster.nodes" and f"{MAX_NODES:,} nodes" in info.value.problem


def test_utf8_byte_order_mark_is_accepted(tmp_path):
    path = tmp_path / "bom.json"
    path.write_bytes(codecs.BOM_UTF8 + json.dumps(small_instance_dict()).encode())
    assert load_instance(path).training.global_batch_size == 16


def test_yaml_merge_override_is_not_a_duplicate_key(tmp_path):
    path = tmp_path / "merge.yaml"
    path.write_text("""name: small
model: {preset: llama3-8b}
training: {global_batch_size: 16, seq_length: 2048}
cluster:
  gpu_types: {h100-sxm-80gb: {}}
  nodes: [{name: n0, gpu_type: h100-sxm-80gb, gpus: 8}, {name: n1, gpu_type: h100-sxm-80gb, gpus: 8}]
  network:
    <<: {intra_node_gb_per_s: 450, inter_node_gb_per_s: 48}
    inter_node_gb_per_s: 24
""")
    assert load_instance(path).cluster.inter_gb_per_s[0, 1] == 24.0


def test_duplicate_key_in_a_list_item_names_its_index(tmp_path):
    text = json.dumps(small_instance_dict()).replace('"gpus": 4}', '"gpus": 4, "gpus": 8}', 1)
    path = tmp_path / "dup.json"
    path.write_text(text)
    with pytest.raises(InputError) as info:
        load_instance(path)
    assert info.value.field == "cluster.nodes[0].gpus" and "duplicate key" in info.value.problem


def test_referenced_hf_config_problems(tmp_path):
    config = tmp_path / "config.json"
    config.write_text('{"num_hidden_layers": 2, "num_hidden_layers": 4}')
    with pytest.raises(InputError) as info:  # inside a parsed config: the config's own file and field
        read_json_file(config, "inst.json", "model.hf_config")
    assert (info.value.file, info.value.field) == (str(config), "num_hidden_layers")
    for text, problem in (("[1, 2]", "expected a JSON object"), ("", "file is empty"), ("{", "invalid JSON")):
        config.write_text(text)
        with pytest.raises(InputError) as info:  # the document as a whole: the referencing field
            read_json_file(config, "inst.json", "model.hf_config")
        assert (info.value.file, info.value.field) == ("inst.json", "model.hf_config")
        assert problem in info.value.problem and str(config) in info.value.problem


def test_model_preset_is_a_name_not_a_path():
    data = small_instance_dict()
    data["model"] = {"preset": "../models/llama3-8b"}  # the same file by a path: still refused
    with pytest.raises(InputError) as info:
        build_instance(data)
    assert info.value.field == "model.preset" and "unknown preset" in info.value.problem


def test_missing_layer_count_is_reported_by_its_hugging_face_name():
    data = small_instance_dict()
    del data["model"]["num_hidden_layers"]
    with pytest.raises(InputError) as info:
        build_instance(data)
    assert info.value.field == "model.num_hidden_layers" and "missing" in info.value.problem


def test_very_long_values_and_keys_are_clipped_in_the_error():
    data = small_instance_dict()
    data["training"]["x" * 100_000] = 1
    with pytest.raises(InputError) as info:
        build_instance(data)
    assert info.value.field.startswith("training.xxx") and len(str(info.value)) < MAX_LINE


def test_yaml_exponents_without_a_dot_or_sign_are_numbers():
    from formulation.inputs.instance import _parse_yaml
    assert _parse_yaml("a: 15e12\nb: 1.5e12\nc: 2.5\nd: e12\n", "x.yaml") == {"a": 15e12, "b": 1.5e12, "c": 2.5,
                                                                              "d": "e12"}

