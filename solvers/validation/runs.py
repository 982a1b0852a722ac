"""Measured training runs (the format of the packaged formulation/data/reference/published_runs.csv) as instances + placements.

Defaults for blank cells (documented in docs/validation.md):
- kv_heads blank: multi-head attention (kv_heads = heads). MLP: GELU with 2 matrices when ffn = 4 x hidden
  (GPT, MPT, Nemotron's squared ReLU), SwiGLU otherwise. GPT-style runs (GELU) carry dropout.
- cp, vp, mbs blank: 1. layers_per_stage (an optional column) blank: layers split evenly over pp. An optional
  `dp_replicate` column (blank: 1): the states sharded over dp / dp_replicate ranks and replicated across
  dp_replicate groups (HSDP, FSDP1's HYBRID_SHARD, Megatron's distributed-optimizer instances). recompute blank:
  none; `block:r` is Megatron-LM's block method (recompute "full" with
  recompute_num_layers r: the first r layers of each model chunk). zero blank: 1 (Megatron distributed optimizer) for
  Megatron-Core/NeMo-era sources, 0 for SC21/2020/2022 Megatron sources.
- Sequence parallelism and flash attention: on for sources from 2023 on; off for SC21, the Sept 2020
  README and Korthikanti's baselines without sequence parallelism; optional `flash_attention` and `dropout` columns
  (true / false) where a source says otherwise. An optional `schedule` column: the schedule family, `1f1b` (blank)
  or `zero_bubble`, scored whatever the stack (docs/schedules.md, "Against published runs").
- TP communication overlap: on where the notes say `--tp-comm-overlap` or a `tp_comm_overlap` column says true.
- Software stack: an optional `software_stack` column; blank: `llm-foundry` for llm-foundry's rows (Composer on
  PyTorch FSDP1, Composer's default BACKWARD_POST prefetch), `torchtitan` where the notes say FSDP, else
  `megatron`: Megatron-LM's own FSDP (notes naming Megatron-FSDP, `--use-megatron-fsdp`, `--use-custom-fsdp` or
  `--use-torch-fsdp2`, or a Megatron / NeMo source) is `megatron`. The loss is a fused
  cross entropy except on torchtitan's own rows: llm-foundry's MPT class defaults to flash-attn's
  (`loss_fn: fused_crossentropy`), Megatron-LM's is its fused vocab-parallel one. Rotary embeddings: an optional
  `rotary_impl` column; blank: `rotation_matrix` on IBM's fms-fsdp rows (fms's Llama), `complex` elsewhere.
- Per-row assumptions on the packaged reference files (ROW_ASSUMPTIONS, row_assumptions.csv): applied on load,
  recorded on the run (`Run.assumptions`), never applied to another file.
Measured iteration time: `iter_s`; else global batch x seq / (tokens/s per GPU x GPUs); else from TFLOP/s
per GPU with the source's own FLOP formula (SC21: 96 B s l h^2 (1 + s/6h + V/16lh); Megatron-Core README:
Megatron-LM's `num_floating_point_operations`).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from formulation.data import REFERENCE_DIR
from formulation.errors import InputError, file_problem
from formulation.inputs.instance import Instance, instance_from_dict
from formulation.placement import Placement, even_split
from solvers.validation.moe_runs import MODEL_COLUMNS, MOE_ROW_OFFSET, moe_run_from_row
from solvers.validation.run_cells import flag_cell as _flag, number_cell as _float, recompute_cell as _recompute
from solvers.validation.run_cells import schedule_cell as _schedule, whole_cell as _int
from solvers.validation.run_cluster import cluster_section

DEFAULT_RUNS = REFERENCE_DIR / "published_runs.csv"
DEFAULT_MEMORY = REFERENCE_DIR / "published_memory.csv"
# The packaged dense file whose rows are predicted, never fitted: the published schedule comparisons (docs/schedules.md)
PREDICTED_ONLY = "published_runs_zero_bubble.csv"
# Our per-row assumptions on the packaged reference files, kept apart from the published rows (which stay
# byte-identical to their sources): file, row, field, published value, assumed value, reason.
ROW_ASSUMPTIONS = REFERENCE_DIR / "row_assumptions.csv"
# Rows of the packaged `published_runs.csv` used neither for fitting nor for the accuracy figures, with the reason
# (loaded as skipped, so `solve validate` prints it). Only that file: a user's own CSV keeps every row it has.
EXCLUDED = {
    row: "DeepSpeed ZeRO-3 baseline of SC21 (2021): its per-parameter gathers ran far below NCCL link bandwidth "
         "(measured 3-5x slower than the bandwidth bound); our ZeRO-3 model assumes bucketed per-layer "
         "gathers at full bandwidth as in PyTorch FSDP, which the MPT rows validate"
    for row in range(10, 16)
}


@dataclass
class Run:
    row: int
    name: str
    source: str
    gpu_type: str
    instance: Instance | None
    placement: Placement | None
    measured_iter_s: float | None
    measured_how: str
    measured_peak_memory_gb: float | None
    measured_oom: bool
    skipped_reason: str | None = None
    assumptions: tuple[str, ...] = ()  # "field: published -> assumed (reason)" from ROW_ASSUMPTIONS
    fitted: bool = True  # False: predicted only, never part of a fit (the MoE reference rows, issue 15)
    flags: tuple[str, ...] = ()  # features the source used that the model does not have (scored regardless)

    @property
    def group(self) -> tuple:
        """A sweep group: same model, GPU type, GPU count, sequence length and global batch."""
        if self.instance is None:
            return (self.name,)
        return (self.instance.model.name, self.gpu_type, self.placement.world_size if self.placement else 0,
                self.instance.training.seq_length, self.instance.training.global_batch_size)


def _is_old_megatron(source: str) -> bool:
    return any(tag in source for tag in ("SC21", "Sept 2020", "Korthikanti"))


def sc21_flops(r: dict) -> float:
    """SC21's count (includes the recompute forward): 96 B s l h^2 (1 + s/6h + V/16lh)."""
    B, s, l, h, V = (_float(r, k) for k in ("gbs", "seq", "layers", "hidden", "vocab"))
    return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))


def run_from_row(index: int, r: dict) -> Run:
    name = r["model"].strip()
    gpu_type = r["gpu_type"].strip()
    source = r["source"]
    mem_text = (r.get("measured_peak_memory_gb") or "").strip()
    base = dict(row=index, name=name, source=source, gpu_type=gpu_type, instance=None, placement=None,
                measured_iter_s=None, measured_how="", measured_peak_memory_gb=_float(r, "measured_peak_memory_gb"),
                measured_oom=mem_text.upper() == "OOM")

    def skip(reason: str) -> Run:
        return Run(**base, skipped_reason=reason)

    precision = (r.get("precision") or "").strip().lower()
    if precision not in ("bf16", "fp16", "fp8"):
        return skip(f"precision {precision or 'unknown'} is not modelled yet (bf16, fp16 and fp8 are)")
    if _int(r, "ep", 1) > 1:
        return skip("mixture-of-experts run (ep > 1): MoE runs go in the MoE runs format, a model_preset or "
                    "model_config column with ep, etp, dispatcher and layers_per_stage (as the packaged "
                    "published_runs_moe.csv; solvers/validation/moe_runs.py, docs/moe.md)")
    if not r["tp"].strip() or not r["pp"].strip():
        return skip("parallel configuration (tp, pp) not published")
    tp, pp, dp = _int(r, "tp"), _int(r, "pp"), _int(r, "dp", 1)
    cp, vpp, mbs = _int(r, "cp", 1), _int(r, "vp", 1), _int(r, "mbs", 1)
    n_gpus, gbs = _int(r, "n_gpus"), _int(r, "gbs")
    if not n_gpus or not gbs or not mbs:
        return skip("n_gpus, gbs and mbs must be positive whole numbers")
    if tp * pp * cp * dp != n_gpus:
        return skip(f"tp x pp x cp x dp = {tp * pp * cp * dp} differs from n_gpus = {n_gpus}")
    old = _is_old_megatron(source)
    recompute, block = _recompute(r)
    if block < 0:
        return skip(f"recompute {recompute!r}: expected block:<layers per chunk>, a positive integer")
    zero = _int(r, "zero", 0 if old else 1)
    data = _instance_data(index, r, precision, recompute, zero, old)
    try:
        instance = instance_from_dict(data, f"runs row {index}")
    except ValueError as exc:
        return skip(f"cannot build the model: {exc}")
    split = _layers_per_stage(r, instance.model.num_layers, pp, vpp)
    if isinstance(split, str):
        return skip(split)
    replicas = max(1, _int(r, "dp_replicate", 1))  # an optional column: HSDP, distributed-optimizer instances
    schedule = _schedule(r)
    if schedule != "1f1b" and pp < 2:
        return skip(f"schedule {schedule} needs pp >= 2")
    placement = Placement(tp=tp, pp=pp, cp=cp, dp=dp, vpp=vpp, micro_batch_size=mbs, recompute=recompute,
                          zero_stage=zero, layers_per_stage=split, gpus=tuple(range(n_gpus)),
                          recompute_num_layers=block, dp_replicate=replicas if dp % replicas == 0 else 1,
                          schedule=schedule)
    if block and (instance.training.software_stack == "megatron-deepspeed" or instance.model.moe is not None):
        return skip("block recompute is modelled for dense models on the megatron and PyTorch stacks")
    problem = _split_problem(placement, gbs, replicas)
    if problem:
        return skip(problem)
    measured, how = _measured_time(r, instance, n_gpus)
    if measured is None:  # kept whole: a run that measured out-of-memory is still scored on memory
        return Run(**{**base, "instance": instance, "placement": placement, "skipped_reason": how})
    return Run(**{**base, "instance": instance, "placement": placement, "measured_iter_s": measured,
                  "measured_how": how})


def _layers_per_stage(r: dict, layers: int, pp: int, vpp: int) -> tuple[int, ...] | str:
    """The layers per pipeline stage, or why the row gives none: an optional `layers_per_stage` column
    (comma-separated, as the MoE format's: Megatron-Core's embedding- and loss-accounting splits give the first and
    last stage fewer layers), else an even split, whose stages must split into vpp chunks evenly."""
    text = (r.get("layers_per_stage") or "").strip()
    if not text:
        split = even_split(layers, pp)
        if vpp > 1 and any(n % vpp for n in split):
            return f"{layers} layers do not split into pp={pp} x vpp={vpp} chunks evenly"
        return split
    try:
        split = tuple(int(x) for x in text.split(","))
    except ValueError:
        return f"layers_per_stage {text!r}: expected comma-separated whole numbers"
    if len(split) != pp or sum(split) != layers or min(split) < 1:
        return f"layers_per_stage {split} is not {pp} stages of {layers} layers"
    return split


def _split_problem(p: Placement, gbs: int, replicas: int) -> str | None:
    """Why a row's batch or replicas cannot be split as it says, else None (its layers: _layers_per_stage)."""
    if replicas != p.dp_replicate or (replicas > 1 and p.zero_stage == 0):
        return f"dp_replicate {replicas}: expected a divisor of dp {p.dp}, with zero 1, 2 or 3"
    if gbs % (p.micro_batch_size * p.dp):
        return f"global batch {gbs} not divisible by micro-batch {p.micro_batch_size} x dp {p.dp}"
    return None


def _instance_data(index: int, r: dict, precision: str, recompute: str, zero: int, old: bool) -> dict:
    """The instance a row describes: its model, its job as the source ran it, and a uniform cluster of its GPU
    type with the row's link figures (and NVLink domains where the row names them: run_cluster.py). Old Megatron-LM (2020-21) ran without flash attention and sequence
    parallelism (unless the row says so) and with GPT-style dropout."""
    name, gpu_type = r["model"].strip(), r["gpu_type"].strip()
    n_gpus, mbs = _int(r, "n_gpus"), _int(r, "mbs", 1)
    hidden, heads, ffn = _int(r, "hidden"), _int(r, "heads"), _int(r, "ffn")
    gelu = ffn == 4 * hidden
    model = {"name": name, "num_hidden_layers": _int(r, "layers"), "hidden_size": hidden, "intermediate_size": ffn,
             "num_attention_heads": heads, "num_key_value_heads": _int(r, "kv_heads", heads),
             "vocab_size": _int(r, "vocab"), "hidden_act": "gelu" if gelu else "silu",
             "dropout": _flag(r, "dropout", gelu and old)}
    per_node = _int(r, "gpus_per_node", 8)
    if per_node < 1:
        raise ValueError(f"column gpus_per_node: expected a positive whole number, got {per_node}")
    compiled = "torch.compile" in r["notes"] and "no torch.compile" not in r["notes"]
    return {
        "name": f"row{index}", "description": name, "model": model,
        "training": {"global_batch_size": _int(r, "gbs"), "seq_length": _int(r, "seq"), "precision": precision,
                     "recompute": [recompute], "zero_stage": [zero], "max_micro_batch_size": mbs,
                     "context_parallel_sizes": [_int(r, "cp", 1)], "virtual_pipeline_sizes": [_int(r, "vp", 1)],
                     "flash_attention": _flag(r, "flash_attention", not old),
                     "sequence_parallel": not old or "sequence-parallel" in (r["recompute"] or ""),
                     # an optional `tp_comm_overlap` column (true / false) says it where the notes do not
                     "tp_comm_overlap": ((r.get("tp_comm_overlap") or "").strip().lower() == "true"
                                         or "tp-comm-overlap" in r["notes"]), "memory_limit_fraction": 1.0,
                     # an optional `software_stack` column names the stack; else read from the source and notes
                     "software_stack": (r.get("software_stack") or "").strip() or _stack_of(r),
                     "torch_compile": compiled,
                     # torchtitan compiles the loss with the model since 2025-04 (bbb1b616e); older rows say
                     # otherwise in row_assumptions.csv (an optional `compiled_loss` column)
                     "compiled_loss": compiled and (r.get("compiled_loss") or "").strip().lower() != "false",
                     # llm-foundry's MPT class defaults to flash-attn's fused cross entropy (loss_fn:
                     # fused_crossentropy, llmfoundry/models/mpt/modeling_mpt.py); Megatron's is fused too
                     "fused_cross_entropy": not _pytorch_fsdp(r) or "llm-foundry" in r["source"],
                     # an optional `rotary_impl` column; blank: IBM's fms-fsdp trains fms's Llama, whose rotary
                     # embedding multiplies by fp32 2x2 rotation matrices (fms RotaryEmbedding.adjusted_qk)
                     "rotary_impl": (r.get("rotary_impl") or "").strip() or ("rotation_matrix" if "fms-fsdp" in
                                                                             r["source"] else "complex"),
                     # an optional `grad_reduce_dtype` column (bf16 / fp32; blank: the gradient state's dtype)
                     **({"grad_reduce_dtype": r["grad_reduce_dtype"].strip()} if (r.get("grad_reduce_dtype") or
                                                                                  "").strip() else {})},
        # an optional `nvlink_domain_gpus` column: the nodes (trays) form NVLink domains of that many GPUs
        "cluster": cluster_section(gpu_type, n_gpus, per_node, _float(r, "intra_node_gb_per_s"),
                                   _float(r, "inter_node_gb_per_s"), _int(r, "nvlink_domain_gpus")),
    }


def _measured_time(r: dict, instance: Instance, n_gpus: int) -> tuple[float | None, str]:
    if _float(r, "iter_s"):
        return _float(r, "iter_s"), "iter_s"
    tokens = instance.training.global_batch_size * instance.training.seq_length
    if _float(r, "tokens_per_s_per_gpu"):
        return tokens / (_float(r, "tokens_per_s_per_gpu") * n_gpus), "from tokens/s"
    tflops = _float(r, "tflops_per_gpu")
    if tflops:
        if "SC21" in r["source"]:
            return sc21_flops(r) / (tflops * 1e12 * n_gpus), "from TFLOP/s (SC21 formula)"
        flops = instance.model.megatron_model_flops(instance.training.global_batch_size, instance.training.seq_length)
        return flops / (tflops * 1e12 * n_gpus), "from TFLOP/s (Megatron-LM formula)"
    return None, "no measured time, tokens/s or TFLOP/s"


def row_assumptions(path: str | Path) -> dict[int, list[dict]]:
    """The assumptions that apply to a packaged reference file, by row (none for any other file)."""
    path = Path(path).resolve()
    if path.parent != REFERENCE_DIR.resolve():
        return {}
    with open(ROW_ASSUMPTIONS, newline="", encoding="utf-8") as handle:
        out: dict[int, list[dict]] = {}
        for a in csv.DictReader(handle):
            if a["file"] == path.name:
                out.setdefault(int(a["row"]), []).append(a)
        return out


def resolve_runs_path(path: str | Path) -> Path:
    """`path`, or a bare name of a packaged reference file (e.g. `published_runs_moe.csv`) that is not a local file."""
    path = Path(path)
    if not path.exists() and path.parent == Path(".") and (REFERENCE_DIR / path.name).is_file():
        return REFERENCE_DIR / path.name
    return path


def load_runs(path: str | Path = DEFAULT_RUNS) -> list[Run]:
    """A runs CSV: the dense format, or the MoE format (a `model_preset` or `model_config` column,
    solvers/validation/moe_runs.py).
    A bare file name that does not exist is looked up among the packaged reference files."""
    path = resolve_runs_path(path)
    columns, rows = read_rows(path)
    moe = bool(set(MODEL_COLUMNS) & set(columns))
    if not moe:
        missing = [c for c in REQUIRED_COLUMNS if c not in columns]
        if missing or not set(MEASURED_COLUMNS) & set(columns):
            raise InputError(str(path), "<header>", f"missing columns: {', '.join(missing or MEASURED_COLUMNS)}"
                             + ("" if missing else " (one of them)") + "; the minimal columns are in docs/validation.md")
    assumed = {} if moe else row_assumptions(path)
    runs = []
    for i, row in enumerate(rows):
        try:
            runs.append(moe_run_from_row(MOE_ROW_OFFSET + i, row, path.parent) if moe else
                        _run_with_assumptions(path, i, row, assumed))
        except InputError:
            raise
        except (ValueError, KeyError, ArithmeticError) as exc:  # a cell the row's conversion could not read
            problem = f"column {exc.args[0]} is missing" if isinstance(exc, KeyError) else str(exc)
            raise InputError(str(path), f"row {i}", problem) from None
    for run in runs if path.resolve() == (REFERENCE_DIR / PREDICTED_ONLY).resolve() else ():
        run.fitted = False
    if path.resolve() == DEFAULT_RUNS.resolve():
        for run in runs:
            if run.row in EXCLUDED and run.skipped_reason is None:
                run.skipped_reason = f"excluded: {EXCLUDED[run.row]}"
    return runs


# Columns every dense runs file has (cells may be blank), and those of which it needs one: docs/validation.md
REQUIRED_COLUMNS = ("source", "model", "layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq", "gpu_type",
                    "n_gpus", "gpus_per_node", "intra_node_gb_per_s", "inter_node_gb_per_s", "precision", "tp", "pp",
                    "dp", "cp", "vp", "mbs", "gbs", "recompute", "zero", "ep", "notes")
MEASURED_COLUMNS = ("iter_s", "tokens_per_s_per_gpu", "tflops_per_gpu")


def read_rows(path: Path) -> tuple[list[str], list[dict]]:
    """The header and the rows of a CSV file as dicts (short rows padded with blanks, a byte-order mark
    dropped); any problem an `InputError` naming the file."""
    problem = file_problem(path)
    if problem:
        raise InputError(str(path), "<root>", problem)
    try:
        with open(path, newline="", encoding="utf-8-sig") as handle:
            reader = csv.DictReader(handle, restval="")
            rows = list(reader)
            columns = [c.strip() for c in reader.fieldnames or []]
    except UnicodeDecodeError as exc:
        raise InputError(str(path), "<root>", f"file is not valid UTF-8 (byte {exc.start})") from None
    except csv.Error as exc:
        raise InputError(str(path), "<root>", f"not a CSV file: {exc}") from None
    except OSError as exc:
        raise InputError(str(path), "<root>", f"cannot read file: {exc.strerror or exc}") from None
    if not columns:
        raise InputError(str(path), "<header>", "empty file: expected a header line of column names "
                         "(docs/validation.md)")
    # header names with stray spaces still name their column; cells beyond the header (key None) are dropped
    rows = [{(k or "").strip(): v for k, v in row.items() if k is not None} for row in rows]
    return columns, rows


def _run_with_assumptions(path: Path, i: int, row: dict, assumed: dict) -> Run:
    notes = []
    for a in assumed.get(i, []):
        # the file changed under the assumption: say so (a column the file lacks reads as blank)
        if row.get(a["field"], "") != a["published"]:
            raise InputError(str(ROW_ASSUMPTIONS.name), f"row {i}", f"{path} row {i} field {a['field']} is "
                             f"{row.get(a['field'], '')!r}, the assumption expects {a['published']!r}")
        row[a["field"]] = a["assumed"]
        notes.append(f"{a['field']}: {a['published'] or 'blank'} -> {a['assumed']} ({a['reason']})")
    run = run_from_row(i, {**{c: "" for c in MEASURED_COLUMNS}, **row})
    run.assumptions = tuple(notes)
    return run


def is_test_row(row: int) -> bool:
    """The held-out split: every third row (row % 3 == 0) is never used for fitting."""
    return row % 3 == 0


# Megatron-LM's own FSDP (the megatron-fsdp package, `--use-megatron-fsdp`, earlier `--use-custom-fsdp`) and its
# PyTorch FSDP2 option (`--use-torch-fsdp2`): FSDP in the notes of a Megatron-LM run, which is the megatron stack
MEGATRON_FSDP_MARKS = ("megatron-fsdp", "megatron_fsdp", "megatron fsdp", "custom-fsdp", "custom_fsdp", "custom fsdp",
                       "torch-fsdp2", "torch_fsdp2")


def _pytorch_fsdp(r: dict) -> bool:
    """The notes say FSDP and mean PyTorch's FSDP stacks, not Megatron-LM's own (MEGATRON_FSDP_MARKS, or a
    Megatron / NeMo source)."""
    notes, source = r["notes"].lower(), r["source"].lower()
    return ("FSDP" in r["notes"] and not any(mark in notes for mark in MEGATRON_FSDP_MARKS)
            and "megatron" not in source and "nemo" not in source)


def _stack_of(r: dict) -> str:
    """A row's software stack when its file does not say (module docstring)."""
    if "llm-foundry" in r["source"]:
        return "llm-foundry"
    return "torchtitan" if _pytorch_fsdp(r) else "megatron"
