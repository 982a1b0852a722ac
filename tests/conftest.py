"""Shared helpers: small valid instances built in memory, written to disk, and the CLI as a subprocess."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from formulation import instance_from_dict

REPO = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
H100_128 = REPO / "instances" / "h100_128.json"

SMALL_MODEL = {
    "name": "tiny-llama",
    "num_hidden_layers": 8,
    "hidden_size": 1024,
    "intermediate_size": 2816,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "vocab_size": 32000,
    "hidden_act": "silu",
}


def small_instance_dict(num_nodes: int = 2, gpus_per_node: int = 4, *, intra: float = 450.0, inter: float = 48.0,
                        global_batch_size: int = 16, seq_length: int = 2048, **network_extra) -> dict:
    """A valid instance dict: `num_nodes` x `gpus_per_node` H100s, the small llama-style model inline.

    `network_extra` is merged into `cluster.network` (e.g. node_pairs=[...], gpu_pairs=[...]).
    """
    nodes = [{"name": f"n{i}", "gpu_type": "h100-sxm-80gb", "gpus": gpus_per_node} for i in range(num_nodes)]
    network = {"intra_node_gb_per_s": intra, "inter_node_gb_per_s": inter, **network_extra}
    return {
        "name": "small",
        "description": "test instance",
        "model": copy.deepcopy(SMALL_MODEL),
        "training": {
            "global_batch_size": global_batch_size,
            "seq_length": seq_length,
            "precision": "bf16",
            "recompute": ["none", "selective", "full"],
            "zero_stage": [0, 1, 3],
            "max_micro_batch_size": 4,
            "context_parallel_sizes": [1, 2],
            "virtual_pipeline_sizes": [1, 2],
        },
        "cluster": {
            "gpu_types": {"h100-sxm-80gb": {"preset": "h100-sxm-80gb"}},
            "nodes": nodes,
            "network": network,
        },
    }


def build_instance(data: dict | None = None, file: str = "<test>", base_dir: Path | None = None):
    """`formulation.instance_from_dict` on a deep copy (the loader must not depend on the caller's dict)."""
    return instance_from_dict(copy.deepcopy(data if data is not None else small_instance_dict()), file,
                              base_dir or REPO)


def write_instance(tmp_path: Path, data: dict, name: str = "instance.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data, indent=1))
    return path


def run_solve(*args: str | Path, timeout: float = 120) -> subprocess.CompletedProcess:
    """`solve ARGS` as a subprocess (`python -m solvers.outputs.cli`), from the repository root."""
    return subprocess.run([sys.executable, "-m", "solvers.outputs.cli", *map(str, args)], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture
def small_dict() -> dict:
    return small_instance_dict()


@pytest.fixture
def small_instance():
    return build_instance()


@pytest.fixture
def instance_file(tmp_path):
    """Write a (by default small, valid) instance dict to tmp_path and return its path."""

    def write(data: dict | None = None, name: str = "instance.json") -> Path:
        return write_instance(tmp_path, data if data is not None else small_instance_dict(), name)

    return write


@pytest.fixture(scope="session")
def h100():
    """The shipped 128-GPU instance, loaded once for the whole run."""
    from formulation import load_instance
    return load_instance(H100_128)


@pytest.fixture(scope="session")
def h100_cli_run(tmp_path_factory) -> Path:
    """`solve --instance instances/h100_128.json --output-dir DIR --output DIR/cli_plan.json`, run once for the
    whole run (17 s): the plan-file tests (test_h100_128.py) and the launch-file tests (test_export.py) read it."""
    out = tmp_path_factory.mktemp("h100_cli")
    result = run_solve("--instance", H100_128, "--output-dir", out, "--output", out / "cli_plan.json", "--quiet")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return out


@pytest.fixture(scope="session")
def plan(h100):
    """`solve` of h100_128 (a few seconds), shared by the export and picture tests."""
    from solvers import solve
    return solve(h100)


class JumpingClock:
    """A stand-in for a module's `time` whose clock jumps 100 s per reading: every deadline has passed at once."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        self.now += 100.0
        return self.now
