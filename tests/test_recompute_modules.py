"""Megatron-Core's selective recompute by module (`training.recompute_modules`, formulation/physics/
recompute_modules.py): input checks, the bytes each module drops against figures derived by hand, the runs of the
public MoE measurements that ran with the "moe" module, the extra time against the share of a layer's GEMMs the
module holds, the repeated dispatch, the exact program against brute force, and the exported flag."""

from __future__ import annotations

import copy
import dataclasses
import math
from types import SimpleNamespace

import pytest
from conftest import ALL_BACKENDS
from test_moe_exact import moe_exact_instance
from test_bounds import brute_force_optimum
from test_oneway_uneven import bounds_below_brute_force, maps, programs_match_brute_force

from formulation import InputError, evaluate, instance_from_dict
from formulation.data import REFERENCE_DIR
from formulation.physics import moe_cost
from formulation.physics.memory import memory_coefficients
from formulation.physics.stage import stage_constants
from formulation.placement import Placement
from formulation.space import configurations
from solvers.outputs.export import megatron_args_script, megatron_arguments
from solvers.validation.runs import load_runs

BACKENDS = ALL_BACKENDS

MIXTRAL_TINY = {"name": "tiny-mixtral", "num_hidden_layers": 4, "hidden_size": 512, "num_attention_heads": 8,
                "num_key_value_heads": 8, "vocab_size": 4000, "hidden_act": "silu", "intermediate_size": 1024,
                "num_local_experts": 4, "num_experts_per_tok": 2}
GPT_TINY = {"name": "tiny-gpt", "num_hidden_layers": 4, "hidden_size": 1024, "num_attention_heads": 8,
            "vocab_size": 4000, "hidden_act": "gelu", "intermediate_size": 4096}
MLA_TINY = {**MIXTRAL_TINY, "name": "tiny-mla", "num_local_experts": None, "n_routed_experts": 4,
            "moe_intermediate_size": 512, "n_shared_experts": 1, "q_lora_rank": 128, "kv_lora_rank": 64,
            "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32}
del MLA_TINY["num_local_experts"]


def instance(model: dict, modules=None, **training):
    job = {"global_batch_size": 8, "seq_length": 1024, "recompute": ["selective"], **training}
    if modules is not None:
        job["recompute_modules"] = modules
    return instance_from_dict({
        "name": "recompute-modules", "model": model, "training": job,
        "cluster": {"gpu_types": {"h100-sxm-80gb": {}}, "nodes": [{"name": "n0", "gpu_type": "h100-sxm-80gb",
                                                                     "gpus": 8}],
                    "network": {"intra_node_gb_per_s": 450.0, "inter_node_gb_per_s": 50.0}}})


def placement(tp=2, ep=1, pp=1, layers=4, mbs=1) -> Placement:
    dp = 8 // (tp * pp)
    return Placement(tp=tp, pp=pp, cp=1, dp=dp, vpp=1, micro_batch_size=mbs, recompute="selective", zero_stage=1,
                     layers_per_stage=(layers // pp,) * pp, gpus=tuple(range(8)), ep=ep, etp=1)


def kept_per_layer(inst, p) -> float:
    """Activation bytes one layer keeps per micro-batch (stage 0 of a one-stage pipeline holds one micro-batch)."""
    return memory_coefficients(inst, p, 0).activations[1]


def test_unknown_module_and_other_stacks_are_refused():
    with pytest.raises(InputError, match="recompute_modules.*choices from"):
        instance(MIXTRAL_TINY, ["core_attn", "attention"])
    with pytest.raises(InputError, match="recompute_modules.*software_stack megatron"):
        instance(GPT_TINY, ["mlp"], software_stack="torchtitan")
    assert instance(GPT_TINY).training.recompute_modules == ("core_attn",)  # Megatron-Core's default


def test_moe_act_drops_the_activation_output_of_every_routed_copy():
    """2 bytes x f_e per token copy on the busiest GPU: top-k x T / tp x the load-imbalance factor copies."""
    p = placement(tp=2, ep=4)
    base, act = kept_per_layer(instance(MIXTRAL_TINY), p), kept_per_layer(instance(MIXTRAL_TINY, ["moe_act"]), p)
    copies = 2 * (1024 / 2) * 1.25  # top-2 of 512 tokens per tp rank, x 1.25
    assert base - act == pytest.approx(2.0 * copies * 1024)


def test_layernorm_counts_only_the_norms_that_are_modules_of_their_own():
    """Transformer Engine fuses a dense layer's norms into the GEMMs after them (nothing dropped); an MoE layer's
    pre-MLP norm (2 T h / sp bytes) and an MLA layer's input norm as well are their own modules."""
    p = placement(tp=2)
    assert kept_per_layer(instance(GPT_TINY, ["core_attn", "layernorm"]), p) == kept_per_layer(instance(GPT_TINY), p)
    norm = 2.0 * 1024 * 512 / 2  # T = 1024 tokens, h = 512, split by sp = tp = 2
    moe = kept_per_layer(instance(MIXTRAL_TINY), p) - kept_per_layer(instance(MIXTRAL_TINY, ["core_attn", "layernorm"]), p)
    mla = kept_per_layer(instance(MLA_TINY), p) - kept_per_layer(instance(MLA_TINY, ["core_attn", "layernorm"]), p)
    assert moe == pytest.approx(norm)
    assert mla == pytest.approx(2 * norm)


def test_moe_module_keeps_only_the_layer_input():
    """"moe" checkpoints the whole MoE layer: the routed tokens' activations and the shared experts' are gone, and
    with them more than "moe_act" alone drops."""
    p = placement(tp=2, ep=4)
    base = kept_per_layer(instance(MLA_TINY), p)
    act = kept_per_layer(instance(MLA_TINY, ["core_attn", "moe_act"]), p)
    moe = kept_per_layer(instance(MLA_TINY, ["core_attn", "moe"]), p)
    shared = 6.0 * 1024 * 512 / 2  # SwiGLU keeps 6 bytes per token and unit of the shared width, split by tp
    routed = base - moe - shared
    copies = 2 * 512 * 1.25
    assert routed == pytest.approx(2.0 * copies * (512 + 3 * 512) + 2.0 * 2 * 512 * 512 + 4.0 * 512 * 4)
    assert moe < act < base


def test_mlp_recompute_costs_the_mlp_share_of_the_layer_gemms():
    """A GELU layer with multi-head attention holds 8 h^2 of its 12 h^2 GEMM weights in the MLP: at a flat GEMM
    efficiency, recomputing the MLP costs 2/3 of the layer's forward GEMM time plus its activation (elementwise),
    and leaves out the attention core that the default module recomputes."""
    inst = instance(GPT_TINY, ["mlp"])
    flat = {n: dataclasses.replace(t, efficiency_half_gflop=1e-12) for n, t in inst.cluster.gpu_types.items()}
    inst = dataclasses.replace(inst, cluster=dataclasses.replace(inst.cluster, gpu_types=flat))
    gpu = inst.cluster.gpu_types["h100-sxm-80gb"]
    p = placement(tp=2)
    lt = moe_cost.layer_compute(inst.model, inst.training, p, gpu)
    k = stage_constants(inst, p, 0, gpu)
    extra = k.b_compute - 2 * lt.forward
    assert 2 / 3 * lt.matmul_fwd * (1 - 1e-9) <= extra <= 2 / 3 * lt.matmul_fwd + lt.elementwise_fwd
    default = stage_constants(dataclasses.replace(inst, training=dataclasses.replace(
        inst.training, recompute_modules=("core_attn",))), p, 0, gpu)
    assert default.b_compute - 2 * lt.forward == pytest.approx(lt.attention_fwd)


def test_moe_recompute_dispatches_the_tokens_once_more():
    """Forward and backward dispatch and combine (2 passes), one more when "moe" recomputes the layer: the
    evaluator's expert communication per micro-batch grows by 3/2."""
    p = placement(tp=2, ep=4)
    default, moe = instance(MIXTRAL_TINY), instance(MIXTRAL_TINY, ["core_attn", "moe"])
    gpu = default.cluster.gpu_types["h100-sxm-80gb"]
    assert stage_constants(default, p, 0, gpu).ep_passes == 2
    assert stage_constants(moe, p, 0, gpu).ep_passes == 3
    before, after = evaluate(default, p).stages[0].ep_comm_s, evaluate(moe, p).stages[0].ep_comm_s
    assert before > 0 and after == pytest.approx(1.5 * before)


def test_published_moe_layer_recompute_runs_fit():
    """The Megatron MoE Model Zoo's Qwen3-235B long-context runs recompute "layernorm moe" and ran on 80 GB H100s:
    with the modules they are predicted to fit; with Megatron-Core's default module they would need twice that."""
    runs = [r for r in load_runs(REFERENCE_DIR / "published_runs_moe.csv")
            if r.instance is not None and "moe" in r.instance.training.recompute_modules]
    assert len(runs) >= 8
    for run in runs:
        estimate = evaluate(run.instance, run.placement, check=False)
        assert estimate.peak_memory_gib <= 80, run.row
        default = dataclasses.replace(run.instance, training=dataclasses.replace(
            run.instance.training, recompute_modules=("core_attn",)))
        assert evaluate(default, run.placement, check=False).peak_memory_gib > 2 * 80 * 0.9, run.row


def test_megatron_arguments_name_the_modules():
    inst = instance(MIXTRAL_TINY, ["layernorm", "moe"])
    args = megatron_arguments(inst, placement(tp=2, ep=4))[0]
    assert ("--recompute-modules", ("layernorm", "moe")) in args
    plan = SimpleNamespace(placement=placement(tp=2, ep=4), estimate=evaluate(inst, placement(tp=2, ep=4)))
    assert "--recompute-modules layernorm moe\n" in megatron_args_script(inst, plan)
    assert not any(flag == "--recompute-modules" for flag, _ in megatron_arguments(instance(MIXTRAL_TINY),
                                                                                   placement(tp=2, ep=4))[0])


def module_instance():
    data, gpu_level = moe_exact_instance(2)  # 1 x 4 GPUs, every pair its own bandwidth
    data = copy.deepcopy(data)
    data["training"].update(recompute=["selective"], recompute_modules=["layernorm", "moe_act", "moe"])
    return instance_from_dict(data), gpu_level


_BEST: dict = {}


def module_optima():
    if not _BEST:
        inst, gpu_level = module_instance()
        all_maps = list(maps(inst, gpu_level))
        _BEST["value"] = inst, {c: brute_force_optimum(inst, c, all_maps) for c in configurations(inst) if c.ep > 1}
    return _BEST["value"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("every", [3, pytest.param(1, marks=pytest.mark.slow)])
def test_program_with_recompute_modules_matches_brute_force(backend, every):
    """Every third expert configuration in the quick suite, all of them with the slow checks."""
    inst, best = module_optima()
    experts = [c for c in best if c.ep > 1 and best[c] < math.inf][::every]
    assert experts
    assert programs_match_brute_force(inst, best, backend, experts) == len(experts)


def test_bounds_with_recompute_modules_stay_below_brute_force():
    inst, best = module_optima()
    assert bounds_below_brute_force(inst, best) >= 2


MIXED_TINY = {**MLA_TINY, "name": "tiny-mixed", "first_k_dense_replace": 1, "intermediate_size": 1536}


def test_modules_act_on_the_layers_of_their_kind():
    """A model with a dense first layer (docs/moe.md (E1)): "mlp" drops a dense layer's MLP terms and fc1 input and
    leaves MoE layers alone; "moe" drops an MoE layer's routed tokens and leaves dense layers alone."""
    p = placement(tp=2, ep=4)
    base, mlp, moe = (instance(MIXED_TINY, modules) for modules in (None, ["core_attn", "mlp"], ["core_attn", "moe"]))

    def kept(inst, kind):
        return memory_coefficients(inst, p, 0, kind).activations[1]

    dense_mlp = 6.0 * 1024 * 1536 / 2 + 2.0 * 1024 * 512 / 2  # SwiGLU terms of the 1536-wide MLP / tp, fc1 input / sp
    assert kept(base, "dense") - kept(mlp, "dense") == pytest.approx(dense_mlp)
    assert kept(mlp, "moe") == kept(base, "moe")
    assert kept(moe, "dense") == kept(base, "dense")
    assert kept(moe, "moe") < kept(base, "moe")


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_program_with_modules_on_a_mixed_model_matches_brute_force(backend):
    data, gpu_level = moe_exact_instance(0)  # dense first layer, two nodes of 4 GPUs
    data = copy.deepcopy(data)
    data["training"].update(recompute=["selective"], recompute_modules=["layernorm", "mlp", "moe"])
    inst = instance_from_dict(data)
    best = {c: brute_force_optimum(inst, c, list(maps(inst, gpu_level))) for c in configurations(inst)}
    configs = [c for c in best if best[c] < math.inf]
    assert programs_match_brute_force(inst, best, backend, configs[::2]) == len(configs[::2])
    assert bounds_below_brute_force(inst, best) >= 2
