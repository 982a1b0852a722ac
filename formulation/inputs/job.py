"""The training job: batch, sequence, precision, and the choices the planner may make."""

from __future__ import annotations

from dataclasses import dataclass, replace

from formulation.inputs.mxfp8 import RECIPES
from formulation.errors import Section
from formulation.inputs.frameworks import (FRAMEWORKS, SEARCHED_SCHEDULES, framework_zero_stages,
                                           stack_schedules)

RECOMPUTE_CHOICES = ("none", "selective", "full")
# Megatron-Core's selective recompute by module (--recompute-modules, TransformerConfig.recompute_modules), in its
# order; "core_attn" alone is its default and what `selective` meant before modules existed (Korthikanti et al.)
RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts")
DEFAULT_RECOMPUTE_MODULES = ("core_attn",)
ZERO_STAGES = (0, 1, 2, 3)
PRECISIONS = ("bf16", "fp16", "fp8")
# Megatron-LM / NeMo (Megatron-Core), Megatron-DeepSpeed and other DeepSpeed ZeRO-1-era stacks, torchtitan
# (PyTorch FSDP2) and MosaicML's llm-foundry (Composer on PyTorch FSDP1). `fsdp` is the earlier name of the
# PyTorch FSDP stack and is read as `torchtitan`; `composer` is read as `llm-foundry`.
SOFTWARE_STACKS = ("megatron", "megatron-deepspeed", "torchtitan", "llm-foundry")
# deepspeed: DeepSpeed's engine (ZeRO, its bf16 optimizer and gradient copies) is what megatron-deepspeed models
STACK_ALIASES = {"fsdp": "torchtitan", "composer": "llm-foundry", "deepspeed": "megatron-deepspeed"}
# Any other name (nanotron, maxtext, colossalai, ...) is accepted and planned as `megatron`, its name kept in
# `TrainingJob.unmodelled_stack`: the estimate's interval is that of a stack with no measured runs
# (formulation/intervals.py) and the report says so.
# Stacks that run PyTorch's own modules eagerly unless torch.compile is on (docs/physics.md eager_elementwise)
PYTORCH_STACKS = ("torchtitan", "llm-foundry")
# How a stack's model code applies rotary embeddings eagerly (TrainingJob.rotary_impl)
ROTARY_IMPLS = ("complex", "rotation_matrix")
# llm-foundry trains with FSDP only (Composer's FSDPConfig: FULL_SHARD and its relatives, per-block activation
# checkpointing): no tensor, pipeline or context parallelism, no selective recompute
DATA_PARALLEL_ONLY = ("llm-foundry",)
DEFAULT_STACK = "megatron"
DEEPSPEED = ("megatron-deepspeed",)
# DeepSpeed's documented defaults: reduce_bucket_size and allgather_bucket_size of 5e8 elements each
DEEPSPEED_BUCKET_ELEMENTS = 5e8
# Mixture-of-experts token dispatchers of Megatron-Core (--moe-token-dispatcher-type; deepep: the flex dispatcher
# with DeepEP's kernels, --moe-token-dispatcher-type flex --moe-enable-deepep)
MOE_DISPATCHERS = ("alltoall", "allgather", "deepep")
# Busiest expert's tokens over the even share, for a dropless router (docs/moe.md): Switch Transformer (Fedus et
# al. 2022, section 2.2) trains with capacity factor 1.25, the headroom over an even split given to each expert.
MOE_LOAD_IMBALANCE = 1.25
# gradient reduce dtypes (`grad_reduce_dtype`) and their bytes per element
REDUCE_DTYPE_BYTES = {"fp32": 4.0, "bf16": 2.0}


@dataclass(frozen=True)
class TrainingJob:
    global_batch_size: int  # sequences per iteration
    seq_length: int
    precision: str = "bf16"
    software_stack: str = DEFAULT_STACK  # selects behaviours and calibrated efficiencies (docs/physics.md)
    software_stack_defaulted: bool = False  # the instance did not name its stack (reports warn)
    # the framework the plan is launched with (formulation/inputs/frameworks.py): None leaves the decisions
    # unrestricted (Megatron-LM's, whatever the stack); set, only those it runs are searched
    framework: str | None = None
    framework_origin: str = ""  # how the framework was named: "--framework X" or "training.framework X"
    unmodelled_stack: str = ""  # the stack the instance named when it is none of SOFTWARE_STACKS (planned as megatron)
    torch_compile: bool = True  # PyTorch stacks: torch.compile fuses the elementwise ops (eager runs them unfused)
    # the loss: a fused cross entropy (Megatron-LM's vocab-parallel one, flash-attn's in llm-foundry) keeps the
    # logits and one fp32 copy; torchtitan's PyTorch cross entropy on fp32 logits saves more (docs/physics.md)
    fused_cross_entropy: bool = True
    # torchtitan compiles its (unfused) loss with the model when torch.compile is on (since torchtitan bbb1b616e,
    # 2025-04-02; CompileConfig.components ["model", "loss"]): Inductor saves the bf16 logits only
    compiled_loss: bool = True
    # how the model code applies rotary embeddings, which sets its eager cost (docs/physics.md eager_elementwise):
    # "complex" (torchtitan's and Meta's Llama: fp32 complex views), "rotation_matrix" (IBM's fms, fms-fsdp's model:
    # fp32 2x2 rotation matrices, a product and a sum). Compiled, both are one fused kernel.
    rotary_impl: str = "complex"
    # FP8 with Transformer Engine: weights kept in FP8 (Megatron-LM --fp8-param-gather; NeMo's FP8 recipe
    # bf16_with_fp8_mixed sets fp8_params=True) instead of bf16 beside an FP8 copy
    fp8_param_gather: bool = True
    fp8_recipe: str = "delayed"  # FP8 scaling: per tensor with an amax history, or "mxfp8" per 32-element block
    # PyTorch FSDP's backward prefetch under ZeRO-3: "pre" gathers the next layer's parameters before the current
    # layer's gradients (FSDP1's BACKWARD_PRE default; FSDP2 and Megatron prefetch so too), "post" after them,
    # beside the current reduce-scatter (BACKWARD_POST, Composer's default: llm-foundry's), so the backward waits
    fsdp_backward_prefetch: str = "pre"
    # the dtype gradients are reduced in (docs/model.md (C11)-(C12)): "" the gradient state's (fp32 main grads with
    # bf16: Megatron-LM's default, torchtitan's mixed_precision_reduce "float32"), "bf16" (FSDP MixedPrecision with
    # reduce_dtype bf16, fms-fsdp's bfSixteen policy; Megatron-LM's --grad-reduce-in-bf16) or "fp32"
    grad_reduce_dtype: str = ""
    recompute: tuple[str, ...] = RECOMPUTE_CHOICES  # allowed choices
    # what `selective` recomputes on the megatron stack (formulation/physics/recompute_modules.py)
    recompute_modules: tuple[str, ...] = DEFAULT_RECOMPUTE_MODULES
    zero_stage: tuple[int, ...] = (0, 1)  # allowed choices (3 = ZeRO-3/FSDP, opt in)
    max_micro_batch_size: int = 8
    max_tensor_parallel_size: int = 0  # 0: the GPUs of one node
    context_parallel_sizes: tuple[int, ...] = (1,)
    virtual_pipeline_sizes: tuple[int, ...] = (1,)
    # the pipeline schedules the search may choose (formulation/physics/schedules.py); default: the stack's
    pipeline_schedules: tuple[str, ...] = ("1F1B", "Interleaved1F1B")
    memory_limit_fraction: float = 0.8
    flash_attention: bool = True
    sequence_parallel: bool = True  # with tp > 1, as Megatron-LM's --sequence-parallel
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = True
    tp_comm_overlap: bool = False  # Transformer Engine userbuffers: tp collectives hidden behind GEMMs
    ddp_bucket_params: int = 40_000_000  # Megatron-LM's default gradient bucket
    # mixture-of-experts models only (docs/moe.md): allowed expert parallel / expert tensor parallel sizes
    # (empty: every size Megatron-Core accepts), the token dispatcher, the load-imbalance factor, grouped GEMM
    expert_parallel_sizes: tuple[int, ...] = ()
    expert_tensor_parallel_sizes: tuple[int, ...] = (1,)
    moe_token_dispatcher: str = "alltoall"
    moe_load_imbalance: float = MOE_LOAD_IMBALANCE
    moe_grouped_gemm: bool = True
    # Megatron-Core's MoE all-to-all overlap (docs/moe.md (E10)): the choices the search may take where Megatron-Core
    # runs it (formulation/physics/moe_overlap.py); default both on the megatron stack, off elsewhere
    moe_a2a_overlap: tuple[bool, ...] = (False, True)
    # sharded data parallelism (formulation/physics/sharding.py): allowed dp_replicate sizes (0: every divisor of
    # dp; HSDP, Megatron's distributed-optimizer instances) and reshard_after_forward choices under zero_stage 3
    dp_replicate_sizes: tuple[int, ...] = (1,)
    reshard_after_forward: tuple[bool, ...] = (True,)

    @property
    def grad_reduce_bytes(self) -> float:
        """Bytes per parameter of a gradient reduction (reduce-scatter, all-reduce): the reduce dtype's, by default
        the gradient state's (bytes_per_param_state[1]). Memory keeps the gradient state's bytes."""
        return REDUCE_DTYPE_BYTES.get(self.grad_reduce_dtype) or self.bytes_per_param_state[1]

    def sequence_parallel_size(self, tp: int) -> int:
        """How many ways the norm/residual activations and the pipeline messages are split: tp with sequence
        parallelism (which needs tp > 1), else 1."""
        return tp if self.sequence_parallel and tp > 1 else 1

    @property
    def fp8_weights(self) -> bool:
        """GEMM weights kept in FP8 (Megatron-LM --fp8-param-gather): an FP8 Megatron job that did not opt out."""
        return self.precision == "fp8" and self.fp8_param_gather and self.software_stack == "megatron"

    @property
    def bytes_per_param_state(self) -> tuple[float, float, float]:
        """(weights, gradients, optimizer state) bytes per parameter with Adam in mixed precision.

        Megatron-LM distributed-optimizer docs: bf16 params with fp32 main grads 2 + 4 + 12 = 18;
        fp16 params and grads 2 + 2 + 16 (fp32 master params, main grads, Adam m and v) = 20.
        FP8 training (Transformer Engine, torchao) keeps bf16 parameters with fp32 main grads as bf16 does; its
        FP8 weight copies are buffers (memory model (M6)).
        Megatron-DeepSpeed (DeepSpeed ZeRO-1 / bf16 optimizer) keeps 16-bit gradients and an fp32 gradient
        partition beside the fp32 master weights and Adam moments: 2 + 2 + 16 in either 16-bit precision.
        """
        if self.precision == "fp16" or self.software_stack == "megatron-deepspeed":
            return (2.0, 2.0, 16.0)
        return (2.0, 4.0, 12.0)


def _fp8_recipe(sec: Section) -> str:
    """`fp8_recipe`: delayed (Transformer Engine's per-tensor scaling, the default) or mxfp8 (one scale per 32
    elements, Blackwell; formulation/inputs/mxfp8.py), with precision fp8 only."""
    recipe = sec.string("fp8_recipe", default="delayed", choices=RECIPES)
    if recipe == "mxfp8" and sec.data.get("precision") != "fp8":
        raise sec.error("fp8_recipe", "mxfp8 is an FP8 recipe: set precision to fp8")
    return recipe


def _choices(sec: Section, key: str, allowed: tuple, default: tuple, kind: type) -> tuple:
    value = sec.raw(key, default)
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, (list, tuple)) or not value:
        raise sec.error(key, f"expected a non-empty list of choices from {list(allowed)}")
    for item in value:
        if isinstance(item, bool) or not isinstance(item, kind) or (allowed and item not in allowed):
            raise sec.error(key, f"expected choices from {list(allowed)}; got {item!r}")
    return tuple(sorted(set(value), key=list(allowed).index if allowed else None))


def _sizes(sec: Section, key: str, default: tuple) -> tuple[int, ...]:
    value = sec.raw(key, default)
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, (list, tuple)) or not value or any(
            isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in value):
        raise sec.error(key, f"expected a non-empty list of positive integers, got {value!r}")
    return tuple(sorted(set(value)))


def _replicate_sizes(sec: Section, framework: str | None) -> tuple[int, ...]:
    """`dp_replicate_sizes`: "all" (every divisor of dp, stored as (0,)) or a list of positive integers; default
    "all" for a torchtitan plan (its HSDP is one setting), else [1] (one shard group over dp x cp, as before)."""
    value = sec.raw("dp_replicate_sizes", "all" if framework == "torchtitan" else [1])
    if value == "all":
        return (0,)
    return _sizes(sec, "dp_replicate_sizes", (1,))


def _reshard_choices(sec: Section, framework: str | None) -> tuple[bool, ...]:
    """`reshard_after_forward`: true, false or a list of them (the choices under zero_stage 3); default both for
    a torchtitan plan (its fsdp_reshard_after_forward), else true."""
    value = sec.raw("reshard_after_forward", [True, False] if framework == "torchtitan" else [True])
    value = [value] if isinstance(value, bool) else value
    if not isinstance(value, list) or not value or any(not isinstance(v, bool) for v in value):
        raise sec.error("reshard_after_forward", f"expected true, false or a list of them, got {value!r}")
    return tuple(sorted(set(value), reverse=True))


def _stack_and_framework(sec: Section, flag: str | None) -> tuple[str, str | None, str]:
    """(software stack as named (an unmodelled name is planned as megatron), framework, how to name the framework
    in errors): the framework from `flag` (solve --framework) or training.framework; it runs its own stack, so a
    section naming another is an error."""
    named = sec.string("framework", default=None, choices=FRAMEWORKS)
    if flag is not None and flag not in FRAMEWORKS:
        raise sec.error("framework", f"expected one of {', '.join(FRAMEWORKS)}; got --framework {flag!r}")
    if flag is not None and named is not None and named != flag:
        raise sec.error("framework", f"{named} conflicts with --framework {flag}: drop one")
    framework = flag or named
    origin = f"--framework {flag}" if flag else f"training.framework {named}"
    named_stack = sec.string("software_stack", default=framework or DEFAULT_STACK)
    named_stack = STACK_ALIASES.get(named_stack, named_stack)
    if framework is not None and named_stack != framework:
        raise sec.error("software_stack", f"{sec.raw('software_stack')} conflicts with {origin} (a {framework} plan "
                                          f"runs the {framework} stack): drop one")
    return named_stack, framework, origin


def load_training_section(data: dict, file: str, framework: str | None = None) -> TrainingJob:
    """The training section; `framework` (solve --framework) as if the section named it, conflicts are errors."""
    sec = Section(data, file, "training")
    named, framework, origin = _stack_and_framework(sec, framework)
    stack = named if named in SOFTWARE_STACKS else DEFAULT_STACK  # any other name: megatron, the wider interval
    foundry = stack == "llm-foundry"
    zero_stages = _choices(sec, "zero_stage", ZERO_STAGES, (0, 1), int)
    if framework is not None:  # each listed stage read as the one the framework runs in its place
        zero_stages = framework_zero_stages(framework, zero_stages)
    compile_on = sec.boolean("torch_compile", default=not foundry)  # Composer compiles only when asked
    job = TrainingJob(
        global_batch_size=sec.integer("global_batch_size"),
        seq_length=sec.integer("seq_length", maximum=16 * 1024 * 1024),
        precision=sec.string("precision", default="bf16", choices=PRECISIONS),
        software_stack=stack, software_stack_defaulted=not sec.has("software_stack") and framework is None,
        framework=framework, framework_origin=origin if framework else "",
        unmodelled_stack="" if named == stack else named,
        torch_compile=compile_on, compiled_loss=sec.boolean("compiled_loss", default=compile_on),
        rotary_impl=sec.string("rotary_impl", default="complex", choices=ROTARY_IMPLS),
        fp8_param_gather=sec.boolean("fp8_param_gather", default=True),
        fp8_recipe=_fp8_recipe(sec),
        fsdp_backward_prefetch=sec.string("fsdp_backward_prefetch", default="post" if foundry else "pre",
                                          choices=("pre", "post")),
        grad_reduce_dtype=sec.string("grad_reduce_dtype", default="", choices=tuple(REDUCE_DTYPE_BYTES)),
        fused_cross_entropy=sec.boolean("fused_cross_entropy", default=stack != "torchtitan"),
        recompute=_choices(sec, "recompute", RECOMPUTE_CHOICES, ("none", "full") if foundry else RECOMPUTE_CHOICES,
                           str),
        recompute_modules=_choices(sec, "recompute_modules", RECOMPUTE_MODULES, DEFAULT_RECOMPUTE_MODULES, str),
        zero_stage=zero_stages,
        max_micro_batch_size=sec.integer("max_micro_batch_size", default=8),
        max_tensor_parallel_size=sec.integer("max_tensor_parallel_size", default=0, minimum=0),
        context_parallel_sizes=_sizes(sec, "context_parallel_sizes", (1,)),
        virtual_pipeline_sizes=_sizes(sec, "virtual_pipeline_sizes", (1,)),
        memory_limit_fraction=sec.number("memory_limit_fraction", default=0.8, maximum=1.0),
        flash_attention=sec.boolean("flash_attention", default=True),
        sequence_parallel=sec.boolean("sequence_parallel", default=True),
        # DeepSpeed's documented default is overlap_comm false, and ZeRO-1 gathers parameters after the step
        overlap_grad_reduce=sec.boolean("overlap_grad_reduce", default=stack not in DEEPSPEED),
        overlap_param_gather=sec.boolean("overlap_param_gather", default=stack not in DEEPSPEED),
        tp_comm_overlap=sec.boolean("tp_comm_overlap", default=False),
        ddp_bucket_params=sec.integer("ddp_bucket_params", default=40_000_000),
        expert_parallel_sizes=_sizes(sec, "expert_parallel_sizes", ()) if sec.has("expert_parallel_sizes") else (),
        expert_tensor_parallel_sizes=_sizes(sec, "expert_tensor_parallel_sizes", (1,)),
        moe_token_dispatcher=sec.string("moe_token_dispatcher", default="alltoall", choices=MOE_DISPATCHERS),
        dp_replicate_sizes=_replicate_sizes(sec, framework),
        reshard_after_forward=_reshard_choices(sec, framework),
        moe_load_imbalance=sec.number("moe_load_imbalance", default=MOE_LOAD_IMBALANCE, minimum=1.0, maximum=64.0),
        moe_grouped_gemm=sec.boolean("moe_grouped_gemm", default=True),
        moe_a2a_overlap=_overlap_choices(sec, stack),
    )
    if foundry and "selective" in job.recompute:
        raise sec.error("recompute", "llm-foundry checkpoints whole blocks (Composer's activation_checkpointing): "
                                     "expected choices from ['none', 'full']")
    if job.recompute_modules != DEFAULT_RECOMPUTE_MODULES and job.software_stack != "megatron":
        raise sec.error("recompute_modules", f"Megatron-Core's recompute modules apply to software_stack megatron, "
                                             f"not {job.software_stack} (torchtitan's selective recompute is op-level)")
    _check_context_parallel_sizes(sec, job, origin)
    job = _with_schedules(sec, job)
    sec.done()
    return job


def _overlap_choices(sec: Section, stack: str) -> tuple[bool, ...]:
    """`moe_a2a_overlap`: true, false or a list of them (the choices the search may take); default [false, true]
    on the megatron stack, [false] on the others (Megatron-Core's option)."""
    if not sec.has("moe_a2a_overlap"):
        return (False, True) if stack == "megatron" else (False,)
    value = sec.raw("moe_a2a_overlap")
    items = value if isinstance(value, list) else [value]
    if not items or any(not isinstance(v, bool) for v in items):
        raise sec.error("moe_a2a_overlap", f"expected true, false or a list of them; got {value!r}")
    if True in items and stack != "megatron":
        raise sec.error("moe_a2a_overlap", f"Megatron-Core's --overlap-moe-expert-parallel-comm applies to "
                                           f"software_stack megatron, not {stack}")
    return tuple(sorted(set(items)))


def _with_schedules(sec: Section, job: TrainingJob) -> TrainingJob:
    """`pipeline_schedules`: the listed names (checked against what the stack runs), else the stack's own."""
    runs = stack_schedules(job.software_stack, job.torch_compile)
    if not sec.has("pipeline_schedules"):
        return replace(job, pipeline_schedules=runs)
    names = _choices(sec, "pipeline_schedules", SEARCHED_SCHEDULES, (), str)
    for name in names:
        if name not in runs:
            raise sec.error("pipeline_schedules", f"software_stack {job.software_stack} does not run {name}"
                                                  f"{' with torch_compile' if job.torch_compile else ''}; it runs "
                                                  f"{list(runs)}")
    return replace(job, pipeline_schedules=names)


def _check_context_parallel_sizes(sec: Section, job: TrainingJob, origin: str) -> None:
    """A listed size that can never apply is a mistake, not a choice."""
    for cp in job.context_parallel_sizes:
        if job.seq_length % cp:
            raise sec.error("context_parallel_sizes", f"context-parallel size {cp} does not divide seq_length "
                                                      f"{job.seq_length} (each cp rank takes seq_length / cp tokens)")
        if job.framework is not None and cp > 1 and job.seq_length % (2 * cp):
            raise sec.error("context_parallel_sizes", f"{origin} splits the sequence into 2 x cp chunks (causal "
                                                      f"load balancing): {2 * cp} does not divide seq_length "
                                                      f"{job.seq_length}")
