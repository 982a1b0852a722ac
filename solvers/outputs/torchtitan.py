"""The plan as torchtitan settings: the command line of its current release and the TOML of its 0.2.x releases.

Degrees map one to one (torchtitan's mesh order pp, dp_replicate, dp_shard, cp, tp matches Megatron's tp-cp-dp-pp).
What torchtitan cannot run as planned is mapped to what it can run, and that placement is scored by
`formulation.evaluate`, so the files state the time and memory it costs:
- torchtitan has no optimizer-only sharding (zero_stage 1, Megatron's distributed optimizer);
- with cp > 1 its FSDP mesh is dp_shard x cp, so parameters are always sharded over the cp ranks (zero_stage 3 over
  dp x cp is the faithful case);
- 0.2.x runs replicated data parallelism only alone ("DDP has not supported > 1D parallelism" with tp or pp);
  0.3.x wraps replicate in fully_shard over (dp_replicate, fsdp) and accepts it with tp and pp.
zero_stage 0 is torchtitan's replicate, zero_stage 3 its FSDP over data_parallel_shard_degree = dp_shard, replicated
over data_parallel_replicate_degree = dp_replicate (HSDP), with `fsdp_reshard_after_forward` "always" (the per-layer
gather in forward and backward that the cost model charges; with pp > 1 the backward's gather in every micro-batch,
the gradients reduced once per step, docs/model.md (C12); torchtitan's default skips the forward reshard when pp > 1)
or "never" (the plan's reshard_after_forward False).
"""

from __future__ import annotations

import dataclasses
import shlex
from dataclasses import dataclass

from formulation import evaluate
from formulation.inputs.frameworks import torchtitan_zero_stages as runnable_zero_stages
from formulation.physics.pipeline_sim import stage_rank
from formulation.physics.v_schedules import V_FAMILIES
from formulation.placement import Placement
from solvers.outputs.report import comment_lines

# The releases each output was checked against (tests/test_frameworks_torchtitan.py).
CHECKED = {"0.3": "torchtitan 0.3.0 (torch 2.13.0)", "0.2": "torchtitan 0.2.2 (torch 2.13.0)"}


@dataclass(frozen=True)
class TorchtitanRun:
    """What one torchtitan release runs for a plan: its data-parallel degrees and the placement it amounts to."""
    release: str
    placement: Placement  # the plan with the zero_stage torchtitan actually runs
    estimate: object  # formulation.evaluate of `placement`
    notes: tuple[str, ...]

    @property
    def shard(self) -> bool:
        return self.placement.zero_stage == 3

    @property
    def replicate_degree(self) -> int:
        return self.placement.dp_replicate if self.shard else self.placement.dp

    @property
    def shard_degree(self) -> int:
        return self.placement.dp_shard if self.shard else 1


def _why_not(p: Placement, release: str) -> str:
    reasons = []
    if p.zero_stage in (1, 2):
        reasons.append(f"torchtitan has no {'optimizer' if p.zero_stage == 1 else 'optimizer and gradient'}-only "
                       "sharding (Megatron's distributed optimizer, ZeRO-2)")
    if p.cp > 1:
        reasons.append("with context_parallel_degree > 1 torchtitan shards parameters over the cp ranks (its FSDP "
                       "mesh is dp_shard x cp), so replicated data parallelism is not available")
    elif release == "0.2" and (p.tp > 1 or p.pp > 1):
        reasons.append(f"torchtitan {release}.x refuses replicate with tp or pp ('DDP has not supported > 1D "
                       "parallelism'); HSDP (replicate x shard) is the other option it has")
    return f"the plan's zero_stage {p.zero_stage} cannot run as planned: " + "; ".join(reasons)


def expert_notes(p: Placement) -> tuple[str, ...]:
    """What torchtitan does differently with the plan's expert parallelism (its ParallelismConfig docs)."""
    if p.ep * p.etp == 1:
        return ()
    notes = ["torchtitan carves its expert-parallel groups out of its dp_shard x cp mesh (x tp when "
             "expert_tensor_parallel_degree = 1), not in Megatron-Core's etp-ep-edp rank order the GPU map was "
             "planned for: the expert groups may differ from the plan's (the Megatron route realises them)"]
    if p.etp not in (1, p.tp):
        notes.append(f"torchtitan supports expert_tensor_parallel_degree 1 or tp ({p.tp}) only; the plan has etp = {p.etp}")
    return tuple(notes)


def block_recompute_notes(p: Placement) -> tuple[str, ...]:
    """torchtitan has no counterpart of Megatron-LM's block recompute (the first r layers of each chunk)."""
    if not p.recompute_num_layers:
        return ()
    return (f"the plan recomputes the first {p.recompute_num_layers} layers of each chunk (Megatron-LM's block "
            "method); torchtitan has no such option: written as full activation checkpointing of every layer, which "
            "takes longer than the plan and less memory (its selective_ac_option = \"k\" checkpoints every k-th "
            "layer, n/k of a stage's n: set it by hand where that is the plan's count)",)


def torchtitan_run(instance, plan, release: str) -> TorchtitanRun:
    """The run `release` can do for `plan`: as planned, or the fastest runnable zero stage that fits."""
    p, e = plan.placement, plan.estimate
    if p.zero_stage in runnable_zero_stages(p, release):
        return TorchtitanRun(release, p, e, expert_notes(p) + block_recompute_notes(p))
    scored = [(evaluate(instance, with_zero_stage(p, z), check=False), z) for z in runnable_zero_stages(p, release)]
    fitting = [(est, z) for est, z in scored if est.fits] or scored
    est, z = min(fitting, key=lambda pair: pair[0].iteration_time_s)
    kind = "FSDP (data_parallel_shard_degree = dp)" if z == 3 else "replicate (data_parallel_replicate_degree = dp)"
    change = est.iteration_time_s / e.iteration_time_s - 1
    note = (f"{_why_not(p, release)}. Mapped to zero_stage {z}, {kind}: {est.iteration_time_s:.3f} s per iteration "
            f"instead of {e.iteration_time_s:.3f} s ({change:+.1%}), peak {est.peak_memory_gib:.1f} GiB per GPU instead "
            f"of {e.peak_memory_gib:.1f} GiB" + ("" if est.fits else ", OVER the memory limit") + " (formulation.evaluate)")
    others = [f"zero_stage {other} would take {o.iteration_time_s:.3f} s" + ("" if o.fits else
              f" and exceed the memory limit by {o.memory_shortfall_gib:.1f} GiB") for o, other in scored if other != z]
    advice = (". torchtitan plans of mixture-of-experts models are not modelled (it shards experts with FSDP, which "
              "the memory model covers for dense models only): the figures above are not a prediction; launch the "
              "Megatron route" if instance.model.moe is not None else
              ". For a plan torchtitan runs as planned: solve --framework torchtitan")
    note += ("; " + "; ".join(others) if others else "") + advice
    return TorchtitanRun(release, with_zero_stage(p, z), est, (note, *expert_notes(p), *block_recompute_notes(p)))


def with_zero_stage(p, zero: int):
    """`p` at another zero stage, its sharding choices kept only where that stage has them (replicas need sharded
    states, zero >= 1; reshard_after_forward is a zero-3 choice)."""
    return dataclasses.replace(p, zero_stage=zero, dp_replicate=p.dp_replicate if zero else 1,
                               reshard_after_forward=p.reshard_after_forward if zero == 3 else True)


@dataclass(frozen=True)
class Flavour:
    """A model flavour of torchtitan 0.3.0 (`torchtitan.models.<module>.model_registry(name)`) and what it builds
    (tests/test_frameworks_torchtitan.py checks every field against torchtitan itself)."""
    module: str
    name: str
    config: str | None  # its config_registry function (--config), None: torchtitan ships none for the flavour
    params: int
    num_layers: int
    hidden_size: int
    vocab_size: int
    rope_theta: float
    rope_scaling: tuple[str, float] | None  # ("llama", factor): Llama 3.1's; ("yarn", factor); None
    norm_eps: float
    tied: bool = False


FLAVOURS = (
    Flavour("llama3", "8B", "llama3_8b", 8_030_261_248, 32, 4096, 128256, 500000.0, ("llama", 8.0), 1e-5),
    Flavour("llama3", "70B", "llama3_70b", 70_553_706_496, 80, 8192, 128256, 500000.0, ("llama", 8.0), 1e-5),
    Flavour("llama3", "405B", "llama3_405b", 405_853_388_800, 126, 16384, 128256, 500000.0, ("llama", 8.0), 1e-5),
    Flavour("qwen3", "30B-A3B", "qwen3_30b_a3b", 30_532_122_624, 48, 2048, 151936, 1e6, None, 1e-6),
    Flavour("qwen3", "235B-A22B", None, 235_093_634_560, 94, 4096, 151936, 5e6, None, 1e-6),
    Flavour("deepseek_v3", "671B", "deepseek_v3_671b", 671_026_404_352, 61, 7168, 129280, 10000.0, ("yarn", 40.0), 1e-5),
)


def _flavour_view(model) -> dict:
    """The planner's model in a flavour's terms."""
    scaling = dict(model.rope_scaling or ())
    kind = {"llama3": "llama", "yarn": "yarn"}.get(scaling.get("rope_type", scaling.get("type")))
    return dict(params=model.total_params, num_layers=model.num_layers, hidden_size=model.hidden_size,
                vocab_size=model.vocab_size, rope_theta=float(model.rope_theta),
                rope_scaling=None if kind is None else (kind, float(scaling["factor"])),
                norm_eps=model.norm_eps, tied=model.tie_word_embeddings)


def torchtitan_flavour(model) -> tuple[Flavour | None, list[str]]:
    """(torchtitan's flavour of the same shape as `model`, the fields where it still differs: [] when it is the
    model), or (None, [why]) when no flavour has its shape (layers, width, vocabulary, parameter count)."""
    mine = _flavour_view(model)
    shape = ("params", "num_layers", "hidden_size", "vocab_size")
    for flavour in FLAVOURS:
        theirs = dataclasses.asdict(flavour)
        if all(theirs[k] == mine[k] for k in shape):
            return flavour, [f"{k} {mine[k]} (torchtitan: {theirs[k]})" for k in ("rope_theta", "rope_scaling",
                                                                                   "norm_eps", "tied")
                             if theirs[k] != mine[k] and not (k == "norm_eps" and mine[k] is None)]
    return None, [f"torchtitan 0.3.0 has no flavour of {model.name} ({model.num_layers} layers, hidden "
                  f"{model.hidden_size}, vocabulary {model.vocab_size}, {model.total_params:,} parameters)"]


def torchtitan_model_notes(model) -> list[str]:
    """What the torchtitan route trains instead of the planned model, said plainly ([] when it is the model)."""
    flavour, differences = torchtitan_flavour(model)
    if flavour is None:
        return [differences[0] + ": write a model_registry flavour and config for it (TORCHTITAN_MODULE, "
                "TORCHTITAN_CONFIG); the launch scripts refuse to start torchtitan without them"]
    notes = []
    if differences:
        notes.append(f"torchtitan's {flavour.module} {flavour.name} flavour has the planned shape and parameter count "
                     f"but is NOT {model.name}: it differs in " + "; ".join(differences) + ". Training it trains "
                     "that model (same cost); for this one, register a flavour with these fields")
    if flavour.config is None:
        notes.append(f"torchtitan 0.3.0 has the {flavour.module} {flavour.name} flavour but no config_registry "
                     f"function for it: write one (model_registry(\"{flavour.name}\")) and set TORCHTITAN_CONFIG")
    return notes


def _batch(p: Placement, m: int) -> tuple[int, str]:
    if p.pp > 1:
        return p.micro_batch_size * m, f"sequences per data-parallel rank, split into {m} micro-batches"
    return p.micro_batch_size, f"torchtitan accumulates gradients over {m} steps"


def _degrees(run: TorchtitanRun) -> list[tuple[str, object]]:
    p = run.placement
    pairs: list[tuple[str, object]] = [
        ("data_parallel_replicate_degree", run.replicate_degree), ("data_parallel_shard_degree", run.shard_degree)]
    if run.shard:
        pairs.append(("fsdp_reshard_after_forward", "always" if p.reshard_after_forward else "never"))
    pairs += [("tensor_parallel_degree", p.tp), ("pipeline_parallel_degree", p.pp),
              ("context_parallel_degree", p.cp)]
    if p.ep * p.etp > 1:
        pairs += [("expert_parallel_degree", p.ep), ("expert_tensor_parallel_degree", p.etp)]
    if p.pp > 1:
        pairs += [("pipeline_parallel_microbatch_size", p.micro_batch_size),
                  ("pipeline_parallel_schedule", p.schedule_name)]  # 1F1B, Interleaved1F1B, InterleavedZeroBubble, ZBVZeroBubble, DualPipeV
    return pairs


def torchtitan_arguments(instance, plan) -> tuple[list[str], list[str], list[str]]:
    """(options, trailing subcommands, notes) of torchtitan 0.3.x's command line (its tyro configuration).

    The activation-checkpoint subcommand must come after every option (tyro applies later options to it)."""
    run = torchtitan_run(instance, plan, "0.3")
    p, job = run.placement, instance.training
    local, _ = _batch(p, plan.estimate.num_micro_batches)
    args = [f"--training.local-batch-size={local}", f"--training.global-batch-size={job.global_batch_size}",
            f"--training.seq-len={job.seq_length}"]
    if p.pp > 1:
        args.append("--training.disable-cuda-graphs")  # torchtitan 0.3 refuses CUDA graphs with pp
    args += [f"--parallelism.{name.replace('_', '-')}={value}" for name, value in _degrees(run)]
    if p.pp > 1:
        args += ["--parallelism.module-fqns-per-model-part", *(",".join(part) for part in model_parts(instance, p))]
    subcommand = {"none": "none", "selective": "selective", "full": "full"}[p.recompute]
    notes = list(run.notes)
    if job.grad_reduce_dtype == "bf16":  # torchtitan 0.3's mixed_precision_reduce accepts float32 only
        notes.append("the plan prices gradient reduces in bf16 (training.grad_reduce_dtype); torchtitan reduces in "
                     "float32 (training.mixed_precision_reduce), twice the bytes the plan's communication assumes")
    return args, [f"activation-checkpoint:{subcommand}"], notes


def torchtitan_args_script(instance, plan) -> str:
    """torchtitan_args.sh: bash arrays TORCHTITAN_ARGS and TORCHTITAN_SUBCOMMANDS for `-m torchtitan.train`."""
    args, subcommands, notes = torchtitan_arguments(instance, plan)
    flavour, _ = torchtitan_flavour(instance.model)
    notes = torchtitan_model_notes(instance.model) + notes
    lines = [f"# torchtitan command line for the plan of {instance.name} ({instance.model.name}), llm-train-planner.",
             f"# For torchtitan 0.3.x (command-line configuration); checked with {CHECKED['0.3']}: parsed by its",
             "# ConfigManager and accepted by its ParallelDims at the plan's world size. 0.2.x: torchtitan-0.2.toml.",
             f"# plan: {plan.placement.summary()}",
             "# Launch: FRAMEWORK=torchtitan bash launch_torchrun.sh (or launch_slurm.sh) [extra options]; they run",
             "# python -m torchtitan.train \"${TORCHTITAN_ARGS[@]}\" [extra options] \"${TORCHTITAN_SUBCOMMANDS[@]}\"."]
    lines += comment_lines(notes, "NOTE: ")
    if flavour is not None:
        lines.append(f"TORCHTITAN_MODULE=${{TORCHTITAN_MODULE:-{flavour.module}}}")
    else:
        lines.append(': "${TORCHTITAN_MODULE:?set TORCHTITAN_MODULE (torchtitan --module) for this model}"')
    if flavour is not None and flavour.config is not None:
        lines.append(f"TORCHTITAN_CONFIG=${{TORCHTITAN_CONFIG:-{flavour.config}}}")
    else:
        lines.append(': "${TORCHTITAN_CONFIG:?set TORCHTITAN_CONFIG (torchtitan --config) for this model}"')
    lines += ["TORCHTITAN_ARGS=(", '  --module "$TORCHTITAN_MODULE" --config "$TORCHTITAN_CONFIG"']
    lines += [f"  {shlex.quote(arg)}" for arg in args]
    lines += [")", f"TORCHTITAN_SUBCOMMANDS=({' '.join(map(shlex.quote, subcommands))})"]
    return "\n".join(lines) + "\n"


def torchtitan_toml(instance, plan) -> str:
    """torchtitan-0.2.toml: `[training]`, `[parallelism]`, `[activation_checkpoint]` for torchtitan 0.2.x."""
    run = torchtitan_run(instance, plan, "0.2")
    p, job = run.placement, instance.training
    local, why = _batch(p, plan.estimate.num_micro_batches)
    lines = [f"# torchtitan 0.2.x settings for the plan of {instance.name} ({instance.model.name}), llm-train-planner.",
             f"# Checked with {CHECKED['0.2']}: read by its ConfigManager (--job.config_file) and accepted by its",
             "# ParallelDims. torchtitan 0.3 reads no TOML: use torchtitan_args.sh there.",
             f"# plan: {plan.placement.summary()}",
             "# Merge into your torchtitan train config (model name/flavor, data and optimizer stay yours) and start",
             "# it through launch_torchrun.sh or launch_slurm.sh so the ranks land on the plan's GPUs.",
             "", "[training]", f"local_batch_size = {local}  # {why}",
             f"global_batch_size = {job.global_batch_size}", f"seq_len = {job.seq_length}", "", "[parallelism]"]
    lines += comment_lines(list(run.notes))
    lines += [f"{name} = " + (f'"{value}"' if isinstance(value, str) else f"{value}") for name, value in _degrees(run)]
    if p.pp > 1:
        where = ("k < pp on stage k, the others on stage 2 pp - 1 - k (a V)" if p.schedule in V_FAMILIES
                 else "k on stage k mod pp")
        lines += [f"# the plan's layer split, one model part per virtual stage (part {where})",
                  "module_fqns_per_model_part = ["]
        lines += ["  [" + ", ".join(f'"{name}"' for name in part) + "]," for part in model_parts(instance, p)] + ["]"]
    lines += ["", "[activation_checkpoint]", f'mode = "{p.recompute}"']
    if p.recompute == "selective":
        lines.append('selective_ac_option = "op"  # recompute cheap ops, keep matmul outputs (close to Megatron\'s '
                     'selective recompute of the attention core)')
    return "\n".join(lines) + "\n"


def model_parts(instance, p: Placement) -> list[list[str]]:
    """torchtitan module names (Llama-family models) per virtual stage: Megatron's chunk order (part k on stage
    k mod pp), or for a V schedule part k on stage k, then on stage 2 pp - 1 - k (torch's "v" stage style)."""
    num_layers, first, parts = instance.model.num_layers, 0, []
    style = "v" if p.schedule in V_FAMILIES else "loop"
    for virtual in range(p.pp * p.vpp):
        n = p.layers_per_stage[stage_rank(virtual, p.pp, style)] // p.vpp
        names = [f"layers.{i}" for i in range(first, first + n)]
        if first == 0:
            names.insert(0, "tok_embeddings")
        if first + n == num_layers:
            names += ["norm", "output"]
        parts.append(names)
        first += n
    return parts
