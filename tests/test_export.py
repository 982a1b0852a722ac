"""Launch outputs: Megatron-LM arguments, the torchrun and Slurm rank orders, the group self-check, torchtitan,
and `solve --output-dir`."""

from __future__ import annotations

import dataclasses
import os
import shlex
import shutil
import subprocess
import tomllib

import pytest

from conftest import REPO, build_instance, small_instance_dict
from formulation import default_placement, evaluate
from solvers.outputs.export import (export_plan, megatron_args_script, megatron_arguments, parse_pipeline_layout,
                                    pipeline_layout)
from solvers.outputs.torchtitan import runnable_zero_stages, torchtitan_run, torchtitan_toml
from solvers.outputs.launch import (LaunchMismatch, TorchrunLaunch, check_groups, megatron_rank_groups,
                                    parse_slurm_files, slurm_files, slurm_launch, torchrun_launch)

SPLIT_FLAGS = {"--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
               "--num-virtual-stages-per-pipeline-rank", "--num-layers-per-virtual-pipeline-stage",
               "--pipeline-model-parallel-layout"}
EXPORTED = {"plan.json", "megatron_args.sh", "launch_torchrun.sh", "launch_slurm.sh", "hostfile", "torchtitan_args.sh",
            "torchtitan-0.2.toml",
            "README.txt", "schedule.png", "memory.png", "cluster.png", "report.html"}


def _args(instance, placement) -> dict:
    flags, _, _ = megatron_arguments(instance, placement)
    return {flag: value for flag, value in flags}


def _permuted_within_nodes(instance, placement):
    """Every node's GPUs in reverse local order: same nodes per rank, a different GPU per rank."""
    cluster = instance.cluster
    flip = [int(cluster.node_offset[cluster.gpu_node[g]] + cluster.nodes[cluster.gpu_node[g]].num_gpus - 1
                - cluster.gpu_local[g]) for g in placement.gpus]
    return dataclasses.replace(placement, gpus=tuple(flip))


# ---- Megatron's group construction ----------------------------------------------------------------------

def test_rank_groups_match_megatrons_documented_example():
    # initialize_model_parallel's docstring: 16 GPUs, tp=2, pp=4 (dp=2)
    groups = megatron_rank_groups(tp=2, cp=1, dp=2, pp=4)
    assert groups["tp"] == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11], [12, 13], [14, 15]]
    assert groups["dp"] == [[0, 2], [1, 3], [4, 6], [5, 7], [8, 10], [9, 11], [12, 14], [13, 15]]
    assert groups["pp"] == [[0, 4, 8, 12], [1, 5, 9, 13], [2, 6, 10, 14], [3, 7, 11, 15]]
    # context parallelism: cp sits between tp and dp, and dp-cp joins them (docstring of context_parallel_size)
    cp = megatron_rank_groups(tp=4, cp=2, dp=1, pp=1)
    assert cp["cp"] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert cp["dp-cp"] == cp["cp"]


# ---- realising the plan ---------------------------------------------------------------------------------

def _node_blocks(placement):
    """The plan's configuration and layers on the default map (each node's ranks one contiguous block): the
    solved map of h100_128 is one of several within 0.01 % of each other and need not be torchrun-shaped."""
    return dataclasses.replace(placement, gpus=tuple(range(placement.world_size)))


def test_h100_plan_realised_by_torchrun_and_slurm(h100, plan):
    p = _node_blocks(plan.placement)
    torchrun = torchrun_launch(h100, p)
    assert torchrun is not None and torchrun.nproc_per_node == 8 and len(torchrun.nodes) == 16
    slurm = slurm_launch(h100, p)
    for launch in (torchrun, slurm):
        assert launch.realise(h100.cluster) == list(p.gpus)
        check_groups(h100, p, launch)


def test_permutation_within_nodes_sets_cuda_visible_devices(h100, plan):
    p = _permuted_within_nodes(h100, _node_blocks(plan.placement))
    torchrun = torchrun_launch(h100, p)
    assert torchrun is not None
    assert all(node.visible_devices == (7, 6, 5, 4, 3, 2, 1, 0) for node in torchrun.nodes)
    for launch in (torchrun, slurm_launch(h100, p)):
        assert launch.realise(h100.cluster) == list(p.gpus)
        check_groups(h100, p, launch)


@pytest.fixture
def split_nodes():
    """2 nodes x 4 GPUs, tp=2 pp=2 dp=2, each node hosting one tp pair of every stage: node n0 holds ranks
    0, 1, 4, 5 (two blocks), which torchrun cannot express."""
    instance = build_instance(small_instance_dict(num_nodes=2, gpus_per_node=4))
    base = default_placement(instance, tp=2, pp=2, dp=2)
    order = [0, 1, 4, 5, 2, 3, 6, 7]  # rank r runs on GPU order[r]
    return instance, dataclasses.replace(base, gpus=tuple(order))


def test_plan_torchrun_cannot_express_goes_through_slurm(split_nodes, tmp_path):
    instance, p = split_nodes
    assert torchrun_launch(instance, p) is None
    slurm = slurm_launch(instance, p)
    assert slurm.hostfile == ("n0", "n0", "n1", "n1", "n0", "n0", "n1", "n1")
    assert slurm.local_rank == (0, 1, 0, 1, 2, 3, 2, 3)
    assert slurm.visible_devices == {"n0": (0, 1, 2, 3), "n1": (0, 1, 2, 3)}
    check_groups(instance, p, slurm)
    plan = _Scored(p, evaluate(instance, p))
    written = export_plan(instance, plan, tmp_path)
    assert "launch_torchrun.sh" not in written and (tmp_path / "hostfile").read_text().split() == list(slurm.hostfile)
    assert "torchrun cannot express" in (tmp_path / "README.txt").read_text()


class _Scored:
    def __init__(self, placement, estimate):
        self.placement, self.estimate = placement, estimate

    def to_dict(self, cluster):
        return {"placement": self.placement.to_dict(cluster), "estimate": self.estimate.to_dict()}


def test_wrong_launch_orders_fail_the_check(h100, plan):
    p = plan.placement
    # launch scripts written for a placement with ranks 0 and tp exchanged (they sit in different tp groups)
    gpus = list(p.gpus)
    gpus[0], gpus[p.tp] = gpus[p.tp], gpus[0]
    with pytest.raises(LaunchMismatch, match="tp group" if p.tp > 1 else "group"):
        check_groups(h100, p, slurm_launch(h100, dataclasses.replace(p, gpus=tuple(gpus))))
    # torchrun: any two nodes exchanging their node ranks move whole rank blocks to the wrong machines
    good = torchrun_launch(h100, p)
    for j in range(1, len(good.nodes)) if good is not None else ():
        nodes = list(good.nodes)
        nodes[0] = dataclasses.replace(good.nodes[0], node_rank=good.nodes[j].node_rank)
        nodes[j] = dataclasses.replace(good.nodes[j], node_rank=good.nodes[0].node_rank)
        with pytest.raises(LaunchMismatch):
            check_groups(h100, p, TorchrunLaunch(good.nproc_per_node, tuple(nodes)))
    # Slurm: two hostfile lines exchanged disagree with the wrapper's per-rank table
    slurm = slurm_launch(h100, p)
    other = next(r for r, host in enumerate(slurm.hostfile) if host != slurm.hostfile[0])
    hosts = list(slurm.hostfile)
    hosts[0], hosts[other] = hosts[other], hosts[0]
    with pytest.raises(LaunchMismatch, match="rank 0 is placed on"):
        check_groups(h100, p, dataclasses.replace(slurm, hostfile=tuple(hosts)))


def test_expert_groups_are_part_of_the_self_check():
    """Mixtral on 64 H100 at tp 2, dp 32, ep 8: the written launch realises Megatron's expert groups too. Swapping
    two whole dp replicas (ranks 2-3 with 8-9) keeps every dense group (tp pairs, the dp group, pp) and moves
    GPUs between expert-parallel groups (ranks 0-7, 8-15, ...): only the expert check can see it."""
    from formulation import load_instance
    from formulation.placement import Placement
    from solvers.outputs.launch import plan_expert_groups
    instance = load_instance(REPO / "instances" / "mixtral_8x7b_h100_64.json")
    p = Placement(tp=2, pp=1, cp=1, dp=32, vpp=1, micro_batch_size=1, recompute="full", zero_stage=1,
                  layers_per_stage=(instance.model.num_layers,), gpus=tuple(range(64)), ep=8)
    check_groups(instance, p, slurm_launch(instance, p))
    assert sorted(map(sorted, plan_expert_groups(p)["ep"]))[:2] == [list(range(8)), list(range(8, 16))]
    gpus = list(range(64))
    gpus[2:4], gpus[8:10] = gpus[8:10], gpus[2:4]
    launch = slurm_launch(instance, dataclasses.replace(p, gpus=tuple(gpus)))
    check_groups(instance, dataclasses.replace(p, ep=1), launch)  # dense groups alike: passes without experts
    with pytest.raises(LaunchMismatch, match="expert ep group"):
        check_groups(instance, p, launch)


def test_torchtitan_files_carry_the_expert_degrees():
    """A MoE plan's torchtitan settings name its expert_parallel_degree and expert_tensor_parallel_degree, and
    say that torchtitan lays its expert groups out differently (and that it supports etp 1 or tp only)."""
    import types
    from formulation import load_instance
    from formulation.placement import Placement
    instance = load_instance(REPO / "instances" / "mixtral_8x7b_h100_64.json")
    p = Placement(tp=2, pp=1, cp=1, dp=32, vpp=1, micro_batch_size=1, recompute="full", zero_stage=3,
                  layers_per_stage=(instance.model.num_layers,), gpus=tuple(range(64)), ep=8)
    plan = types.SimpleNamespace(placement=p, estimate=evaluate(instance, p, check=False))
    text = torchtitan_toml(instance, plan)
    parallelism = tomllib.loads(text)["parallelism"]
    assert parallelism["expert_parallel_degree"] == 8 and parallelism["expert_tensor_parallel_degree"] == 1
    assert "etp-ep-edp" in text
    odd = dataclasses.replace(p, tp=4, dp=16, etp=2)
    text = torchtitan_toml(instance, types.SimpleNamespace(placement=odd, estimate=evaluate(instance, odd, check=False)))
    assert "supports expert_tensor_parallel_degree 1 or tp (4) only" in text


def test_wrong_launch_orders_name_the_broken_group():
    """2 nodes x 4 GPUs, tp=2 pp=2 dp=2, default map: node n0 is stage 0, node n1 stage 1."""
    instance = build_instance(small_instance_dict(num_nodes=2, gpus_per_node=4))
    p = default_placement(instance, tp=2, pp=2, dp=2)
    good = torchrun_launch(instance, p)
    check_groups(instance, p, good)
    n0, n1 = good.nodes
    # GPUs 1 and 2 of n0 exchanged: tensor-parallel pairs {0, 2} and {1, 3} instead of {0, 1} and {2, 3}
    with pytest.raises(LaunchMismatch, match="tp group of ranks"):
        check_groups(instance, p, TorchrunLaunch(4, (dataclasses.replace(n0, visible_devices=(0, 2, 1, 3)), n1)))
    # the nodes exchanged: every tp and dp group still exists, but stage 0 now runs on n1
    with pytest.raises(LaunchMismatch, match="pp group of ranks"):
        check_groups(instance, p, TorchrunLaunch(4, (dataclasses.replace(n0, node_rank=1),
                                                     dataclasses.replace(n1, node_rank=0))))


# ---- Megatron-LM and torchtitan arguments ---------------------------------------------------------------

def test_megatron_arguments_of_the_h100_plan(h100, plan):
    p = plan.placement
    args = _args(h100, p)
    assert args["--tensor-model-parallel-size"] == p.tp and args["--pipeline-model-parallel-size"] == p.pp
    assert args["--context-parallel-size"] == p.cp and args["--micro-batch-size"] == p.micro_batch_size
    assert args["--global-batch-size"] == 512 and args["--seq-length"] == 8192 and args["--num-layers"] == 80
    if p.vpp > 1 and len(set(p.layers_per_stage)) == 1:
        assert args["--num-layers-per-virtual-pipeline-stage"] == p.layers_per_stage[0] // p.vpp
    assert ("--sequence-parallel" in args) == (p.tp > 1)
    assert ("--use-distributed-optimizer" in args) == (p.zero_stage == 1)
    assert args["--num-query-groups"] == 8 and "--swiglu" in args


def test_megatron_arguments_carry_the_model_family_fields(h100, plan):
    """The issue's finding: Llama 3 trained as planned needs no linear biases, rotary base 500000, RMSNorm with
    the config's epsilon, and a vocabulary Megatron does not pad past the planner's 128,256 at the plan's tp."""
    args = _args(h100, plan.placement)
    assert "--disable-bias-linear" in args and "--add-qkv-bias" not in args and "--use-rope-scaling" not in args
    assert args["--rotary-base"] == 500000 and args["--normalization"] == "RMSNorm" and args["--norm-epsilon"] == 1e-5
    assert args["--vocab-size"] == 128256 and 128256 % (args["--make-vocab-size-divisible-by"] * plan.placement.tp) == 0
    assert "are yours" not in megatron_args_script(h100, plan)


@pytest.mark.parametrize("param_gather", [True, False])
def test_fp8_plan_runs_bf16_with_fp8_gemms(h100, plan, param_gather):
    """FP8 training is a bf16 run with Transformer Engine's FP8 GEMMs (Megatron-LM --bf16 --fp8-format ...;
    it used to come out as --fp16); --fp8-param-gather exactly when the memory model keeps FP8 weights."""
    job = dataclasses.replace(h100.training, precision="fp8", fp8_param_gather=param_gather)
    args = _args(dataclasses.replace(h100, training=job), plan.placement)
    assert "--bf16" in args and "--fp16" not in args
    assert args["--fp8-format"] == "hybrid" and args["--fp8-amax-history-len"] == 1024
    assert ("--fp8-param-gather" in args) == param_gather
    assert "--fp8-format" not in _args(h100, plan.placement)


@pytest.mark.parametrize("layers, vpp, expected", [
    ((19, 21, 21, 19), 1, {"--decoder-first-pipeline-num-layers": 19, "--decoder-last-pipeline-num-layers": 19}),
    ((20, 20, 20, 20), 1, {}),
    ((22, 20, 20, 18), 2, {"--decoder-first-pipeline-num-layers": 22, "--decoder-last-pipeline-num-layers": 18,
                           "--num-virtual-stages-per-pipeline-rank": 2}),
    ((20, 20, 20, 20), 5, {"--num-layers-per-virtual-pipeline-stage": 4}),
])
def test_layer_split_flags(h100, plan, layers, vpp, expected):
    p = dataclasses.replace(plan.placement, pp=4, vpp=vpp, layers_per_stage=layers)
    args = _args(h100, p)
    assert {k: v for k, v in args.items() if k in SPLIT_FLAGS} == expected


@pytest.mark.parametrize("layers, vpp", [((16, 22, 24, 18), 1), ((16, 22, 24, 18), 2), ((2, 2, 4, 72), 2)])
def test_uneven_split_uses_the_layout_flag(h100, plan, layers, vpp):
    p = dataclasses.replace(plan.placement, pp=4, vpp=vpp, layers_per_stage=layers)
    layout = _args(h100, p)["--pipeline-model-parallel-layout"]
    assert layout.startswith("E") and layout.endswith("L")
    parsed = parse_pipeline_layout(layout, 4)
    assert parsed == [[n // vpp] * vpp for n in layers]


def test_layout_string_folds_repeats():
    assert pipeline_layout((3, 2, 2, 2, 3), 1) == "Et*3|(t*2|)*3t*3L"
    assert parse_pipeline_layout("Et*3|(t*2|)*3t*3L", 5) == [[3], [2], [2], [2], [3]]


def test_zero3_and_torchtitan(h100, plan):
    p = dataclasses.replace(plan.placement, zero_stage=3)
    args = _args(h100, p)
    assert "--use-megatron-fsdp" in args and args["--data-parallel-sharding-strategy"] == "optim_grads_params"
    shard = tomllib.loads(torchtitan_toml(h100, _Scored(p, evaluate(h100, p))))
    assert shard["parallelism"]["data_parallel_shard_degree"] == p.dp
    assert shard["parallelism"]["fsdp_reshard_after_forward"] == "always"  # the per-layer gather zero 3 is scored with
    toml = tomllib.loads(torchtitan_toml(h100, plan))
    par, q = toml["parallelism"], plan.placement
    assert (par["tensor_parallel_degree"], par["pipeline_parallel_degree"], par["context_parallel_degree"]) == (
        q.tp, q.pp, q.cp)
    assert par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"] == q.dp
    assert toml["training"]["global_batch_size"] == 512 and toml["training"]["seq_len"] == 8192
    if q.pp > 1:
        parts = par["module_fqns_per_model_part"]
        assert len(parts) == q.pp * q.vpp and parts[0][0] == "tok_embeddings" and parts[-1][-1] == "output"
        assert sum(name.startswith("layers.") for part in parts for name in part) == 80


@pytest.mark.parametrize("release", ["0.2", "0.3"])
def test_torchtitan_run_is_the_evaluators_best_runnable_zero_stage(h100, plan, split_nodes, release):
    instance, base = split_nodes
    cases = [(h100, plan.placement)] + [(instance, dataclasses.replace(base, zero_stage=z)) for z in (0, 1, 3)]
    for inst, p in cases:
        planned = _Scored(p, evaluate(inst, p))
        run = torchtitan_run(inst, planned, release)
        runnable = runnable_zero_stages(p, release)
        if p.zero_stage in runnable:
            assert run.placement == p and run.notes == ()
            continue
        scored = {z: evaluate(inst, dataclasses.replace(p, zero_stage=z), check=False) for z in runnable}
        best = min((z for z in runnable if scored[z].fits), key=lambda z: scored[z].iteration_time_s)
        assert run.placement.zero_stage == best
        assert run.estimate.iteration_time_s == scored[best].iteration_time_s
        assert f"{scored[best].iteration_time_s:.3f} s per iteration instead of {planned.estimate.iteration_time_s:.3f}" \
            in run.notes[0] and f"peak {scored[best].peak_memory_gib:.1f} GiB" in run.notes[0]


@pytest.mark.parametrize("tp, pp, cp, dp, release, expected", [
    (1, 1, 1, 8, "0.2", (0, 3)),   # pure data parallelism: replicate is DDP in both releases
    (2, 2, 1, 2, "0.2", (3,)),     # 0.2.x: 'DDP has not supported > 1D parallelism'
    (2, 2, 1, 2, "0.3", (0, 3)),   # 0.3.x: replicate via fully_shard over (dp_replicate, fsdp)
    (2, 1, 2, 2, "0.3", (3,)),     # cp > 1: the FSDP mesh is dp_shard x cp, parameters are sharded over cp
    (8, 1, 1, 1, "0.2", (0, 1, 3)),  # no data parallelism: every zero stage is the same run
])
def test_runnable_zero_stages(h100, plan, tp, pp, cp, dp, release, expected):
    p = dataclasses.replace(plan.placement, tp=tp, pp=pp, cp=cp, dp=dp)
    assert runnable_zero_stages(p, release) == expected


# ---- the written files, end to end ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def output_dir(h100_cli_run):
    """What `solve --instance instances/h100_128.json --output-dir ...` wrote (conftest.py: run once)."""
    return h100_cli_run


def test_slurm_script_asks_for_the_gpus_it_uses(h100, plan):
    """The issue's finding: the Slurm script asked for no GPUs. It asks for every GPU of its nodes (sbatch header
    and srun step); the self-check reads that back and refuses a script asking for fewer GPUs than it drives."""
    p = plan.placement
    launch = slurm_launch(h100, p)
    hostfile, script = slurm_files(launch, p)
    per_node = h100.cluster.nodes[0].num_gpus
    header = script.splitlines()[1:6]
    assert header[3] == f"#SBATCH --gpus-per-node={per_node}" and header[0].startswith("#SBATCH --nodes=")
    assert f"--gpus-per-node={per_node} --gpu-bind=none bash" in script
    check_groups(h100, p, parse_slurm_files(hostfile, script))
    fewer = script.replace(f"--gpus-per-node={per_node}", f"--gpus-per-node={per_node - 1}")
    with pytest.raises(LaunchMismatch, match=f"asks for {per_node - 1} GPUs per node"):
        check_groups(h100, p, parse_slurm_files(hostfile, fewer))
    with pytest.raises(LaunchMismatch, match="asks for no GPUs"):
        parse_slurm_files(hostfile, script.replace("#SBATCH --gpus-per-node", "#SBATCH --mem"))


def test_solve_output_dir_writes_every_file(output_dir, plan, h100):
    expected = EXPORTED if torchrun_launch(h100, plan.placement) else EXPORTED - {"launch_torchrun.sh"}
    assert expected <= {path.name for path in output_dir.iterdir()}
    assert len((output_dir / "hostfile").read_text().split()) == plan.placement.world_size
    assert all((output_dir / name).stat().st_size > 0 for name in expected)
    assert os.access(output_dir / "launch_slurm.sh", os.X_OK)
    assert "Group self-check passed" in (output_dir / "README.txt").read_text()


def _fake_tools(tmp_path, host: str) -> dict:
    """`torchrun`, `python` and `hostname` stand-ins that print what they would have started."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True)
    for tool in ("torchrun", "python"):
        (bin_dir / tool).write_text('#!/bin/sh\necho "CVD=$CUDA_VISIBLE_DEVICES RANK=$RANK LOCAL_RANK=$LOCAL_RANK '
                                    f'{tool} $*"\n')
    (bin_dir / "hostname").write_text(f"#!/bin/sh\necho {host}\n")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_launch_scripts_start_the_right_ranks(output_dir, plan, h100, tmp_path):
    p = plan.placement
    torchrun = torchrun_launch(h100, p)
    if torchrun is not None:
        node = torchrun.nodes[min(3, len(torchrun.nodes) - 1)]
        env = _fake_tools(tmp_path, node.host)
        out = subprocess.run(["bash", output_dir / "launch_torchrun.sh"], env=env, capture_output=True, text=True,
                             check=True).stdout
        assert f"CVD={','.join(map(str, node.visible_devices))}" in out and f"--node-rank={node.node_rank}" in out
        assert f"--tensor-model-parallel-size {p.tp}" in out
    rank = min(13, p.world_size - 1)
    host = h100.cluster.nodes[h100.cluster.gpu_node[p.gpus[rank]]].name
    env = {**_fake_tools(tmp_path / "slurm", host), "SLURM_PROCID": str(rank)}
    out = subprocess.run(["bash", output_dir / "launch_slurm.sh", "--rank", "--extra"], env=env,
                         capture_output=True, text=True, check=True).stdout
    slurm = slurm_launch(h100, p)
    assert f"CVD={','.join(map(str, slurm.visible_devices[host]))} RANK={rank} " \
           f"LOCAL_RANK={slurm.local_rank[rank]} python pretrain_gpt.py" in out and out.rstrip().endswith("--extra")
    args = shlex.split(out.split("pretrain_gpt.py", 1)[1])
    assert args[args.index("--pipeline-model-parallel-size") + 1] == str(p.pp)


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_torchtitan_route_runs_the_module_with_torchtitan_arguments_only(plan, h100, tmp_path):
    p = _node_blocks(plan.placement)
    output_dir = tmp_path / "launch"
    export_plan(h100, _Scored(p, evaluate(h100, p)), output_dir)
    torchrun = torchrun_launch(h100, p)
    node = torchrun.nodes[0]
    env = {**_fake_tools(tmp_path, node.host), "FRAMEWORK": "torchtitan"}
    out = subprocess.run(["bash", output_dir / "launch_torchrun.sh", "--training.steps=10"], env=env,
                         capture_output=True, text=True, check=True).stdout
    args = shlex.split(out.split("torchrun ", 1)[1])
    module = args.index("-m")  # torchrun's own --module flag, then the module as the training script
    assert args[module + 1] == "torchtitan.train" and args[module + 2:module + 6] == [
        "--module", "llama3", "--config", "llama3_70b"]
    assert args[-2:] == ["--training.steps=10", f"activation-checkpoint:{p.recompute}"]  # subcommand last
    assert not any(arg.startswith(("--tensor-model", "--micro-batch", "--seq-length")) for arg in args)
    bad = subprocess.run(["bash", output_dir / "launch_torchrun.sh"], env={**env, "FRAMEWORK": "nemo"},
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "FRAMEWORK must be" in bad.stderr
