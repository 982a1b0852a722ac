"""Launchable outputs of a plan: Megatron-LM arguments, launch scripts (torchrun and Slurm), torchtitan settings.

`export_plan(instance, plan, out_dir)` writes every file atomically after the group self-check
(`solvers.outputs.launch.check_groups`) has passed on the launch scripts as rendered, read back from their text.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from formulation.inputs.job import DEFAULT_RECOMPUTE_MODULES
from formulation.placement import Placement
from solvers.outputs.files import write_json_atomic, write_text_atomic
from solvers.outputs.racks import check_domains, layout_lines, rack_environment, slurm_rack_lines
from solvers.outputs.model_arguments import model_arguments, moe_arguments, vocab_padding  # noqa: F401 (re-export)
from solvers.outputs.report import comment_lines
from solvers.outputs.llm_foundry import fsdp_config_yaml
from solvers.outputs.torchtitan import torchtitan_args_script, torchtitan_toml

from solvers.outputs.launch import (TRAIN_SCRIPT, LaunchMismatch, check_groups, parse_slurm_files,
                                    parse_torchrun_script, slurm_files, slurm_launch, torchrun_launch, torchrun_script)

__all__ = ["TRAIN_SCRIPT", "LaunchMismatch", "check_groups", "export_plan", "megatron_arguments", "pipeline_layout",
           "parse_pipeline_layout", "slurm_files", "torchrun_script", "torchtitan_toml"]


# ---- Megatron-LM -----------------------------------------------------------------------------------------

def pipeline_layout(layers: tuple[int, ...], vpp: int) -> str:
    """`--pipeline-model-parallel-layout` string: virtual stages in Megatron's order (chunk c of stage i is entry
    c x pp + i), 't' a decoder layer, 'E' the embedding on the first, 'L' the loss on the last; runs of
    identical stages are folded as '(...|)*n' and 't*k' as Megatron's parser unrolls them."""
    pp = len(layers)
    stages = []
    for chunk in range(vpp):
        for stage in range(pp):
            n = layers[stage] // vpp
            text = "t" if n == 1 else f"t*{n}" if n else ""
            if chunk == 0 and stage == 0:
                text = "E" + text
            if chunk == vpp - 1 and stage == pp - 1:
                text += "L"
            stages.append(text)
    runs: list[list] = []
    for text in stages:
        if runs and runs[-1][0] == text:
            runs[-1][1] += 1
        else:
            runs.append([text, 1])
    pieces = []
    for i, (text, count) in enumerate(runs):
        last = i == len(runs) - 1
        repeat = count - 1 if last else count
        if repeat > 1:
            pieces.append(f"({text}|)*{repeat}")
        elif repeat == 1:
            pieces.append(f"{text}|")
        if last:
            pieces.append(text)
    return "".join(pieces)


def parse_pipeline_layout(layout: str, pp: int) -> list[list[int]]:
    """Decoder layers per [stage][chunk], parsed as Megatron-LM's `PipelineParallelLayerLayout` does."""
    text = layout.replace(",", "")
    text = re.sub(r"\(([^)]+)\)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), text)
    text = re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), text)
    flat = text.split("|")
    if len(flat) % pp:
        raise ValueError(f"layout has {len(flat)} virtual stages, not a multiple of pp={pp}")
    vpp = len(flat) // pp
    return [[flat[c * pp + s].count("t") for c in range(vpp)] for s in range(pp)]


def _layer_split(model, p: Placement) -> tuple[list[tuple[str, object]], list[str]]:
    """Arguments that give Megatron-LM the plan's layers per stage (and chunks per stage)."""
    layers, vpp = p.layers_per_stage, p.vpp
    if p.pp == 1:
        return [], []
    if len(set(layers)) == 1:
        if vpp > 1:
            return [("--num-layers-per-virtual-pipeline-stage", layers[0] // vpp)], []
        return [], []
    middle = set(layers[1:-1])
    if len(middle) <= 1:
        # Megatron gives the stages without an explicit count an equal share of the remaining layers.
        args: list[tuple[str, object]] = []
        if not middle:  # pp == 2: the second stage takes what the first leaves
            args.append(("--decoder-first-pipeline-num-layers", layers[0]))
        else:
            mid = next(iter(middle))
            if layers[0] != mid:
                args.append(("--decoder-first-pipeline-num-layers", layers[0]))
            if layers[-1] != mid:
                args.append(("--decoder-last-pipeline-num-layers", layers[-1]))
        if vpp > 1:  # uneven split + interleaving: the chunk count, not the chunk size, is given
            args.append(("--num-virtual-stages-per-pipeline-rank", vpp))
        return args, []
    layout = pipeline_layout(layers, vpp)
    parsed = parse_pipeline_layout(layout, p.pp)
    assert [sum(row) for row in parsed] == list(layers), (layout, layers)
    note = ("the uneven layer split needs --pipeline-model-parallel-layout; stock Megatron-LM releases without "
            "it (check `python pretrain_gpt.py --help | grep layout`) can only move layers to the first and last "
            "stage (--decoder-first/last-pipeline-num-layers): upgrade, or re-plan with those stages fixed")
    return [("--pipeline-model-parallel-layout", layout)], [note]


# ---- the plan as Megatron-LM arguments (the model's own: solvers/outputs/model_arguments.py) ---------------

def megatron_arguments(instance, p: Placement) -> tuple[list[tuple[str, object]], list[str], dict]:
    """(arguments as (flag, value or None), notes for the reader, environment variables (None: unset))."""
    model, job = instance.model, instance.training
    args: list[tuple[str, object]] = [
        ("--tensor-model-parallel-size", p.tp), ("--pipeline-model-parallel-size", p.pp),
        ("--context-parallel-size", p.cp)]
    notes: list[str] = []
    env: dict[str, str | None] = {}
    split_args, split_notes = _layer_split(model, p)
    args += split_args
    notes += split_notes
    if p.schedule != "1f1b":  # docs/schedules.md: Megatron-Core 0.16 has no zero-bubble order
        notes.append(f"Megatron-LM cannot run the planned {p.schedule_name} schedule: these arguments run "
                     f"{'Interleaved1F1B' if p.vpp > 1 else '1F1B'}, slower (launch the plan with torchtitan)")
    args += [("--micro-batch-size", p.micro_batch_size), ("--global-batch-size", job.global_batch_size),
             ("--seq-length", job.seq_length)]
    model_args, model_notes = model_arguments(model, job.seq_length, p.tp)
    args += model_args
    notes += model_notes
    if not model.dropout:  # the memory model stores no dropout masks for this model
        args += [("--attention-dropout", 0.0), ("--hidden-dropout", 0.0)]
    args += precision_arguments(job) + grad_reduce_arguments(job)
    args.append(("--attention-backend", "flash" if job.flash_attention else "unfused"))
    if p.tp > 1 and job.sequence_parallel:
        args.append(("--sequence-parallel", None))
    if p.tp > 1 and job.tp_comm_overlap:
        args.append(("--tp-comm-overlap", None))
    if p.cp > 1:
        args.append(("--cp-comm-type", "p2p"))  # the ring exchange the cost model (C8) assumes
        if job.seq_length % (2 * p.cp):
            notes.append(f"Megatron-LM needs seq_length divisible by 2 x cp = {2 * p.cp} (causal load balancing); "
                         f"{job.seq_length} is not: pad the sequence or re-plan without cp={p.cp}")
    args += recompute_arguments(job, p)
    shard_args, shard_notes, shard_env = sharding_arguments(p)
    args += shard_args
    notes += shard_notes
    env.update(shard_env)
    if job.overlap_grad_reduce and p.dp * p.cp > 1:
        args.append(("--overlap-grad-reduce", None))
        if job.overlap_param_gather and p.zero_stage >= 1:  # Megatron-LM allows it only with overlap-grad-reduce
            args.append(("--overlap-param-gather", None))
    if (p.tp > 1 or p.cp > 1) and p.zero_stage < 2:
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"  # Megatron-LM asserts it with tp/cp (keeps comm ahead of compute)
    if p.moe_a2a_overlap:  # (E10) the Megatron MoE Model Zoo's A2A_OVERLAP=1 (sbatch_benchmarking.sh @e8650517)
        env.update({"CUDA_DEVICE_MAX_CONNECTIONS": "32", "NVTE_FWD_LAYERNORM_SM_MARGIN": "24",
                    "NVTE_BWD_LAYERNORM_SM_MARGIN": "24"})
        notes.append("the MoE all-to-all overlap (--overlap-moe-expert-parallel-comm --delay-wgrad-compute) runs "
                     "with CUDA_DEVICE_MAX_CONNECTIONS=32 and 24 SMs kept from the layernorm kernels, as the Megatron "
                     "MoE Model Zoo launches it")
    rack_env, rack_notes = rack_environment(instance, p)
    env.update(rack_env)
    notes += rack_notes
    return args + moe_arguments(model, job, p), notes, env


def sharding_arguments(p: Placement) -> tuple[list[tuple[str, object]], list[str], dict]:
    """The data-parallel sharding (formulation/physics/sharding.py) as Megatron-LM arguments: the distributed
    optimizer (zero 1, with its instances for replicas) or Megatron-FSDP (zero 2 and 3; hybrid with replicas)."""
    args: list[tuple[str, object]] = []
    notes: list[str] = []
    env: dict[str, str | None] = {}
    if p.zero_stage == 1:
        args.append(("--use-distributed-optimizer", None))
        if p.dp_replicate > 1:  # the optimizer sharded inside dp_shard x cp, replicated across the instances
            args.append(("--num-distributed-optimizer-instances", p.dp_replicate))
    if p.zero_stage >= 2:  # the flags Megatron-FSDP's documentation requires
        strategy = "optim_grads_params" if p.zero_stage == 3 else "optim_grads"
        args += [("--use-megatron-fsdp", None), ("--data-parallel-sharding-strategy", strategy),
                 ("--use-distributed-optimizer", None), ("--no-gradient-accumulation-fusion", None),
                 ("--ckpt-format", "fsdp_dtensor")]
        if p.dp_replicate > 1:  # hybrid FSDP: megatron_fsdp enables it from the instances (enable_hsdp =
            # num_distributed_optimizer_instances > 1, mcore_fsdp_adapter.py), the outer group replicated as priced
            args += [("--num-distributed-optimizer-instances", p.dp_replicate),
                     ("--outer-dp-sharding-strategy", "no_shard")]
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = None  # FSDP overlaps better with more than one connection
        notes.append(f"zero_stage {p.zero_stage} runs on Megatron-LM's FSDP (--use-megatron-fsdp, sharding strategy "
                     f"{strategy}); PyTorch FSDP2 (--use-torch-fsdp2) is the alternative only with pp=1 and "
                     "--untie-embeddings-and-output-weights; torchtitan_args.sh expresses it directly")
    return args, notes, env


def recompute_arguments(job, p: Placement) -> list[tuple[str, object]]:
    """Selective recompute with Megatron-Core's modules where the job names other than its default (core_attn),
    or full recompute: of every layer, or (recompute_num_layers r) of the first r layers of each model chunk."""
    if p.recompute == "selective":
        args: list[tuple[str, object]] = [("--recompute-granularity", "selective")]
        if tuple(job.recompute_modules) != DEFAULT_RECOMPUTE_MODULES:
            args.append(("--recompute-modules", tuple(job.recompute_modules)))  # nargs='*': one word each
        return args
    if p.recompute == "full" and p.recompute_num_layers:
        return [("--recompute-granularity", "full"), ("--recompute-method", "block"),
                ("--recompute-num-layers", p.recompute_num_layers)]
    if p.recompute == "full":
        return [("--recompute-granularity", "full"), ("--recompute-method", "uniform"), ("--recompute-num-layers", 1)]
    return []


def precision_arguments(job) -> list[tuple[str, object]]:
    """bf16 or fp16; FP8 is a bf16 run with Transformer Engine's FP8 GEMMs, with NeMo's FP8 recipe
    (bf16_with_fp8_mixed), and FP8 weights where the memory model keeps them (formulation/physics/memory.py (M6))."""
    args: list[tuple[str, object]] = [("--fp16" if job.precision == "fp16" else "--bf16", None)]
    if job.precision == "fp8" and job.fp8_recipe == "mxfp8":  # E4M3 everywhere, TE's MXFP8BlockScaling default
        args += [("--fp8-format", "e4m3"), ("--fp8-recipe", "mxfp8")]
    elif job.precision == "fp8":
        args += [("--fp8-format", "hybrid"), ("--fp8-amax-history-len", 1024), ("--fp8-amax-compute-algo", "max")]
        if job.fp8_weights:
            args.append(("--fp8-param-gather", None))
    return args


def grad_reduce_arguments(job) -> list[tuple[str, object]]:
    """The dtype Megatron-LM accumulates and reduces gradients in, the one the plan priced (`job.grad_reduce_bytes`,
    docs/model.md (C11)-(C12)): fp32 by --accumulate-allreduce-grads-in-fp32 (core_v0.16.1's validate_args sets it
    itself under --bf16 with fp32 main grads, not under --fp16: said either way), bf16 by --grad-reduce-in-bf16
    (which turns the fp32 default off); a 16-bit reduce of an fp16 run is Megatron-LM's own default."""
    if job.grad_reduce_bytes >= 4:
        return [("--accumulate-allreduce-grads-in-fp32", None)]
    return [("--grad-reduce-in-bf16", None)] if job.precision != "fp16" else []


def megatron_args_script(instance, plan) -> str:
    p, e = plan.placement, plan.estimate
    args, notes, env = megatron_arguments(instance, p)
    lines = [f"# Megatron-LM arguments for the plan of {instance.name} ({instance.model.name}, llm-train-planner).",
             f"# plan: {p.summary()}",
             f"# predicted: {e.iteration_time_s:.3f} s per iteration, {e.tokens_per_s:,.0f} tokens/s, "
             f"peak {e.peak_memory_gib:.1f} GiB per GPU",
             "# Source this file, then run Megatron-LM's pretrain_gpt.py with \"${MEGATRON_ARGS[@]}\" plus your data,",
             "# tokenizer, optimizer and checkpoint arguments (launch_torchrun.sh and launch_slurm.sh do that).",
             f"# The model is the one planned, {instance.model.total_params:,} parameters: every architectural field "
             "is below",
             "# (biases, norms, rotary base and scaling, vocabulary and its padding, experts, latent attention)."]
    lines += comment_lines(notes, "NOTE: ")
    lines += [f"unset {k}" if v is None else f"export {k}={v}" for k, v in env.items()]
    lines.append("MEGATRON_ARGS=(")
    for flag, value in args:
        words = value if isinstance(value, tuple) else () if value is None else (value,)
        lines.append(f"  {flag}" + "".join(f" {shlex.quote(str(word))}" for word in words))
    lines.append(")")
    return "\n".join(lines) + "\n"


# ---- writing -----------------------------------------------------------------------------------------------

_DESCRIPTIONS = {
    "plan.json": "the plan: placement (parallel sizes, layers per stage, GPU of every rank), estimate, solver report",
    "megatron_args.sh": "Megatron-LM arguments as a bash array MEGATRON_ARGS (source it)",
    "launch_torchrun.sh": "torchrun route: run on every node; per node its --node-rank and CUDA_VISIBLE_DEVICES",
    "launch_slurm.sh": "Slurm route: srun --distribution=arbitrary with ./hostfile, per-rank GPU table",
    "hostfile": "SLURM_HOSTFILE: line r is the host of global rank r",
    "torchtitan_args.sh": "torchtitan 0.3.x command line (TORCHTITAN_ARGS); FRAMEWORK=torchtitan in the launch scripts",
    "torchtitan-0.2.toml": "torchtitan 0.2.x [training]/[parallelism]/[activation_checkpoint] settings",
    "llm_foundry_fsdp.yaml": "llm-foundry's fsdp_config (sharding strategy, shard and replicate degrees)",
    "schedule.png": "one iteration of the pipeline schedule (Gantt chart, critical path outlined)",
    "memory.png": "memory per GPU of every pipeline stage against the limit and the capacity",
    "cluster.png": "node x GPU grid coloured by pipeline stage, with the inter-node bandwidth matrix and slow links",
    "report.html": "the tables and the pictures on one page",
}


def export_plan(instance, plan, out_dir, pictures: bool = False) -> dict[str, Path]:
    """Write every launch file of `plan` (a PlanResult: placement, estimate, to_dict) into `out_dir`.

    Everything is rendered and self-checked before the first file is written, so a failed check leaves no
    partial output. Returns file name -> path of everything written.
    """

    p, out = plan.placement, Path(out_dir)
    files: dict[str, str] = {"megatron_args.sh": megatron_args_script(instance, plan)}
    slurm = slurm_launch(instance, p)
    racks = slurm_rack_lines(instance.cluster, list(dict.fromkeys(slurm.hostfile)))
    hostfile, slurm_script = slurm_files(slurm, p, instance.training.framework, racks)
    launched = parse_slurm_files(hostfile, slurm_script)
    check_groups(instance, p, launched)
    check_domains(instance, p, launched.realise(instance.cluster), "slurm")
    files["launch_slurm.sh"], files["hostfile"] = slurm_script, hostfile
    torchrun = torchrun_launch(instance, p)
    if torchrun is not None:
        files["launch_torchrun.sh"] = torchrun_script(torchrun, p, instance.training.framework)
        launched_torchrun = parse_torchrun_script(files["launch_torchrun.sh"])
        check_groups(instance, p, launched_torchrun)
        check_domains(instance, p, launched_torchrun.realise(instance.cluster), "torchrun")
    files["torchtitan_args.sh"] = torchtitan_args_script(instance, plan)
    files["torchtitan-0.2.toml"] = torchtitan_toml(instance, plan)
    if instance.training.software_stack == "llm-foundry":
        files["llm_foundry_fsdp.yaml"] = fsdp_config_yaml(instance, p)
    written: dict[str, Path] = {}
    write_json_atomic(out / "plan.json", plan.to_dict(instance.cluster))
    written["plan.json"] = out / "plan.json"
    for name, text in files.items():
        write_text_atomic(out / name, text, executable=name.startswith("launch_"))
        written[name] = out / name
    if pictures:
        from solvers.outputs.plots import write_pictures
        from solvers.outputs.report_html import report_html
        written.update(write_pictures(instance, p, plan.estimate, out))
        write_text_atomic(out / "report.html", report_html(instance, plan, written))
        written["report.html"] = out / "report.html"
    readme = [f"Launch files for the plan of {instance.name} ({instance.model.name}), written by llm-train-planner.",
              "plan: " + p.summary(), "",
              "Group self-check passed: Megatron-LM's tp, cp, dp, dp-with-cp and pp groups"
              + (" and its expert groups (ep, expert tp, expert dp, tp-ep)" if p.ep * p.etp > 1 else "")
              + " rebuilt from " + ("both launch routes" if torchrun is not None else "the Slurm route")
              + " equal the plan's groups.", ""]
    if instance.cluster.has_domains:
        readme += ["Rack self-check passed: every tp, cp and ep group the plan keeps inside one NVLink domain lies "
                   "inside one in " + ("both launch routes" if torchrun is not None else "the Slurm route") + ".",
                   *layout_lines(instance.cluster, p), ""]
    if torchrun is None:
        readme += ["No launch_torchrun.sh: some node hosts ranks that are not one contiguous block of equal size, "
                   "which torchrun cannot express; use launch_slurm.sh.", ""]
    readme += [f"{name:20s} {_DESCRIPTIONS.get(name, '')}" for name in [*written, "README.txt"] if name != "README.txt"]
    readme.append(f"{'README.txt':20s} this file")
    write_text_atomic(out / "README.txt", "\n".join(readme) + "\n")
    written["README.txt"] = out / "README.txt"
    return written
