"""One rank of the launch smoke test (tests/test_frameworks_smoke.py), started by the generated launch script.

It checks what the launch gave it against the plan (SMOKE_EXPECT, a JSON file): its GPU (the simulated host in
NODE, CUDA_VISIBLE_DEVICES[LOCAL_RANK]), then joins a gloo process group, lets megatron-core's real
`initialize_model_parallel` build the tp, cp, dp, dp-with-cp and pp groups from the parallel sizes found in its own
command line, and compares the GPUs of its groups with the plan's. Under the torchtitan route (started as
`-m smoke_rank` with torchtitan's arguments) rank 0 also has torchtitan 0.3's ConfigManager parse the command line
and its ParallelDims accept it at the launched world size. Writes rank<R>.json next to SMOKE_EXPECT.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch.distributed as dist
from megatron.core import parallel_state


def _sizes(argv: list[str]) -> dict[str, int]:
    """tp, pp, cp from the Megatron or torchtitan arguments this rank was started with."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--tensor-model-parallel-size", "--parallelism.tensor-parallel-degree", dest="tp", type=int)
    parser.add_argument("--pipeline-model-parallel-size", "--parallelism.pipeline-parallel-degree", dest="pp", type=int)
    parser.add_argument("--context-parallel-size", "--parallelism.context-parallel-degree", dest="cp", type=int)
    known, _ = parser.parse_known_args(argv)
    return {"tp": known.tp, "pp": known.pp, "cp": known.cp}


def _torchtitan_check(argv: list[str], world: int) -> dict:
    from torchtitan.config.manager import ConfigManager
    from torchtitan.distributed.parallel_dims import ParallelDims
    config = ConfigManager().parse_args(argv)
    dims = ParallelDims.from_config(config.parallelism, world_size=world)
    return {"dp_replicate": dims.dp_replicate, "dp_shard": dims.dp_shard, "cp": dims.cp, "tp": dims.tp, "pp": dims.pp}


def main() -> None:
    argv = sys.argv[1:]
    expect = json.loads(Path(os.environ["SMOKE_EXPECT"]).read_text())
    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    device = os.environ["CUDA_VISIBLE_DEVICES"].split(",")[local]
    mine = f"{os.environ['NODE']}:{device}"
    sizes = _sizes(argv)
    problems = []
    if mine != expect["gpus"][rank]:
        problems.append(f"runs on {mine}, planned {expect['gpus'][rank]}")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=sizes["tp"],
                                             pipeline_model_parallel_size=sizes["pp"],
                                             context_parallel_size=sizes["cp"])
    gpu_of_rank: list = [None] * world
    dist.all_gather_object(gpu_of_rank, mine)
    groups = {"tp": parallel_state.get_tensor_model_parallel_group(),
              "cp": parallel_state.get_context_parallel_group(),
              "dp": parallel_state.get_data_parallel_group(),
              "dp-cp": parallel_state.get_data_parallel_group(with_context_parallel=True),
              "pp": parallel_state.get_pipeline_model_parallel_group()}
    mine_groups = {}
    for name, group in groups.items():
        have = [gpu_of_rank[r] for r in dist.get_process_group_ranks(group)]
        want = next(g for g in expect["groups"][name] if mine in g)
        mine_groups[name] = have
        if (have != want) if name == "pp" else (sorted(have) != sorted(want)):
            problems.append(f"{name} group runs on {have}, planned {want}")
    result = {"rank": rank, "gpu": mine, "local_rank": local, "groups": mine_groups, "problems": problems}
    if rank == 0 and os.environ.get("SMOKE_TORCHTITAN") == "1":
        result["torchtitan_parallel_dims"] = _torchtitan_check(argv, world)
    dist.barrier()
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()
    Path(os.environ["SMOKE_EXPECT"]).with_name(f"rank{rank}.json").write_text(json.dumps(result))
    print(f"rank {rank:2d} on {mine} (LOCAL_RANK {local}): " + ("; ".join(problems) if problems else
          "planned GPU, " + ", ".join(f"{n} {g}" for n, g in mine_groups.items() if n in ("tp", "pp"))), flush=True)


if __name__ == "__main__":
    main()
