"""Measurement and model files users hand the planner: nccl-tests logs, nvidia-smi topo -m, HF config.json.

Every sample under instances/samples/ is read by its parser; the fits agree with the figures printed in the
logs; malformed samples raise InputError naming the file; the instance keys that reference the files apply in
the documented precedence; a bad file referenced from an instance gives the CLI's one-line exit 2.
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import REPO, build_instance, run_solve, small_instance_dict, write_instance
from formulation import InputError, default_placement, evaluate, load_instance
from formulation.inputs.ingest import (fit_nccl_log, gpu_bandwidth_matrix, parse_nccl_log, parse_topology,
                                sendrecv_pair_bandwidths, summarize)
from formulation.inputs.model import model_from_dict, read_json_file
from formulation.physics import cost
from formulation.physics.cost import GroupLinks

SAMPLES = REPO / "instances" / "samples"
NCCL = SAMPLES / "nccl"
MALFORMED = SAMPLES / "malformed"

# file: (collective, ranks, hosts, busbw of the largest messages in GB/s, plausible latency range in us)
NCCL_SAMPLES = {
    "all_reduce_perf_dgx-h100_8gpu.log": ("all_reduce", 8, 1, 487, (5, 40)),
    "all_reduce_perf_dgx-a100_8gpu_old.log": ("all_reduce", 8, 1, 232, (5, 40)),
    "all_gather_perf_dgx-a100_8gpu_old.log": ("all_gather", 8, 1, 234, (5, 40)),
    "reduce_scatter_perf_dgx-h100_8gpu.log": ("reduce_scatter", 8, 1, 372, (5, 40)),
    "all_reduce_perf_2node_dgx-h100.log": ("all_reduce", 16, 2, 370, (10, 80)),
    "sendrecv_perf_dgx-a01_dgx-a02.log": ("sendrecv", 2, 2, 48.6, (2, 30)),
    "sendrecv_perf_dgx-a01_dgx-a03.log": ("sendrecv", 2, 2, 47.9, (2, 30)),
    "sendrecv_perf_dgx-a02_dgx-a03.log": ("sendrecv", 2, 2, 23.1, (2, 30)),
}
# malformed sample: field its InputError names
MALFORMED_SAMPLES = {
    "no_header.log": "<root>",
    "no_rows.log": "<root>",
    "truncated.log": "line 40",
    "non_numeric_busbw.log": "line 42",
    "topo_missing_column.txt": "line 5",
}


def test_every_sample_log_is_covered():
    assert sorted(NCCL_SAMPLES) == sorted(p.name for p in NCCL.iterdir())
    assert sorted(MALFORMED_SAMPLES) == sorted(p.name for p in MALFORMED.iterdir())


@pytest.mark.parametrize("name", sorted(NCCL_SAMPLES))
def test_nccl_sample_parses_and_fits_its_large_message_busbw(name):
    collective, ranks, hosts, busbw, (lo, hi) = NCCL_SAMPLES[name]
    log = parse_nccl_log(NCCL / name)
    assert (log.collective, log.n_ranks, log.n_nodes) == (collective, ranks, hosts)
    assert all(b.size_bytes == 2 * a.size_bytes for a, b in zip(log.rows, log.rows[1:]))
    assert all(r.in_place_time_us is not None for r in log.rows)
    assert log.avg_busbw is not None and 0 < log.avg_busbw < busbw
    largest = (log.rows[-1].busbw + log.rows[-1].in_place_busbw) / 2
    fit = fit_nccl_log(log)
    assert fit.basis == "busbw" and fit.n_ranks == ranks and fit.source == str(NCCL / name)
    assert fit.gb_per_s == pytest.approx(largest, rel=0.03)
    assert fit.gb_per_s == pytest.approx(busbw, rel=0.03)
    assert lo < fit.latency_us < hi
    assert fit.latency_us == pytest.approx(min(r.time_us for r in log.rows), rel=0.1)  # small messages: alpha


def test_mpi_prefixes_and_old_columns_are_read_by_the_header():
    old = parse_nccl_log(NCCL / "all_reduce_perf_dgx-a100_8gpu_old.log")  # "[0] " prefixes, no root column
    assert len(old.rows) == 28 and old.rows[0].size_bytes == 8 and old.hosts == ("dgx-b07",) * 8
    text = (NCCL / "all_reduce_perf_dgx-h100_8gpu.log").read_text()
    for prefix in ("0: ", "[1,0]<stdout>:", "[3] "):
        tagged = parse_nccl_log("x.log", "\n".join(prefix + line for line in text.splitlines()))
        assert tagged.rows == parse_nccl_log(NCCL / "all_reduce_perf_dgx-h100_8gpu.log").rows
    no_redop = parse_nccl_log(NCCL / "all_gather_perf_dgx-a100_8gpu_old.log")  # no redop, no root
    assert no_redop.rows[0].size_bytes == 256 and no_redop.rows[0].time_us == pytest.approx(11.91)


def test_in_place_na_cells_are_accepted_and_out_of_place_figures_used():
    text = (NCCL / "sendrecv_perf_dgx-a01_dgx-a02.log").read_text().splitlines()
    out = []
    for line in text:
        cells = line.split()
        out.append(line if line.startswith("#") else "  ".join(cells[:9] + ["N/A", "N/A", "N/A", "0"]))
    log = parse_nccl_log("sendrecv_perf_na.log", "\n".join(out))
    assert all(r.in_place_time_us is None for r in log.rows)
    assert fit_nccl_log(log).gb_per_s == pytest.approx(48.6, rel=0.03)


def test_without_rank_lines_the_fit_falls_back_to_algorithm_bandwidth():
    text = (NCCL / "all_reduce_perf_dgx-h100_8gpu.log").read_text()
    log = parse_nccl_log("all_reduce_perf.log", "\n".join(l for l in text.splitlines() if "Rank" not in l))
    assert log.n_ranks is None
    fit = fit_nccl_log(log)
    assert fit.basis == "algbw" and fit.gb_per_s == pytest.approx(487 / 1.75, rel=0.03)
    assert fit_nccl_log(log, n_ranks=8).gb_per_s == pytest.approx(487, rel=0.03)


def test_sendrecv_pair_logs_give_the_node_pair_bandwidths_with_the_slow_pair():
    pairs = {("dgx-a01", "dgx-a02"): NCCL / "sendrecv_perf_dgx-a01_dgx-a02.log",
             ("dgx-a01", "dgx-a03"): NCCL / "sendrecv_perf_dgx-a01_dgx-a03.log",
             ("dgx-a02", "dgx-a03"): NCCL / "sendrecv_perf_dgx-a02_dgx-a03.log"}
    bw = sendrecv_pair_bandwidths(pairs)
    assert bw[("dgx-a01", "dgx-a02")] == pytest.approx(48.6, rel=0.03)
    assert bw[("dgx-a02", "dgx-a03")] < 0.6 * min(bw[("dgx-a01", "dgx-a02")], bw[("dgx-a01", "dgx-a03")])
    with pytest.raises(InputError, match="expected a sendrecv_perf log"):
        sendrecv_pair_bandwidths({("a", "b"): NCCL / "all_reduce_perf_dgx-h100_8gpu.log"})


def test_dgx_h100_topology_is_nv18_everywhere():
    topo = parse_topology(SAMPLES / "topo" / "dgx-h100_topo.txt")
    assert topo.num_gpus == 8 and topo.nics == tuple(f"NIC{i}" for i in range(12))
    m = gpu_bandwidth_matrix(topo, "h100")
    off = ~np.eye(8, dtype=bool)
    assert np.all(m[off] == 450.0) and np.all(np.diag(m) == 0)


def test_pcie_a100_box_with_nvlink_bridges():
    topo = parse_topology(SAMPLES / "topo" / "a100-pcie-nvlink-bridge_topo.txt")
    assert topo.nics == ("mlx5_0", "mlx5_1")
    m = gpu_bandwidth_matrix(topo, "a100")
    assert m[0, 1] == m[2, 3] == m[4, 5] == m[6, 7] == 300.0  # NV12 bridges
    assert m[0, 2] == 24.0 and m[4, 6] == 18.0 and m[0, 4] == 12.0 == m[7, 3]  # PIX, NODE, SYS
    assert np.array_equal(m, m.T)
    custom = gpu_bandwidth_matrix(topo, "a100", {"NV12": 250.0, "SYS": 9.0})
    assert custom[0, 1] == 250.0 and custom[0, 4] == 9.0 and custom[0, 2] == 24.0
    assert gpu_bandwidth_matrix(topo, "a100", {"NV": 20.0})[0, 1] == 240.0


def test_topology_header_with_terminal_underline_codes():
    text = (SAMPLES / "topo" / "a100-pcie-nvlink-bridge_topo.txt").read_text().splitlines()
    text[0] = "\x1b[4m" + text[0] + "\x1b[0m"
    assert parse_topology("t.txt", "\n".join(text)).classes[0][1] == "NV12"


@pytest.mark.parametrize("name", sorted(MALFORMED_SAMPLES))
def test_malformed_samples_raise_input_error_naming_the_file(name):
    parse = parse_topology if name.endswith(".txt") else parse_nccl_log
    with pytest.raises(InputError) as info:
        parse(MALFORMED / name)
    assert info.value.file == str(MALFORMED / name)
    assert info.value.field == MALFORMED_SAMPLES[name]
    assert "\n" not in str(info.value)


def hf(name):
    path = SAMPLES / "hf" / name / "config.json"
    return model_from_dict(read_json_file(path, str(path), "model"), str(path), "")


@pytest.mark.parametrize("name, billions, kv, head_dim, dropout", [
    ("qwen2-7b", 7.62, 4, 128, False), ("mistral-7b-v0.1", 7.24, 8, 128, False), ("llama-3.1-8b", 8.03, 8, 128, False),
    ("gpt-neox-20b", 20.55, 64, 96, False), ("llava-onevision-qwen2-7b", 7.62, 4, 128, False)])
def test_real_hf_configs_load(name, billions, kv, head_dim, dropout):
    model = hf(name)
    assert model.total_params / 1e9 == pytest.approx(billions, rel=0.01)
    assert (model.num_kv_heads, model.head_dim, model.dropout) == (kv, head_dim, dropout)
    assert model.mlp == ("gelu" if name == "gpt-neox-20b" else "swiglu")


def test_mixtral_loads_with_its_experts():
    model = hf("mixtral-8x7b-v0.1")
    assert (model.moe.num_experts, model.moe.topk, model.moe.num_moe_layers) == (8, 2, 32)


def test_hf_nulls_nesting_and_dropout_probabilities():
    base = {"num_hidden_layers": 2, "hidden_size": 5120, "intermediate_size": 14336, "num_attention_heads": 32,
            "vocab_size": 1000, "hidden_act": "silu"}
    nulls = model_from_dict({**base, "num_key_value_heads": None, "head_dim": None}, "c.json", "")
    assert (nulls.num_kv_heads, nulls.head_dim) == (32, 160)
    assert model_from_dict({**base, "head_dim": 128, "num_key_value_heads": 8}, "c.json", "").head_dim == 128
    nested = model_from_dict({"tie_word_embeddings": True, "vision_config": {}, "text_config": base}, "c.json", "")
    assert nested.tie_word_embeddings and nested.num_layers == 2
    gelu = {**base, "hidden_act": "gelu"}
    assert model_from_dict(gelu, "c.json", "").dropout
    assert not model_from_dict({**gelu, "hidden_dropout": 0.0, "attention_dropout": 0.0}, "c.json", "").dropout
    assert model_from_dict({**base, "attention_dropout": 0.1}, "c.json", "").dropout
    with pytest.raises(InputError) as info:  # a nested MoE config's errors name the nested field
        model_from_dict({**base, "text_config": {**base, "num_local_experts": 8, "num_experts_per_tok": 9}},
                        "c.json", "")
    assert info.value.field == "text_config.num_experts_per_tok" and "8" in info.value.problem


def test_summaries_name_what_the_planner_takes():
    text = summarize(NCCL / "all_reduce_perf_2node_dgx-h100.log")
    assert "16 ranks on 2 hosts" in text and "per GPU (NIC)" in text and "\n" not in text
    assert "busbw" in summarize(NCCL / "all_reduce_perf_dgx-a100_8gpu_old.log")
    topo = summarize(SAMPLES / "topo" / "a100-pcie-nvlink-bridge_topo.txt", gpu_generation="a100")
    assert "4 x NV12" in topo and "300" in topo
    assert "7.62 B parameters" in summarize(SAMPLES / "hf" / "qwen2-7b" / "config.json")
    with pytest.raises(InputError, match="not recognised"):
        summarize(SAMPLES / "malformed" / "no_header.log")


def test_measured_cluster_loads_with_every_measurement_applied_and_evaluates():
    inst = load_instance(SAMPLES / "measured_cluster.json")
    c = inst.cluster
    intra = fit_nccl_log(parse_nccl_log(NCCL / "all_reduce_perf_dgx-h100_8gpu.log"))
    inter = fit_nccl_log(parse_nccl_log(NCCL / "all_reduce_perf_2node_dgx-h100.log"))
    pair = sendrecv_pair_bandwidths({("a", "b"): NCCL / "sendrecv_perf_dgx-a01_dgx-a02.log"})[("a", "b")]
    assert c.intra_gb_per_s[0][0, 1] == pytest.approx(intra.gb_per_s)  # dgx-a01: its all_reduce log
    assert c.intra_gb_per_s[1][0, 1] == 450.0  # dgx-a02: NV18 from its topology
    assert c.inter_gb_per_s[0, 1] == pytest.approx(pair)  # sendrecv log beats the level figure
    # the latency figures give each log's zero-size time back under NCCL's tuning model (docs/collectives.md)
    one = cost.collective_time("all_reduce", 1.0, GroupLinks(8, 450.0, float("inf"), 1, 8), c)
    assert one == pytest.approx(intra.latency_us * 1e-6, rel=1e-3)
    two = cost.collective_time("all_reduce", 1.0, GroupLinks(16, 450.0, 50.0, 2, 8), c)
    assert two == pytest.approx(inter.latency_us * 1e-6, rel=1e-3)
    estimate = evaluate(inst, default_placement(inst, tp=4, pp=2))
    assert estimate.fits and 0 < estimate.iteration_time_s < 60


def cluster(base_dir=SAMPLES, **network):
    return build_instance(small_instance_dict(2, 8, **network), "inst.json", base_dir).cluster


def test_inter_level_log_gives_per_nic_bandwidth_and_applies_to_listed_nodes_only():
    log = {"file": "nccl/all_reduce_perf_2node_dgx-h100.log", "level": "inter"}
    busbw = fit_nccl_log(parse_nccl_log(SAMPLES / log["file"])).gb_per_s
    c = cluster(nccl_tests=[log])
    assert c.inter_gb_per_s[0, 1] == pytest.approx(busbw / 8)
    c3 = build_instance(small_instance_dict(3, 8, inter=20.0, nccl_tests=[{**log, "nodes": ["n0", "n1"]}]),
                        "inst.json", SAMPLES).cluster
    assert c3.inter_gb_per_s[0, 1] == pytest.approx(busbw / 8)
    assert c3.inter_gb_per_s[0, 2] == c3.inter_gb_per_s[1, 2] == 20.0  # a pair runs at its slower end


def test_a_log_that_does_not_tell_needs_collective_ranks_and_ranks_per_node(tmp_path):
    text = (NCCL / "all_reduce_perf_2node_dgx-h100.log").read_text()
    (tmp_path / "run7.log").write_text("\n".join(line for line in text.splitlines() if "Rank" not in line))
    entry = {"file": "run7.log", "level": "inter"}
    for extra, field in [({}, "collective"), ({"collective": "all_reduce"}, "ranks"),
                         ({"collective": "all_reduce", "ranks": 16}, "ranks_per_node")]:
        with pytest.raises(InputError) as info:
            cluster(tmp_path, nccl_tests=[{**entry, **extra}])
        assert info.value.field == f"cluster.network.nccl_tests[0].{field}"
    told = cluster(tmp_path, nccl_tests=[{**entry, "collective": "all_reduce", "ranks": 16, "ranks_per_node": 8}])
    assert told.inter_gb_per_s[0, 1] == pytest.approx(370 / 8, rel=0.03)


def test_precedence_log_then_topology_then_gpu_pairs_and_pairs_then_sendrecv():
    c = cluster(nccl_tests=[{"file": "nccl/all_reduce_perf_dgx-h100_8gpu.log", "level": "intra"}],
                nvidia_smi_topo=[{"file": "topo/a100-pcie-nvlink-bridge_topo.txt", "nodes": ["n1"],
                                  "gpu_generation": "a100", "table": {"SYS": 10}}],
                gpu_pairs=[{"gpus": ["n1:0", "n1:1"], "gb_per_s": 100.0}],
                node_pairs=[{"nodes": ["n0", "n1"], "gb_per_s": 5.0}],
                sendrecv_logs=[{"nodes": ["n1", "n0"], "file": "nccl/sendrecv_perf_dgx-a02_dgx-a03.log"}])
    assert c.intra_gb_per_s[0][0, 7] == pytest.approx(487, rel=0.03)  # the log
    assert c.intra_gb_per_s[1][0, 4] == 10.0 and c.intra_gb_per_s[1][2, 3] == 300.0  # topology + table
    assert c.intra_gb_per_s[1][0, 1] == 100.0  # gpu_pairs beat the topology
    assert c.inter_gb_per_s[0, 1] == pytest.approx(23.1, rel=0.03)  # sendrecv log beats node_pairs


@pytest.mark.parametrize("entry, key, field, problem", [
    ({"file": "nccl/missing.log", "level": "intra"}, "nccl_tests", "nccl_tests[0].file", "file not found"),
    ({"file": "malformed/truncated.log", "level": "intra"}, "nccl_tests", "nccl_tests[0].file", "line 40"),
    ({"file": "nccl/all_reduce_perf_2node_dgx-h100.log", "level": "intra"}, "nccl_tests", "nccl_tests[0].level",
     "2 hosts"),
    ({"file": "nccl/all_reduce_perf_dgx-h100_8gpu.log", "level": "inter"}, "nccl_tests", "nccl_tests[0].level",
     "do not span"),
    ({"file": "topo/dgx-h100_topo.txt", "gpu_generation": "z100"}, "nvidia_smi_topo",
     "nvidia_smi_topo[0].gpu_generation", "expected one of"),
    ({"file": "topo/dgx-h100_topo.txt", "table": {"NVLINK": 3}}, "nvidia_smi_topo",
     "nvidia_smi_topo[0].table.NVLINK", "link class"),
    ({"file": "malformed/topo_missing_column.txt"}, "nvidia_smi_topo", "nvidia_smi_topo[0].file", "line 5"),
    ({"nodes": ["n0", "n9"], "file": "nccl/sendrecv_perf_dgx-a01_dgx-a02.log"}, "sendrecv_logs",
     "sendrecv_logs[0].nodes", "known node"),
])
def test_bad_measurement_entries_name_the_field_and_the_file(entry, key, field, problem):
    with pytest.raises(InputError) as info:
        cluster(**{key: [entry]})
    assert info.value.file == "inst.json" and info.value.field == f"cluster.network.{field}"
    assert problem in info.value.problem and "\n" not in str(info.value)


def test_topology_of_another_size_than_the_node_is_refused():
    with pytest.raises(InputError, match="the topology has 8 GPUs, node 'n0' has 4"):
        build_instance(small_instance_dict(2, 4, nvidia_smi_topo=[{"file": "topo/dgx-h100_topo.txt"}]),
                       "inst.json", SAMPLES)


def test_cli_exits_2_with_one_line_for_an_instance_referencing_a_malformed_log(tmp_path):
    data = small_instance_dict(2, 8, nccl_tests=[{"file": str(MALFORMED / "non_numeric_busbw.log"), "level": "intra"}])
    path = write_instance(tmp_path, data, "bad.json")
    result = run_solve("--instance", path)
    assert result.returncode == 2 and result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr
    log = MALFORMED / "non_numeric_busbw.log"
    assert lines[0].startswith(f"error: {path}: cluster.network.nccl_tests[0].file: {log}: line 42: ")


def test_solve_ingest_summarises_each_file_and_refuses_a_broken_one():
    samples = REPO / "instances" / "samples"
    out = run_solve("ingest", samples / "nccl" / "all_reduce_perf_dgx-h100_8gpu.log",
                    samples / "hf" / "qwen2-7b" / "config.json")
    assert out.returncode == 0, out.stderr
    assert "487.9 GB/s" in out.stdout and "7.62 B parameters" in out.stdout
    out = run_solve("ingest", samples / "malformed" / "no_rows.log")
    assert out.returncode == 2 and "no data rows" in out.stderr and "Traceback" not in out.stderr
