"""One paragraph on any input file a user hands the planner, so they can check what it will take from it before
planning (`solve ingest FILE`): the fit of an nccl-tests log, the link matrix of a topology, the model of a
Hugging Face config.json."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from formulation.errors import InputError
from formulation.inputs.model import model_from_dict, read_json_file
from formulation.inputs.ingest.common import read_text
from formulation.inputs.ingest.nccl import fit_nccl_log, parse_nccl_log
from formulation.inputs.ingest.network import level_figures
from formulation.inputs.ingest.topo import GENERATIONS, gpu_bandwidth_matrix, parse_topology

_NCCL_HEADER = re.compile(r"#\s*size\s+count\s.*\btime\b", re.MULTILINE)
_TOPO_ROW = re.compile(r"^\s*(?:\x1b\[[0-9;]*m)?GPU0\s+X\b", re.MULTILINE)


def summarize(path: str | Path, gpu_generation: str | None = None) -> str:
    """A human-readable summary of an nccl-tests log, `nvidia-smi topo -m` output or HF config.json.

    `gpu_generation` (a key of `topo.GENERATIONS`) adds the GPU-pair bandwidths to a topology's summary.
    Raises `InputError` for a file of none of these kinds or a malformed one.
    """
    file = str(path)
    text = read_text(path)
    if text.lstrip().startswith("{"):
        return _config_summary(Path(path))
    if _NCCL_HEADER.search(text):
        return _nccl_summary(file, text)
    if _TOPO_ROW.search(text):
        return _topo_summary(file, text, gpu_generation)
    raise InputError(file, "<root>", "not recognised: expected an nccl-tests log, nvidia-smi topo -m output or a "
                                     "Hugging Face config.json")


def _bytes(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n} B"


def _nccl_summary(file: str, text: str) -> str:
    log = parse_nccl_log(file, text)
    fit = fit_nccl_log(log)
    name = f"{log.collective}_perf" if log.collective else "nccl-tests (test not named in the file)"
    hosts = sorted(set(log.hosts))
    where = (f"{log.n_ranks} ranks on {len(hosts)} host{'s' if len(hosts) > 1 else ''} ({', '.join(hosts)})"
             if hosts else "ranks not listed")
    parts = [f"{name} log {file}: {where}, {len(log.rows)} message sizes from {_bytes(log.rows[0].size_bytes)} to "
             f"{_bytes(log.rows[-1].size_bytes)}."]
    basis = ("bus bandwidth" if fit.basis == "busbw" else
             "algorithm bandwidth (the busbw factor is unknown without the test name and rank count)")
    parts.append(f"Alpha-beta fit in {basis}: latency {fit.latency_us:.1f} us, bandwidth {fit.gb_per_s:.1f} GB/s.")
    parts.append(f"The largest message measured {log.rows[-1].busbw:.1f} GB/s busbw"
                 + (f"; the log's average bus bandwidth is {log.avg_busbw:.2f} GB/s." if log.avg_busbw is not None
                    else "; the log has no average-bandwidth footer."))
    if fit.basis == "busbw" and len(hosts) > 1 and log.n_ranks % len(hosts) == 0:
        per_node = log.n_ranks // len(hosts)
        gb, step = level_figures(fit, "inter", per_node)
        ranks = f"{per_node} rank{'s' if per_node > 1 else ''} per node"
        parts.append(f"As an inter-node log ({ranks}) it gives {gb:.1f} GB/s per GPU (NIC) and an inter-node "
                     f"latency figure of {step:.1f} us (inter_node_latency_us).")
    elif fit.basis == "busbw":
        gb, step = level_figures(fit, "intra")
        parts.append(f"As an intra-node log it gives {gb:.1f} GB/s per GPU and an intra-node latency figure of "
                     f"{step:.2f} us (intra_node_latency_us).")
    return " ".join(parts)


def _topo_summary(file: str, text: str, gpu_generation: str | None) -> str:
    topo = parse_topology(file, text)
    g = topo.num_gpus
    counts = Counter(topo.classes[i][j] for i in range(g) for j in range(i + 1, g))
    nics = f"{len(topo.nics)} NICs ({', '.join(topo.nics)})" if topo.nics else "no NICs"
    pairs = ", ".join(f"{count} x {cls}" for cls, count in sorted(counts.items()))
    lines = [f"nvidia-smi topo -m output {file}: {g} GPUs, {nics}; GPU pairs: {pairs}."]
    if gpu_generation is None:
        lines[0] += f" Give a GPU generation ({', '.join(GENERATIONS)}) to see the bandwidths the planner uses."
        cells = [list(row) for row in topo.classes]
    else:
        matrix = gpu_bandwidth_matrix(topo, gpu_generation)
        lines[0] += f" GPU-pair bandwidth (GB/s, {gpu_generation} table):"
        cells = [["X" if i == j else f"{matrix[i, j]:g}" for j in range(g)] for i in range(g)]
    width = max(5, *(len(c) + 1 for row in cells for c in row))
    lines.append(" " * 6 + "".join(f"GPU{j}".rjust(width) for j in range(g)))
    lines += [f"GPU{i}".ljust(6) + "".join(c.rjust(width) for c in row) for i, row in enumerate(cells)]
    return "\n".join(lines)


def _config_summary(path: Path) -> str:
    data = read_json_file(path, str(path), "<root>")
    if not isinstance(data, dict):
        raise InputError(str(path), "<root>", "expected a JSON object (a Hugging Face config.json)")
    model = model_from_dict(data, str(path), "")
    nested = " (the language model of a multimodal config's text_config; other towers are not planned)" \
        if "text_config" in data else ""
    mlp = "SwiGLU" if model.mlp == "swiglu" else "GELU"
    moe = model.moe
    experts = "" if moe is None else (
        f"; mixture of experts in {sum(moe.layer_pattern)} of {model.num_layers} layers: {moe.num_experts} experts of "
        f"FFN {moe.expert_ffn_hidden_size}, {moe.topk} per token" +
        (f", shared expert FFN {moe.shared_expert_ffn_hidden_size}" if moe.shared_expert_ffn_hidden_size else ""))
    return (f"Hugging Face config {path}: {model.name}{nested}, {model.num_layers} layers, hidden "
            f"{model.hidden_size}, {model.num_attention_heads} attention heads ({model.num_kv_heads} key-value heads, "
            f"head dim {model.head_dim}), FFN {model.ffn_hidden_size} ({mlp} MLP{experts}), vocabulary {model.vocab_size}, "
            f"{'tied' if model.tie_word_embeddings else 'separate'} input and output embeddings, "
            f"{'with' if model.dropout else 'no'} dropout: {model.total_params / 1e9:.2f} B parameters.")
