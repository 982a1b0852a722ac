"""The framework a plan is launched with (`training.framework`, `solve --framework`): the software stack it runs
and the decisions it can run, so that the plan and its launch files agree (docs/decisions.md).

A framework sets the training section's `software_stack` (its calibrated efficiencies and behaviours,
docs/physics.md) and reads each listed `zero_stage` as the one it runs in its place; `config_problem` then says
why it cannot run a configuration (the configuration space skips those, `solve --evaluate` refuses them):
- megatron (Megatron-LM / Megatron-Core): zero_stage 0 (DDP), 1 (distributed optimizer; dp_replicate > 1 its
  --num-distributed-optimizer-instances), 2 and 3 (Megatron-FSDP optim_grads, optim_grads_params) without
  replicas and resharding after the forward.
- torchtitan: HSDP (data_parallel_replicate_degree = dp_replicate beside data_parallel_shard_degree = dp_shard)
  and fsdp_reshard_after_forward "always" / "never"; a listed 2 is read as 3.
- torchtitan (PyTorch FSDP2): zero_stage 3 is FSDP over dp x cp (`data_parallel_shard_degree`), 0 replicate
  (`data_parallel_replicate_degree`). It has no optimizer-only sharding, so a listed 1 is read as 3. With cp > 1
  its FSDP mesh is dp_shard x cp, so parameters are always sharded over the cp ranks; torchtitan 0.2.x refuses
  replicate beside tp or pp ("DDP has not supported > 1D parallelism"): zero_stage 0 only without tp, pp or cp,
  so that both exported releases run the plan as planned. No block recompute (recompute_num_layers) in its
  launch files, and no mixture-of-experts plans: FSDP-sharded experts are not modelled.
- both: context parallelism with causal load balancing splits the sequence into 2 x cp chunks (Megatron-LM's
  ring, torchtitan's head-tail balancer), so seq_length must be divisible by 2 x cp.
"""

from __future__ import annotations

FRAMEWORKS = ("megatron", "torchtitan")
# Pipeline schedules by torch.distributed.pipelining's names (torchtitan's parallelism.pipeline_parallel_schedule;
# docs/schedules.md). ZBH1 is the zero-bubble schedule with one chunk per rank (Qi et al. 2024), which no stack
# here runs (torchtitan runs multi-stage schedules with >= 2 stages per rank); the V-shaped ZBVZeroBubble and
# DualPipeV with two chunks per rank (vpp 2).
SEARCHED_SCHEDULES = ("1F1B", "Interleaved1F1B", "ZBH1", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")
# What each stack runs: Megatron-Core 0.16 1F1B and interleaved 1F1B (its --delay-wgrad-compute defers only the
# MoE layers' weight gradients inside them, with the expert all-to-all overlap); torchtitan every searched one
# but ZBH1. torchtitan refuses the zero-bubble schedules on torch.compile'd stages
# (torch.distributed.pipelining's _check_torch_compile_compatibility).
STACK_SCHEDULES = {"megatron": ("1F1B", "Interleaved1F1B"),
                   "torchtitan": ("1F1B", "Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")}
COMPILE_REFUSES = ("InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")


def stack_schedules(stack: str, torch_compile: bool) -> tuple[str, ...]:
    """The searched schedules a software stack runs (the default of `training.pipeline_schedules`)."""
    names = STACK_SCHEDULES.get(stack, STACK_SCHEDULES["megatron"])
    return tuple(n for n in names if not (torch_compile and stack != "megatron" and n in COMPILE_REFUSES))
# the zero stage each framework runs in place of each planner stage
_ZERO_STAGE_AS = {"megatron": {0: 0, 1: 1, 2: 2, 3: 3}, "torchtitan": {0: 0, 1: 3, 2: 3, 3: 3}}


def framework_zero_stages(framework: str, zero_stages: tuple[int, ...]) -> tuple[int, ...]:
    """The allowed zero stages read as the ones `framework` runs (torchtitan: 1 becomes 3), sorted."""
    return tuple(sorted({_ZERO_STAGE_AS[framework][z] for z in zero_stages}))


def torchtitan_zero_stages(p, release: str) -> tuple[int, ...]:
    """The planner's zero stages that torchtitan `release` ("0.3" or "0.2") runs as such for configuration `p`
    (0: replicate, 3: FSDP over dp x cp)."""
    if p.dp * p.cp == 1:
        return (0, 1, 3)  # nothing to replicate or shard: every stage is the same run
    if p.cp > 1:
        return (3,)
    if release == "0.2" and (p.tp > 1 or p.pp > 1):
        return (3,)
    return (0, 3)


def config_problem(framework: str | None, seq_length: int, p) -> tuple[str, str] | None:
    """(field, why) when `framework` cannot run configuration (or placement) `p` as planned, else None."""
    if framework is None:
        return None
    if p.cp > 1 and seq_length % (2 * p.cp):
        return "cp", (f"{framework} cannot run cp {p.cp} at seq_length {seq_length}: it splits the sequence into "
                      f"2 x cp = {2 * p.cp} chunks (causal load balancing)")
    if framework == "megatron" and (p.dp_replicate > 1 and p.zero_stage != 1 or not p.reshard_after_forward):
        return "dp_replicate", ("megatron runs replicas of a shard group only for its distributed optimizer "
                                "(zero_stage 1, --num-distributed-optimizer-instances), and Megatron-FSDP reshards "
                                "after the forward")
    if framework != "torchtitan":
        return None
    if p.zero_stage not in torchtitan_zero_stages(p, "0.2"):
        why = ("it has no optimizer-only sharding (Megatron's distributed optimizer)" if p.zero_stage == 1 else
               "it replicates parameters only without tp, pp or cp (with cp its FSDP mesh is dp_shard x cp; 0.2.x "
               "refuses replicate beside tp or pp)")
        return "zero_stage", f"torchtitan cannot run zero_stage {p.zero_stage} here: {why}; zero_stage 3 is its FSDP2"
    if getattr(p, "recompute_num_layers", 0):
        return "recompute_num_layers", (f"torchtitan's launch files cannot run recompute_num_layers "
                                        f"{p.recompute_num_layers} (Megatron-LM's block recompute of the first r "
                                        "layers of each chunk): they recompute every layer")
    if p.ep * p.etp > 1:
        return "ep", "torchtitan plans of mixture-of-experts models are not modelled"
    return None


def model_problem(framework: str | None, model) -> str | None:
    """Why no plan of `model` can be made for `framework`, else None."""
    if framework == "torchtitan" and model.moe is not None:
        return ("torchtitan shards a mixture-of-experts model with FSDP (zero_stage 3), which the planner models "
                "for dense models only; plan it with framework megatron")
    return None


def describe(job) -> str:
    """The decisions the job's framework searches, in a phrase for the report."""
    zero = list(job.zero_stage)
    if job.framework == "torchtitan":
        return (f"zero_stage {zero} (3: FSDP2 over dp_shard x cp, replicated over dp_replicate (HSDP), resharded "
                f"after the forward or not; 0: replicate, only without tp, pp or cp; a listed 1 or 2 is read as 3), "
                f"cp with seq_length divisible by 2 x cp")
    return (f"zero_stage {zero} (0: DDP, 1: distributed optimizer, over dp_replicate instances where allowed, 2 and 3: "
            f"Megatron-FSDP), cp with seq_length divisible by 2 x cp")
