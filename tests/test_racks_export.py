"""Launch files for racks (NVLink domains): gb200_nvl72_576's plan exported, its arguments read by Megatron-LM's
parser and its Slurm route's groups rebuilt by megatron-core's own initialize_model_parallel; the rack lines and
environment; the rack self-check, which fails on a launch that splits a group across racks."""

from __future__ import annotations

import dataclasses
import subprocess

import pytest

from conftest import REPO
from formulation import default_placement, evaluate, load_instance
from formulation.inputs.model import load_model_section
from frameworks import initialize_model_parallel_groups, megatron_lm_namespace
from solvers.outputs.export import export_plan
from solvers.outputs.launch import LaunchMismatch, check_groups, parse_slurm_files
from solvers.outputs.racks import check_domains, domain_layout, ep_ranks_per_domain, rack_environment


class _Plan:
    def __init__(self, instance, placement):
        self.placement, self.estimate = placement, evaluate(instance, placement, check=False)

    def to_dict(self, cluster):
        return {"placement": self.placement.to_dict(cluster)}


@pytest.fixture(scope="module")
def gb200():
    return load_instance(REPO / "instances" / "gb200_nvl72_576.json")


def test_gb200_launch_files_are_megatrons_and_keep_groups_in_racks(gb200, tmp_path):
    """tp 4 and cp 2 (the plan's shape; a cp ring over two trays of a rack), pp 8: megatron_args.sh parses with Megatron-LM's parser and exports
    NCCL_MNNVL_ENABLE=1; the Slurm route pins 18 trays per rack and realises megatron-core's real groups, every tp
    and cp group inside one rack."""
    p = default_placement(gb200, tp=4, pp=8, cp=2)
    assert domain_layout(gb200.cluster, p) == {
        "tp": {"groups": 144, "inside_one_domain": True, "most_domains_spanned": 1},
        "cp": {"groups": 288, "inside_one_domain": True, "most_domains_spanned": 1}}
    # tp 8 x cp 2 = 16 ranks do not tile a rack of 72: some cp rings straddle two racks
    assert domain_layout(gb200.cluster, default_placement(gb200, tp=8, pp=4, cp=2))["cp"]["most_domains_spanned"] == 2
    export_plan(gb200, _Plan(gb200, p), tmp_path)
    shell = f'source "{tmp_path / "megatron_args.sh"}"; printf "%s\\n" "${{MEGATRON_ARGS[@]}}"; echo ---; env'
    out = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, check=True).stdout.splitlines()
    assert "NCCL_MNNVL_ENABLE=1" in out[out.index("---"):]
    args = megatron_lm_namespace(out[:out.index("---")])
    assert (args.tensor_model_parallel_size, args.context_parallel_size, args.pipeline_model_parallel_size) == (4, 2, 8)
    script = (tmp_path / "launch_slurm.sh").read_text()
    assert "#SBATCH --segment=18" in script and "#   rack07: 18 trays, tray126 .. tray143" in script
    launch = parse_slurm_files((tmp_path / "hostfile").read_text(), script)
    check_groups(gb200, p, launch, initialize_model_parallel_groups)
    check_domains(gb200, p, launch.realise(gb200.cluster), "slurm")
    assert "Rack self-check passed" in (tmp_path / "README.txt").read_text()


def test_a_launch_that_splits_a_tp_group_across_racks_fails_the_rack_check(gb200):
    p = default_placement(gb200, tp=4, pp=8, cp=2)
    gpus = list(p.gpus)
    gpus[0], gpus[72] = gpus[72], gpus[0]  # rank 0 (rack 0) and a rank on rack 1
    with pytest.raises(LaunchMismatch, match="tp group spans 2 NVLink domains"):
        check_domains(gb200, p, gpus, "slurm")


def test_hybrid_ep_environment_counts_the_ep_ranks_on_a_rack(gb200):
    """An MoE plan with ep 8 inside racks: HybridEP's domain size 72 and 8 ep ranks per domain; ep 144 over two
    racks: 72 ranks of each ep group on each."""
    moe = dataclasses.replace(gb200, model=load_model_section({"preset": "mixtral-8x7b"}, "test.json", REPO))
    inside = default_placement(moe, tp=1, pp=4, ep=8)
    env, _ = rack_environment(moe, inside)
    assert env == {"NCCL_MNNVL_ENABLE": "1", "NVLINK_DOMAIN_SIZE": "72", "USE_MNNVL": "1",
                   "NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN": "8"}
    assert ep_ranks_per_domain(moe.cluster, dataclasses.replace(inside, ep=1)) is None  # no ep group at all
    assert rack_environment(load_instance(REPO / "instances" / "h100_128.json"), inside) == ({}, [])
