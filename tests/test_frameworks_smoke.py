"""The generated launch_torchrun.sh started for real on this machine: every node of the plan is simulated by one
run of the script (NODE=<node>, loopback rendezvous), torchrun starts its gloo processes on the CPU, and each rank
(tests/smoke_rank.py) checks that it got its planned GPU and that megatron-core's real `initialize_model_parallel`
gave it the plan's groups. Slow (tens of processes importing torch); bounded by a timeout."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import TESTS, build_instance, small_instance_dict
from formulation import default_placement, evaluate
from frameworks import require
from solvers.outputs.export import export_plan
from solvers.outputs.launch import plan_groups, torchrun_launch

TIMEOUT_S = 420


@dataclasses.dataclass
class _Plan:
    placement: object
    estimate: object

    def to_dict(self, cluster):
        return {"placement": self.placement.to_dict(cluster), "estimate": self.estimate.to_dict()}


def _reordered(instance, base, node_order: list[int], reverse_gpus: bool):
    """The ranks of node block k placed on node node_order[k], each node's GPUs reversed if asked."""
    cluster, per_node = instance.cluster, instance.cluster.nodes[0].num_gpus
    gpus = []
    for rank in range(base.world_size):
        block, local = divmod(rank, per_node)
        gpus.append(node_order[block] * per_node + (per_node - 1 - local if reverse_gpus else local))
    assert sorted(gpus) == list(range(cluster.num_gpus))
    return dataclasses.replace(base, gpus=tuple(gpus))


def h100_128_scaled_down():
    """h100_128's plan shape (tp x cp per node, one (stage, replica) per node, nodes not in stage order, see its
    GPU map) on 4 nodes x 4 GPUs: tp=2 cp=2 pp=2 dp=2, node blocks (s0 d0, s0 d1, s1 d0, s1 d1) on nodes 2, 0, 3, 1,
    GPUs of every node in reverse order."""
    data = small_instance_dict(num_nodes=4, gpus_per_node=4)
    data["cluster"]["nodes"] = [dict(node, name=f"h100-{i:02d}") for i, node in enumerate(data["cluster"]["nodes"])]
    instance = build_instance(data)
    base = default_placement(instance, tp=2, pp=2, cp=2, dp=2)
    return instance, _reordered(instance, base, [2, 0, 3, 1], reverse_gpus=True)


def shuffled_two_nodes():
    """2 nodes x 4 GPUs, tp=2 pp=2 dp=2: stage 0 on node n1, stage 1 on n0, GPUs reversed."""
    instance = build_instance(small_instance_dict(num_nodes=2, gpus_per_node=4))
    base = default_placement(instance, tp=2, pp=2, dp=2)
    return instance, _reordered(instance, base, [1, 0], reverse_gpus=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_nodes(out: Path, launch, extra_env: dict) -> list[subprocess.Popen]:
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "OMP_NUM_THREADS": "1",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "SMOKE_EXPECT": str(out / "expect.json"),
           "PYTHONPATH": f"{TESTS}:{os.environ.get('PYTHONPATH', '')}", "PYTHONWARNINGS": "ignore", **extra_env}
    return [subprocess.Popen(["bash", str(out / "launch_torchrun.sh")], env={**env, "NODE": node.host},
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
            for node in launch.nodes]


def _wait(processes: list[subprocess.Popen]) -> list[str]:
    outputs = []
    try:
        for process in processes:
            outputs.append(process.communicate(timeout=TIMEOUT_S)[0])
    finally:
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)  # the node's torchrun and its ranks
                process.wait()
    return outputs


def run_smoke(instance, placement, out: Path, framework: str, expected_placement=None) -> list[dict]:
    """Export the plan, start every node's launch_torchrun.sh, return the ranks' results (rank order); the ranks
    compare what they got with `expected_placement` (default: the plan)."""
    export_plan(instance, _Plan(placement, evaluate(instance, placement)), out)
    expected = expected_placement or placement
    cluster = instance.cluster
    names = [cluster.gpu_name(g) for g in expected.gpus]
    (out / "expect.json").write_text(json.dumps({
        "gpus": names,
        "groups": {kind: [[cluster.gpu_name(g) for g in group] for group in groups]
                   for kind, groups in plan_groups(expected).items()}}))
    launch = torchrun_launch(instance, placement)
    assert launch is not None and len(launch.nodes) > 1
    extra = {"TRAIN_SCRIPT": str(TESTS / "smoke_rank.py")} if framework == "megatron" else {
        "FRAMEWORK": "torchtitan", "TORCHTITAN_ENTRY": "smoke_rank", "SMOKE_TORCHTITAN": "1",
        "TORCHTITAN_MODULE": "llama3", "TORCHTITAN_CONFIG": "llama3_debugmodel"}
    outputs = _wait(_start_nodes(out, launch, extra))
    missing = [r for r in range(placement.world_size) if not (out / f"rank{r}.json").exists()]
    assert not missing, f"ranks {missing} did not finish:\n" + "\n".join(text[-3000:] for text in outputs)
    results = [json.loads((out / f"rank{r}.json").read_text()) for r in range(placement.world_size)]
    print(f"\n--- {framework} route through launch_torchrun.sh, plan {placement.summary()}")
    for node in launch.nodes:
        print(f"node {node.host}: NODE_RANK {node.node_rank}, CUDA_VISIBLE_DEVICES "
              f"{','.join(map(str, node.visible_devices))}")
        for r in results[node.node_rank * launch.nproc_per_node:(node.node_rank + 1) * launch.nproc_per_node]:
            groups = " ".join(f"{name} {','.join(g)}" for name, g in r["groups"].items() if name != "dp-cp")
            print(f"  rank {r['rank']:2d} LOCAL_RANK {r['local_rank']} on {r['gpu']}: "
                  + ("; ".join(r["problems"]) if r["problems"] else f"as planned; {groups}"))
    return results


@pytest.mark.slow
def test_h100_128_shaped_plan_started_through_launch_torchrun(tmp_path):
    require("megatron.core.parallel_state")
    instance, placement = h100_128_scaled_down()
    results = run_smoke(instance, placement, tmp_path, "megatron")
    assert [r["problems"] for r in results] == [[]] * placement.world_size
    assert [r["gpu"] for r in results] == [instance.cluster.gpu_name(g) for g in placement.gpus]


@pytest.mark.slow
def test_shuffled_two_node_plan_started_through_the_torchtitan_route(tmp_path):
    require("megatron.core.parallel_state")
    require("torchtitan.config.manager")
    instance, placement = shuffled_two_nodes()
    results = run_smoke(instance, placement, tmp_path, "torchtitan")
    assert [r["problems"] for r in results] == [[]] * placement.world_size
    dims = results[0]["torchtitan_parallel_dims"]
    assert (dims["tp"], dims["pp"], dims["cp"], dims["dp_replicate"] * dims["dp_shard"]) == (
        placement.tp, placement.pp, placement.cp, placement.dp)


@pytest.mark.slow
def test_smoke_ranks_notice_a_launch_that_is_not_the_plan(tmp_path):
    """The launch files of one plan checked against another (two GPUs of node n0 exchanged): the ranks say so."""
    require("megatron.core.parallel_state")
    instance = build_instance(small_instance_dict(num_nodes=2, gpus_per_node=2))
    placement = default_placement(instance, tp=2, pp=1, dp=2)
    other = dataclasses.replace(placement, gpus=(0, 2, 1, 3))  # tp pairs {n0:0, n1:0}, {n0:1, n1:1}
    results = run_smoke(instance, placement, tmp_path, "megatron", expected_placement=other)
    problems = [p for r in results for p in r["problems"]]
    assert any("runs on n0:1, planned n1:0" in p for p in problems)
    assert any(p.startswith("tp group runs on") for p in problems)
