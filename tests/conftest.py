"""Shared helpers: small valid instances built in memory, written to disk, and the CLI as a subprocess."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from formulation import instance_from_dict
from solvers import backends

REPO = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
H100_128 = REPO / "instances" / "h100_128.json"

AVAILABLE_BACKENDS = backends.available()


def _installed(name: str):
    return pytest.mark.skipif(not AVAILABLE_BACKENDS[name], reason=f"{name} not installed")


# every backend as a test parameter, skipped only where it is not installed
ALL_BACKENDS = [pytest.param(name, marks=_installed(name)) for name in AVAILABLE_BACKENDS]


def seeds_by_backend(seeds, slow_seeds=()) -> list:
    """(seed, backend) parameters of a brute-force family: every pair runs with the slow checks; the quick suite
    checks every seed against brute force with one backend, taken in turn (the seed's position modulo the number
    of backends), so that each backend meets its share of the seeds there and the pair count, not the seed count,
    is what halves. A seed in `slow_seeds` runs with the slow checks only. A backend is skipped only where it is
    not installed."""
    names = list(AVAILABLE_BACKENDS)
    params = []
    for position, seed in enumerate(seeds):
        for k, name in enumerate(names):
            marks = [_installed(name)]
            if seed in slow_seeds or k != position % len(names):
                marks.append(pytest.mark.slow)
            params.append(pytest.param(seed, name, marks=marks, id=f"{seed}-{name}"))
    return params


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


def run_solve(*args: str | Path, timeout: float = 1200) -> subprocess.CompletedProcess:
    """`solve ARGS` as a subprocess (`python -m solvers.outputs.entry`, as the console script runs it), from the
    repository root. The timeout only guards against a hang: a loaded machine may take many times the idle time."""
    return subprocess.run([sys.executable, "-m", "solvers.outputs.entry", *map(str, args)], cwd=REPO, capture_output=True,
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
def _h100_cli_solve(tmp_path_factory) -> tuple[Path, object]:
    """`solve --instance instances/h100_128.json --output-dir DIR --output DIR/cli_plan.json --quiet` through the
    CLI's entry point, in this process, once for the whole run (15 s): what it wrote, and the result it wrote it
    from. One solve serves the plan-file tests, the launch-file tests and every test of the solved plan (they
    were two solves of the same instance). The console-script process itself runs in .ci/run's smoke step and
    in test_malformed_inputs (the process answers as the in-process CLI does)."""
    from solvers.outputs import cli
    out = tmp_path_factory.mktemp("h100_cli")
    results = []
    real_solve = cli.solve

    def recording(*args, **kwargs):
        results.append(real_solve(*args, **kwargs))
        return results[-1]

    with pytest.MonkeyPatch.context() as patch, pytest.raises(SystemExit) as stop:
        patch.setattr(cli, "solve", recording)
        cli.main(["--instance", str(H100_128), "--output-dir", str(out), "--output", str(out / "cli_plan.json"),
                  "--quiet"])
    assert stop.value.code == 0
    assert len(results) == 1
    return out, results[0]


@pytest.fixture(scope="session")
def h100_cli_run(_h100_cli_solve) -> Path:
    """The folder the CLI wrote h100_128's plan and launch files to (cli_plan.json among them)."""
    return _h100_cli_solve[0]


@pytest.fixture(scope="session")
def plan(_h100_cli_solve):
    """The solved plan of h100_128 behind those files, shared by the export, picture and framework tests."""
    return _h100_cli_solve[1]


class JumpingClock:
    """A stand-in for a module's `time` whose clock moves `step_s` per reading, whatever the machine's load: by
    default 100 s, so that every deadline has passed at once."""

    def __init__(self, step_s: float = 100.0):
        self.now, self.step_s = 0.0, step_s

    def perf_counter(self) -> float:
        self.now += self.step_s
        return self.now


@pytest.fixture(scope="session", autouse=True)
def _cp_sat_solves_given_up_end_before_the_process():
    """A CP-SAT solve given up at its time limit (tests/test_exact.py's stalled seed 6) runs on in its daemon
    thread until it ends by itself; a process that exits before then dies in OR-Tools' teardown ("terminate called
    without an active exception", exit 134) after every test passed. Wait for such threads at the end."""
    yield
    import threading
    for thread in threading.enumerate():
        if thread.name == "cp-sat" and thread.daemon:
            thread.join(120)


class Stall:
    """A stand-in for CpSolver.Solve that blocks until released (at most 10 minutes): a test can tell, whatever
    the machine's load, that its caller returned while the solve was still running."""

    def __init__(self, code):
        self.code, self.go, self.done = code, threading.Event(), threading.Event()

    def __call__(self, *args, **kwargs):  # set on the class, an instance is not bound: (model, ...) only
        self.go.wait(600)
        self.done.set()
        return self.code

    def still_running(self) -> bool:
        return not self.done.is_set()

    def release(self) -> None:
        self.go.set()
