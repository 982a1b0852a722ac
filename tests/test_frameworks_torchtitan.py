"""The torchtitan files read by torchtitan itself: torchtitan_args.sh by 0.3.0's ConfigManager (its tyro command
line), torchtitan-0.2.toml by 0.2.2's (`--job.config_file`), each accepted by that release's ParallelDims at the
plan's world size, for the solved plans of h100_128, a100_h100_64 and h100_128 with HSDP (dp_replicate > 1)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from formulation import default_placement, evaluate, instance_from_dict, load_instance
from formulation.inputs.model import PRESET_DIR, load_model_section, preset_names
from frameworks import hf_parameter_count, require, torchtitan_flavour_facts
from solvers import solve
from solvers.outputs.export import export_plan
from solvers.outputs.torchtitan import FLAVOURS, torchtitan_args_script, torchtitan_flavour, torchtitan_run

TORCHTITAN_02 = Path(sys.prefix) / "torchtitan-0.2.2"  # where .ci/run installs 0.2.2 beside 0.3.0


@pytest.fixture(scope="module")
def a100_h100():
    instance = load_instance(REPO / "instances" / "a100_h100_64.json")
    return instance, solve(instance)


@pytest.fixture(scope="module")
def h100_hsdp():
    """h100_128 planned for torchtitan with HSDP: `training.dp_replicate_sizes` [2, 4, 8, 16] leaves out one shard
    group over all of dp (recompute full only, Megatron-style default placements: a plan in seconds)."""
    data = json.loads((REPO / "instances" / "h100_128.json").read_text())
    data["training"].update(dp_replicate_sizes=[2, 4, 8, 16], recompute=["full"])
    instance = instance_from_dict(data, "h100_128_hsdp.json", REPO / "instances", framework="torchtitan")
    return instance, solve(instance, method="baseline")


@pytest.fixture(scope="module", params=["h100_128", "a100_h100_64", "h100_128_hsdp"])
def exported(request, h100, tmp_path_factory):
    if importlib.util.find_spec("torchtitan") is None and not (TORCHTITAN_02 / "torchtitan").is_dir():
        require("torchtitan")  # skips (fails under LLM_PLANNER_REQUIRE_FRAMEWORKS=1) before solves no test reads
    instance, solved = {"h100_128": lambda: (h100, request.getfixturevalue("plan")),
                        "a100_h100_64": lambda: request.getfixturevalue("a100_h100"),
                        "h100_128_hsdp": lambda: request.getfixturevalue("h100_hsdp")}[request.param]()
    if request.param == "h100_128_hsdp":  # HSDP as planned: replicas of shard groups, both over one rank
        assert solved.placement.dp_replicate > 1 and solved.placement.shard_size > 1
        assert torchtitan_run(instance, solved, "0.3").placement == solved.placement  # exported as planned
    out = tmp_path_factory.mktemp(request.param)
    export_plan(instance, solved, out)
    return instance, solved, out


def _written_arguments(out: Path) -> list[str]:
    """TORCHTITAN_ARGS then TORCHTITAN_SUBCOMMANDS exactly as bash expands the written file."""
    shell = f'source "{out}/torchtitan_args.sh"; printf "%s\\n" "${{TORCHTITAN_ARGS[@]}}" "${{TORCHTITAN_SUBCOMMANDS[@]}}"'
    return subprocess.run(["bash", "-c", shell], capture_output=True, text=True, check=True).stdout.splitlines()


def test_current_torchtitan_parses_the_command_line_and_accepts_the_degrees(exported):
    instance, solved, out = exported
    manager = require("torchtitan.config.manager")
    parallel_dims = require("torchtitan.distributed.parallel_dims")
    config = manager.ConfigManager().parse_args(_written_arguments(out))
    run = torchtitan_run(instance, solved, "0.3")
    p, par = run.placement, config.parallelism
    dims = parallel_dims.ParallelDims.from_config(par, world_size=p.world_size)
    assert (dims.dp_replicate, dims.dp_shard, dims.cp, dims.tp, dims.pp) == (
        run.replicate_degree, run.shard_degree, p.cp, p.tp, p.pp)
    training = config.training
    assert training.seq_len == instance.training.seq_length
    assert training.global_batch_size == instance.training.global_batch_size
    assert training.global_batch_size % (training.local_batch_size * dims.dp_replicate * dims.dp_shard) == 0
    if p.pp > 1:
        assert par.pipeline_parallel_microbatch_size == p.micro_batch_size
        parts = par.module_fqns_per_model_part
        assert len(parts) == p.pp * p.vpp and parts[0][0] == "tok_embeddings" and parts[-1][-2:] == ["norm", "output"]
        layers = [int(name.split(".")[1]) for part in parts for name in part if name.startswith("layers.")]
        assert layers == list(range(instance.model.num_layers))
    expected_ac = {"none": "NoneType", "selective": "SelectiveAC", "full": "FullAC"}[p.recompute]
    assert expected_ac in type(config.activation_checkpoint).__qualname__


_PARSE_02 = """
import json, sys
from torchtitan.config import ConfigManager
from torchtitan.distributed import ParallelDims
c = ConfigManager().parse_args(["--job.config_file", sys.argv[1]])
p = c.parallelism
d = ParallelDims(dp_replicate=p.data_parallel_replicate_degree, dp_shard=p.data_parallel_shard_degree,
                 cp=p.context_parallel_degree, tp=p.tensor_parallel_degree, pp=p.pipeline_parallel_degree,
                 ep=p.expert_parallel_degree, etp=p.expert_tensor_parallel_degree, world_size=int(sys.argv[2]))
import torchtitan
print(json.dumps({"file": torchtitan.__file__, "dims": [d.dp_replicate, d.dp_shard, d.cp, d.tp, d.pp],
                  "parts": p.module_fqns_per_model_part, "reshard": p.fsdp_reshard_after_forward,
                  "ac": c.activation_checkpoint.mode, "local": c.training.local_batch_size}))
"""


def test_torchtitan_02_reads_the_toml_and_accepts_the_degrees(exported):
    instance, solved, out = exported
    if not (TORCHTITAN_02 / "torchtitan").is_dir():
        require("torchtitan_0_2_2_beside_the_venv")  # skips, or fails under LLM_PLANNER_REQUIRE_FRAMEWORKS=1
    run = torchtitan_run(instance, solved, "0.2")
    p = run.placement
    result = subprocess.run([sys.executable, "-c", _PARSE_02, str(out / "torchtitan-0.2.toml"), str(p.world_size)],
                            capture_output=True, text=True, env={"PYTHONPATH": str(TORCHTITAN_02), "PATH": ""},
                            cwd=out, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    read = json.loads(result.stdout.splitlines()[-1])
    assert read["file"].startswith(str(TORCHTITAN_02))  # 0.2.2 answered, not the 0.3.0 of site-packages
    assert read["dims"] == [run.replicate_degree, run.shard_degree, p.cp, p.tp, p.pp]
    assert read["ac"] == p.recompute
    # 0.2.x runs replicate only (DDP, no shard degree) without tp and pp ('DDP has not supported > 1D parallelism')
    assert run.replicate_degree == 1 or run.shard_degree > 1 or (p.tp == 1 and p.pp == 1)
    if p.pp > 1:
        assert len(read["parts"]) == p.pp * p.vpp


# ---- torchtitan's model flavours against the planned models ------------------------------------------------------

@pytest.mark.parametrize("flavour", FLAVOURS, ids=lambda f: f"{f.module}-{f.name}")
def test_the_flavour_table_is_what_torchtitan_builds(flavour):
    """Every recorded flavour, built by torchtitan 0.3.0 itself on the meta device: its parameter count, layers,
    width, vocabulary, rotary base and scaling, norm epsilon and tying are the recorded ones, and its config
    function (--config) exists where one is named."""
    facts = torchtitan_flavour_facts(flavour.module, flavour.name)
    recorded = dataclasses.asdict(flavour)
    assert {k: recorded[k] for k in facts} == facts
    registry = require(f"torchtitan.models.{flavour.module}.config_registry")
    assert flavour.config is None or callable(getattr(registry, flavour.config))


@pytest.mark.parametrize("preset", preset_names())
def test_every_preset_is_a_torchtitan_flavour_or_the_file_says_it_is_not(preset, tmp_path):
    """Where a flavour has the preset's shape its parameter count is the planner's and the HF config's; the fields
    where it still differs are written in torchtitan_args.sh as a NOTE, and a preset without a flavour leaves
    TORCHTITAN_MODULE/TORCHTITAN_CONFIG to the user (the script stops without them)."""
    model = load_model_section({"preset": preset}, "test.json", REPO)
    flavour, differences = torchtitan_flavour(model)
    text = torchtitan_args_script(*_plan_of(model))
    if flavour is None:
        assert "torchtitan 0.3.0 has no flavour" in text and "TORCHTITAN_MODULE:?" in text
        return
    hf = hf_parameter_count(json.loads((PRESET_DIR / f"{preset}.json").read_text()))
    assert torchtitan_flavour_facts(flavour.module, flavour.name)["params"] == model.total_params == hf
    comments = " ".join(" ".join(line.lstrip("#").split()) for line in text.splitlines() if line.startswith("#"))
    assert (f"is NOT {preset}" in comments) == bool(differences)
    assert all(difference in comments for difference in differences)
    if preset.startswith("llama3.1") or preset == "qwen3-30b-a3b":  # torchtitan's flavours are these models
        assert differences == []


def _plan_of(model):
    """(instance, plan) of `model` on h100_128 with a default placement: what torchtitan_args_script needs."""
    base = load_instance(REPO / "instances" / "h100_128.json")
    instance = dataclasses.replace(base, model=model)
    tp = next(t for t in (8, 4, 2, 1) if model.num_attention_heads % t == 0 and model.num_kv_heads % t == 0)
    placement = default_placement(instance, tp=tp, pp=1, cp=1)

    class Plan:
        pass

    plan = Plan()
    plan.placement, plan.estimate = placement, evaluate(instance, placement, check=False)
    return instance, plan
