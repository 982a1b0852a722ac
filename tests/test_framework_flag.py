"""`solve --framework megatron|torchtitan`: the plan runs the framework's software stack and only the decisions
that framework runs, so its launch files carry the plan as planned (issue 42, finding 9: the torchtitan export of
a Megatron-stack plan of h100_128 ran 2.9x slower, by its own note)."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import pytest

from conftest import REPO
from formulation import default_placement, evaluate, load_instance
from formulation.inputs.frameworks import config_problem, torchtitan_zero_stages
from formulation.space import configurations
from solvers import solve
from solvers.outputs.export import export_plan
from solvers.outputs.torchtitan import torchtitan_run
from test_malformed_inputs import run_cli

SMALL = [REPO / "instances" / "small_2x4.json", REPO / "instances" / "small_4x2.json"]
MIXTRAL = REPO / "instances" / "mixtral_8x7b_h100_64.json"


def _with_training(path, tmp_path, **changes):
    data = json.loads(path.read_text())
    data["training"].update(changes)
    out = tmp_path / path.name
    out.write_text(json.dumps(data))
    return out


@pytest.mark.parametrize("path", SMALL, ids=lambda p: p.stem)
def test_the_flag_sets_the_stack_and_reads_zero_stage_as_the_framework_runs_it(path):
    """The small instances list zero_stage [1] and name no stack: --framework names it (no unset-stack warning),
    and torchtitan, which has no optimizer-only sharding, searches its FSDP2 (3) in its place."""
    default = load_instance(path)
    titan, megatron = load_instance(path, framework="torchtitan"), load_instance(path, framework="megatron")
    assert default.training.zero_stage == (1,) and default.training.software_stack_defaulted
    assert (default.training.framework, default.training.software_stack) == (None, "megatron")
    assert (titan.training.framework, titan.training.software_stack, titan.training.zero_stage) == \
        ("torchtitan", "torchtitan", (3,))
    assert not titan.training.software_stack_defaulted and not titan.training.fused_cross_entropy  # its own loss
    assert (megatron.training.software_stack, megatron.training.zero_stage) == ("megatron", (1,))
    # the stack's calibrated efficiencies come with it (formulation/data/calibration.json, h100-sxm-80gb+torchtitan)
    gpu = next(iter(titan.cluster.gpu_types.values()))
    assert gpu != next(iter(default.cluster.gpu_types.values()))


@pytest.mark.parametrize("path", SMALL, ids=lambda p: p.stem)
def test_the_torchtitan_plan_is_one_torchtitan_runs_and_its_export_has_no_mismatch_note(path, tmp_path):
    """Every decision of the plan is one torchtitan runs as such in both exported releases, so its files carry
    the plan unchanged and with no note; the same stack without the framework plans zero_stage 1, which torchtitan
    maps to another placement and says so. Restricting the space never makes the proven optimum faster."""
    titan = load_instance(path, framework="torchtitan")
    plan = solve(titan, method="exact")
    p, job = plan.placement, titan.training
    assert plan.solver.status == "optimal"
    assert p.zero_stage in job.zero_stage and p.recompute in job.recompute and p.cp in job.context_parallel_sizes
    assert p.vpp in job.virtual_pipeline_sizes and p.micro_batch_size <= job.max_micro_batch_size
    assert config_problem("torchtitan", job.seq_length, p) is None
    for release in ("0.2", "0.3"):
        assert p.zero_stage in torchtitan_zero_stages(p, release)
        run = torchtitan_run(titan, plan, release)
        assert run.placement == p and run.notes == ()
        assert run.estimate.iteration_time_s == plan.estimate.iteration_time_s
    written = export_plan(titan, plan, tmp_path / "out")
    # no note that the placement runs otherwise (a note on the model flavour may remain: llama3-8b has no rope
    # scaling where torchtitan's 8B flavour has it)
    assert "cannot run as planned" not in written["torchtitan_args.sh"].read_text()
    assert "cannot run as planned" not in written["torchtitan-0.2.toml"].read_text()
    # the launch scripts run the framework the plan was made for unless FRAMEWORK says otherwise
    assert "FRAMEWORK=${FRAMEWORK:-torchtitan}" in written["launch_slurm.sh"].read_text()

    # the stack alone with the instance's zero_stage [1]: a plan (the best default placement, quick to find)
    # that torchtitan's files map to another placement
    stack_only = load_instance(_with_training(path, tmp_path, software_stack="torchtitan"))
    unrunnable = solve(stack_only, method="baseline")
    assert unrunnable.placement.zero_stage == 1
    mapped = torchtitan_run(stack_only, unrunnable, "0.3").notes[0]
    assert "cannot run as planned" in mapped and mapped.endswith("solve --framework torchtitan")  # the way out
    # the stack alone with every zero stage: a space holding the framework's, so a proven optimum no slower
    every = load_instance(_with_training(path, tmp_path, software_stack="torchtitan", zero_stage=[0, 1, 3]))
    loose = solve(every, method="exact")
    assert loose.solver.status == "optimal" and loose.estimate.iteration_time_s <= plan.estimate.iteration_time_s


def test_every_configuration_torchtitan_is_offered_is_one_it_runs_and_none_is_lost():
    """The space under torchtitan is the stack's space less exactly the configurations torchtitan refuses: on
    h100_128 (cp 1 and 2, zero_stage [0, 1] read as [0, 3]) zero_stage 0 survives only without tp, pp or cp, or
    where nothing is replicated (dp x cp = 1)."""
    titan = load_instance(REPO / "instances" / "h100_128.json", framework="torchtitan")
    loose = dataclasses.replace(titan, training=dataclasses.replace(titan.training, framework=None))
    offered, every = set(configurations(titan)), set(configurations(loose))
    assert titan.training.zero_stage == (0, 3)
    assert offered == {c for c in every if config_problem("torchtitan", titan.training.seq_length, c) is None}
    assert {c.zero_stage for c in offered} == {0, 3} and len(every) > len(offered)
    assert all(c.tp == c.pp == c.cp == 1 or c.dp * c.cp == 1 for c in offered if c.zero_stage == 0)


@pytest.mark.parametrize("path", SMALL, ids=lambda p: p.stem)
def test_without_the_flag_the_plan_is_as_before_and_megatron_is_the_same_space(path):
    """The default keeps today's space and stack (and its unset-stack warning); --framework megatron on these
    instances (cp 1 only) offers the same configurations and so the same plan, now with the stack named."""
    default, megatron = load_instance(path), load_instance(path, framework="megatron")
    assert list(configurations(default)) == list(configurations(megatron))
    a, b = solve(default, method="exact"), solve(megatron, method="exact")
    assert a.placement == b.placement and a.estimate.iteration_time_s == b.estimate.iteration_time_s


def test_cli_names_the_framework_and_where_it_came_from(tmp_path):
    small = SMALL[0]
    flagged = run_cli("--instance", small, "--framework", "torchtitan", "--method", "baseline")
    named = run_cli("--instance", _with_training(small, tmp_path, framework="torchtitan"), "--method", "baseline")
    default = run_cli("--instance", small, "--method", "baseline")
    assert flagged.returncode == named.returncode == default.returncode == 0, flagged.stderr + named.stderr
    assert "planned for torchtitan (--framework torchtitan): software stack torchtitan" in flagged.stdout
    assert "planned for torchtitan (training.framework torchtitan)" in named.stdout
    assert "planned for no particular framework: software stack megatron (default: training.software_stack not " \
           "set)" in " ".join(default.stdout.split())  # the line wraps at the console's width


@pytest.mark.parametrize("training, phrase", [
    ({"software_stack": "megatron-deepspeed"},
     "training.software_stack: megatron-deepspeed conflicts with --framework torchtitan"),
    ({"software_stack": "megatron"}, "training.software_stack: megatron conflicts with --framework torchtitan"),
    ({"framework": "megatron"}, "training.framework: megatron conflicts with --framework torchtitan"),
    ({"seq_length": 4094, "context_parallel_sizes": [1, 2]},  # 4094 / 2 = 2047 tokens per cp rank: odd
     "training.context_parallel_sizes: --framework torchtitan splits the sequence into 2 x cp chunks"),
])
def test_a_conflict_with_the_flag_is_one_line_naming_both(training, phrase, tmp_path):
    result = run_cli("--instance", _with_training(SMALL[0], tmp_path, **training), "--framework", "torchtitan")
    assert result.returncode == 2 and result.stdout == ""
    assert len(result.stderr.splitlines()) == 1 and phrase in result.stderr, result.stderr


def test_the_pytorch_fsdp_alias_is_torchtitan_not_a_conflict(tmp_path):
    path = _with_training(SMALL[0], tmp_path, software_stack="fsdp")
    assert load_instance(path, framework="torchtitan").training.software_stack == "torchtitan"


def test_a_mixture_of_experts_model_under_torchtitan_is_refused_in_one_line():
    """FSDP-sharded experts (torchtitan's only sharding) are not modelled: no plan would be honest."""
    result = run_cli("--instance", MIXTRAL, "--framework", "torchtitan")
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1
    assert "training.framework: torchtitan shards a mixture-of-experts model with FSDP" in result.stderr


@pytest.mark.parametrize("placement, phrase", [
    ({"tp": 2, "pp": 2, "micro_batch_size": 1, "recompute": "none", "zero_stage": 1},
     "zero_stage: torchtitan cannot run zero_stage 1 here: it has no optimizer-only sharding"),
    ({"tp": 2, "pp": 2, "micro_batch_size": 1, "recompute": "none", "zero_stage": 0},
     "zero_stage: torchtitan cannot run zero_stage 0 here: it replicates parameters only without tp, pp or cp"),
    ({"tp": 2, "pp": 2, "micro_batch_size": 1, "recompute": "full", "recompute_num_layers": 2, "zero_stage": 3},
     "recompute_num_layers: torchtitan's launch files cannot run recompute_num_layers 2"),
])
def test_evaluating_a_placement_torchtitan_cannot_run_says_why_in_one_line(placement, phrase, tmp_path):
    """The same placement scores under Megatron, which runs it."""
    path = tmp_path / "placement.json"
    path.write_text(json.dumps(placement))
    refused = run_cli("--instance", SMALL[0], "--framework", "torchtitan", "--evaluate", path)
    assert refused.returncode == 2 and refused.stdout == "" and len(refused.stderr.splitlines()) == 1
    assert refused.stderr.startswith(f"error: {path}: {phrase}") and "(--framework torchtitan)" in refused.stderr
    scored = run_cli("--instance", SMALL[0], "--framework", "megatron", "--evaluate", path, "--json")
    assert scored.returncode == 0 and json.loads(scored.stdout)["estimate"]["iteration_time_s"] > 0


def test_the_finding_on_h100_128_the_megatron_plan_exported_for_torchtitan_is_refused_under_the_flag():
    """Finding 9 on its own instance: Megatron's plan of h100_128 (tp 4 pp 4 cp 2 dp 4 vpp 5, zero_stage 1, what
    `solve` prints without the flag) exported for torchtitan is mapped to FSDP, which its own note prices at more
    than twice the plan; under --framework torchtitan that placement is not in the space (zero_stage 1), and the
    placement torchtitan would run in its place is (the torchtitan search covers it)."""
    h100 = load_instance(REPO / "instances" / "h100_128.json")
    titan = load_instance(REPO / "instances" / "h100_128.json", framework="torchtitan")
    placement = default_placement(h100, tp=4, pp=4, cp=2, dp=4, vpp=5, recompute="none", zero_stage=1)
    megatron_plan = SimpleNamespace(placement=placement, estimate=evaluate(h100, placement))
    mapped = torchtitan_run(h100, megatron_plan, "0.3")
    assert "cannot run as planned" in mapped.notes[0]
    assert mapped.estimate.iteration_time_s > 2 * megatron_plan.estimate.iteration_time_s
    assert config_problem("torchtitan", titan.training.seq_length, placement)[0] == "zero_stage"
    assert mapped.placement.config in set(configurations(titan))
