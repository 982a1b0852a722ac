"""The launch self-check against megatron-core itself: its `RankGenerator` and `initialize_model_parallel` (with
torch.distributed recording `new_group` calls instead of creating communicators) give the same groups as the
planner's re-derivation, and the plan's launch files realise those real groups."""

from __future__ import annotations

import dataclasses
import itertools
import json
import random
import subprocess
from pathlib import Path

import pytest

from conftest import REPO
from formulation import default_placement, evaluate, load_instance
from formulation.inputs.model import PRESET_DIR, load_model_section, preset_names
from formulation.placement import Placement
from frameworks import (EXPERT_GROUP_DESCS, hf_parameter_count, initialize_model_parallel_groups,
                        megatron_gpt_model, megatron_grad_reduce_dtype, megatron_lm_namespace,
                        rank_generator_expert_groups, rank_generator_groups)
from solvers.outputs.export import megatron_args_script, slurm_files, torchrun_script
from solvers.outputs.launch import (LaunchMismatch, check_groups, megatron_expert_rank_groups, megatron_rank_groups, parse_slurm_files,
                                    parse_torchrun_script, slurm_launch, torchrun_launch)

SHIPPED = sorted((REPO / "instances").glob("*.json"))
SIZES = (1, 2, 3, 4, 8)


def test_rank_generator_equals_the_rederivation_on_every_small_shape():
    shapes = [s for s in itertools.product(SIZES, repeat=4) if s[0] * s[1] * s[2] * s[3] <= 128]
    for tp, cp, dp, pp in shapes:
        assert rank_generator_groups(tp, cp, dp, pp) == megatron_rank_groups(tp, cp, dp, pp), (tp, cp, dp, pp)
    assert len(shapes) > 300


@pytest.mark.parametrize("tp, cp, dp, pp", [(1, 1, 8, 1), (2, 1, 2, 4), (4, 2, 4, 4), (2, 1, 2, 16), (8, 2, 8, 8),
                                            (3, 2, 4, 2), (8, 1, 16, 8)])
def test_initialize_model_parallel_creates_the_rederived_groups(tp, cp, dp, pp):
    real = initialize_model_parallel_groups(tp, cp, dp, pp)
    assert real == megatron_rank_groups(tp, cp, dp, pp)
    assert all(real[name] for name in ("tp", "cp", "dp", "dp-cp", "pp"))  # every group kind was recorded


def _expert_shapes():
    """(tp, cp, dp, pp, ep, etp) with etp x ep dividing tp x cp x dp, up to 64 ranks."""
    for tp, cp, dp, pp in itertools.product(SIZES, (1, 2), SIZES, (1, 2, 4)):
        per_stage = tp * cp * dp
        if per_stage * pp > 64:
            continue
        for ep, etp in itertools.product(SIZES, SIZES):
            if per_stage % (ep * etp) == 0:
                yield tp, cp, dp, pp, ep, etp


def test_expert_groups_equal_megatrons_rank_generator_and_the_placements_own():
    """Megatron-Core's expert RankGenerator, the re-derivation, and `Placement`'s expert groups (on the identity
    map, GPU = rank) agree on every small shape: expert parallelism laid over the same ranks, etp fastest."""
    checked = 0
    for tp, cp, dp, pp, ep, etp in _expert_shapes():
        expert_dp = tp * cp * dp // (ep * etp)
        derived = megatron_expert_rank_groups(etp, ep, expert_dp, pp)
        assert derived == rank_generator_expert_groups(etp, ep, expert_dp, pp), (tp, cp, dp, pp, ep, etp)
        world = tp * cp * dp * pp
        placement = Placement(tp=tp, pp=pp, cp=cp, dp=dp, vpp=1, micro_batch_size=1, recompute="none",
                              zero_stage=1, layers_per_stage=(1,) * pp, gpus=tuple(range(world)))
        for name, method in (("ep", placement.ep_groups), ("tp", placement.expert_tp_groups),
                             ("dp", placement.expert_dp_groups)):
            ours = sorted(sorted(map(int, g)) for s in range(pp) for g in method(s, ep, etp))
            assert ours == sorted(sorted(g) for g in derived[name]), (name, tp, cp, dp, pp, ep, etp)
        checked += 1
    assert checked > 200


@pytest.mark.parametrize("tp, cp, dp, pp, ep, etp", [(2, 1, 4, 2, 4, 1), (4, 1, 8, 2, 8, 4), (2, 2, 4, 1, 8, 2),
                                                     (8, 1, 2, 2, 16, 1)])
def test_initialize_model_parallel_creates_the_rederived_expert_groups(tp, cp, dp, pp, ep, etp):
    real = initialize_model_parallel_groups(tp, cp, dp, pp, ep=ep, etp=etp, descs=EXPERT_GROUP_DESCS)
    assert real == megatron_expert_rank_groups(etp, ep, tp * cp * dp // (ep * etp), pp)
    assert all(real[name] for name in EXPERT_GROUP_DESCS)


def _random_shape(instance, rng: random.Random):
    """A valid default placement of a random (tp, pp, cp, dp) that uses the whole cluster, or None."""
    n = instance.cluster.num_gpus
    per_node = min(node.num_gpus for node in instance.cluster.nodes)
    for _ in range(200):
        tp = rng.choice([d for d in (1, 2, 4, 8) if per_node % d == 0])
        cp = rng.choice((1, 1, 2))
        pp = rng.choice([d for d in (1, 2, 4, 8, 16) if (n // (tp * cp)) % d == 0 and d <= n // (tp * cp)])
        try:
            return default_placement(instance, tp=tp, pp=pp, cp=cp)
        except Exception:  # noqa: BLE001 - an invalid shape for this model or cluster: draw again
            continue
    return None


def _node_shuffled(instance, placement, rng: random.Random):
    """Nodes in a random order, GPUs of each node in a random order: still one rank block per node (torchrun)."""
    cluster = instance.cluster
    by_node: dict[int, list[int]] = {}
    for g in placement.gpus:
        by_node.setdefault(int(cluster.gpu_node[g]), []).append(int(g))
    blocks = [by_node[node] for node in by_node]
    rng.shuffle(blocks)
    gpus = [g for block in blocks for g in rng.sample(block, len(block))]
    return dataclasses.replace(placement, gpus=tuple(gpus))


def _check_written_routes(instance, placement) -> int:
    """check_groups with megatron-core's own groups on both launch scripts as written; the routes checked."""
    hostfile, script = slurm_files(slurm_launch(instance, placement), placement)
    check_groups(instance, placement, parse_slurm_files(hostfile, script), initialize_model_parallel_groups)
    torchrun = torchrun_launch(instance, placement)
    if torchrun is None:
        return 1
    check_groups(instance, placement, parse_torchrun_script(torchrun_script(torchrun, placement)),
                 initialize_model_parallel_groups)
    return 2


def test_solved_h100_plan_realises_megatrons_real_groups(h100, plan):
    routes = _check_written_routes(h100, plan.placement)
    assert routes == (2 if torchrun_launch(h100, plan.placement) else 1)


@pytest.mark.parametrize("path", [p for p in SHIPPED if p.stem != "h100_16384"], ids=lambda p: p.stem)
def test_random_placements_of_shipped_instances_realise_megatrons_real_groups(path: Path):
    instance = load_instance(path)
    rng = random.Random(path.stem)
    base = _random_shape(instance, rng)
    assert base is not None, f"no valid shape drawn for {path.stem}"
    shuffled = _node_shuffled(instance, base, rng)
    assert _check_written_routes(instance, shuffled) == (2 if torchrun_launch(instance, shuffled) else 1)
    scrambled = dataclasses.replace(base, gpus=tuple(rng.sample(list(base.gpus), base.world_size)))
    _check_written_routes(instance, scrambled)  # any order: the Slurm route, and torchrun if it happens to fit


def test_a_wrong_launch_fails_against_megatrons_real_groups(h100, plan):
    p = plan.placement
    wrong = list(p.gpus)
    wrong[0], wrong[p.tp * p.cp] = wrong[p.tp * p.cp], wrong[0]  # rank 0 and the first rank of the next dp replica
    launch = slurm_launch(h100, dataclasses.replace(p, gpus=tuple(wrong)))
    with pytest.raises(LaunchMismatch, match="group of ranks"):
        check_groups(h100, p, launch, initialize_model_parallel_groups)


def test_written_moe_launch_realises_megatrons_real_expert_groups():
    """The self-check with megatron-core's own dense and expert groups on a Mixtral plan's written Slurm launch
    (tp 2, pp 2, dp 16, ep 8 on 64 H100), and a launch that swaps two dp replicas fails on an expert group only."""
    instance = load_instance(REPO / "instances" / "mixtral_8x7b_h100_64.json")
    half = instance.model.num_layers // 2
    p = Placement(tp=2, pp=2, cp=1, dp=16, vpp=1, micro_batch_size=1, recompute="full", zero_stage=1,
                  layers_per_stage=(half, instance.model.num_layers - half), gpus=tuple(range(64)), ep=8)

    def real_expert(etp, ep, expert_dp, pp):
        return initialize_model_parallel_groups(p.tp, p.cp, p.dp, pp, ep=ep, etp=etp, descs=EXPERT_GROUP_DESCS)

    hostfile, script = slurm_files(slurm_launch(instance, p), p)
    check_groups(instance, p, parse_slurm_files(hostfile, script), initialize_model_parallel_groups, real_expert)
    gpus = list(p.gpus)
    for lo in (0, 32):  # the same two replicas in both stages, so that the pipeline groups stay the plan's
        gpus[lo + 2:lo + 4], gpus[lo + 8:lo + 10] = gpus[lo + 8:lo + 10], gpus[lo + 2:lo + 4]
    with pytest.raises(LaunchMismatch, match="expert"):
        check_groups(instance, p, slurm_launch(instance, dataclasses.replace(p, gpus=tuple(gpus))),
                     initialize_model_parallel_groups, real_expert)


# ---- the model Megatron-LM builds from megatron_args.sh ----------------------------------------------------------

# building every expert of DeepSeek-V3 (256 x 58 layers) takes half a minute even on the meta device
PRESETS = [pytest.param(name, marks=pytest.mark.slow) if name == "deepseek-v3" else name for name in preset_names()]


class _Plan:
    def __init__(self, placement, estimate):
        self.placement, self.estimate = placement, estimate


def exported_megatron_argv(preset: str, tmp_path: Path, **training) -> tuple[object, list[str]]:
    """(the preset's model, MEGATRON_ARGS as bash expands megatron_args.sh) for a plan of the preset on h100_128
    at the widest tp its heads allow (so the vocabulary padding is exercised at tp up to 8); `training`: fields of
    the job replaced."""
    base = load_instance(REPO / "instances" / "h100_128.json")
    model = load_model_section({"preset": preset}, "test.json", REPO)
    instance = dataclasses.replace(base, model=model, training=dataclasses.replace(base.training, **training))
    tp = next(t for t in (8, 4, 2, 1) if model.num_attention_heads % t == 0 and model.num_kv_heads % t == 0)
    placement = default_placement(instance, tp=tp, pp=1, cp=1)
    script = tmp_path / "megatron_args.sh"
    script.write_text(megatron_args_script(instance, _Plan(placement, evaluate(instance, placement, check=False))))
    shell = f'source "{script}"; printf "%s\\n" "${{MEGATRON_ARGS[@]}}"'
    return model, subprocess.run(["bash", "-c", shell], capture_output=True, text=True, check=True).stdout.splitlines()


@pytest.mark.parametrize("preset", PRESETS)
def test_megatron_builds_the_planned_model_from_the_exported_arguments(preset, tmp_path):
    """megatron-core's GPTModel, built (meta device) from megatron_args.sh as Megatron-LM core_v0.16.1's parser and
    gpt_builder read it, has the planner's parameter count, which is the count of the model transformers builds from
    the preset's config.json; the vocabulary is not padded beyond the planner's."""
    model, argv = exported_megatron_argv(preset, tmp_path)
    built, padded_vocab = megatron_gpt_model(argv)
    count = sum(p.numel() for p in built.parameters())
    hf = hf_parameter_count(json.loads((PRESET_DIR / f"{preset}.json").read_text()))
    assert padded_vocab == model.vocab_size
    assert count == model.total_params == hf, (count, model.total_params, hf)


def test_the_exported_model_arguments_are_megatrons_and_say_what_the_model_is(tmp_path):
    """Llama 3.1 70B: no linear biases, rotary base 500000 with Llama 3.1's scaling, RMSNorm with its epsilon, GQA;
    every exported flag is an option of Megatron-LM's parser (an unknown one raises)."""
    _, argv = exported_megatron_argv("llama3.1-70b", tmp_path)
    args = megatron_lm_namespace(argv)
    assert (args.add_bias_linear, args.add_qkv_bias, args.rotary_base, args.use_rope_scaling) == (False, False, 500000,
                                                                                                  True)
    assert (args.normalization, args.layernorm_epsilon, args.num_query_groups) == ("RMSNorm", 1e-5, 8)
    assert args.untie_embeddings_and_output_weights and args.swiglu and args.position_embedding_type == "rope"
    with pytest.raises(ValueError, match="--rotary-bass"):
        megatron_lm_namespace(argv + ["--rotary-bass", "500000"])


def test_a_model_the_arguments_misdescribe_is_caught(tmp_path):
    """The check can fail: without --disable-bias-linear Megatron builds every linear bias (Llama 3 8B gains
    them), and without --untie-embeddings-and-output-weights it shares the output layer with the embedding."""
    model, argv = exported_megatron_argv("llama3-8b", tmp_path)
    with_bias, _ = megatron_gpt_model([a for a in argv if a != "--disable-bias-linear"])
    tied, _ = megatron_gpt_model([a for a in argv if a != "--untie-embeddings-and-output-weights"])
    assert sum(p.numel() for p in with_bias.parameters()) > model.total_params
    assert sum(p.numel() for p in tied.parameters()) == model.total_params - model.vocab_size * model.hidden_size


@pytest.mark.parametrize("precision, reduce, expected", [("bf16", "", "fp32"), ("bf16", "bf16", "bf16"),
                                                         ("fp8", "", "fp32"), ("fp16", "", "fp16"),
                                                         ("fp16", "fp32", "fp32")])
def test_megatron_reduces_gradients_in_the_priced_dtype(tmp_path, precision, reduce, expected):
    """The gradient reduce the plan priced (training.grad_reduce_dtype, by default the gradient state's: fp32 main
    grads with bf16 and FP8, 16-bit with fp16) is the one Megatron-LM core_v0.16.1 runs from the exported
    arguments: fp32 said by --accumulate-allreduce-grads-in-fp32, bf16 by --grad-reduce-in-bf16 (without it
    Megatron's bf16 default reduces in fp32, at twice the bytes priced)."""
    from formulation.inputs.job import REDUCE_DTYPE_BYTES
    _, argv = exported_megatron_argv("llama3-8b", tmp_path, precision=precision, grad_reduce_dtype=reduce)
    args = megatron_lm_namespace(argv)
    assert megatron_grad_reduce_dtype(args) == expected
    job = dataclasses.replace(load_instance(REPO / "instances" / "h100_128.json").training, precision=precision,
                              grad_reduce_dtype=reduce)
    assert job.grad_reduce_bytes == REDUCE_DTYPE_BYTES.get(expected, 2.0)
    assert args.accumulate_allreduce_grads_in_fp32 == (expected == "fp32")
