"""The command line's own inputs: bad flags and output paths get one line and exit code 2 (argparse printed its
usage block first; an unwritable --output was an internal error after the solve), and an instance path that is
a device or a pipe is refused, not read. Found by fuzzing the CLI (2026-11-27)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import H100_128, REPO
from test_malformed_inputs import run_cli


@pytest.mark.parametrize("flags, phrase", [
    (("--time-limit", "nan"), "argument --time-limit: expected a positive number of seconds, got 'nan'"),
    (("--time-limit", "abc"), "argument --time-limit: invalid seconds value: 'abc'"),
    (("--threads", "0"), "argument --threads: expected a positive integer, got '0'"),
    (("--seed", str(2**70)), "argument --seed: expected an integer in 0 .. 2147483647"),  # crashed CP-SAT
    (("--top", "0"), "argument --top: expected a positive integer, got '0'"),
    (("--bogus",), "unrecognized arguments: --bogus"),
])
def test_bad_flags_get_one_line_and_exit_code_2(flags, phrase):
    """argparse's own errors are one line too (it printed its usage block first), and every numeric flag is
    checked before anything runs."""
    result = run_cli("--instance", H100_128, *flags)
    assert result.returncode == 2 and result.stdout == ""
    assert len(result.stderr.splitlines()) == 1 and phrase in result.stderr, result.stderr


def test_an_output_path_that_is_a_directory_is_refused_before_solving(tmp_path, monkeypatch):
    from solvers.outputs import cli
    solved = []
    monkeypatch.setattr(cli, "solve", lambda *a, **k: solved.append(1))  # h100_128 takes 15 s to solve
    result = run_cli("--instance", H100_128, "--output", tmp_path)
    assert result.returncode == 2 and result.stderr.strip() == f"--output: {tmp_path} is a directory; expected the " \
                                                               "plan file's path"
    assert solved == []  # refused before the search started


def test_an_unwritable_output_is_one_line_not_a_crash(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = run_cli("--instance", REPO / "instances" / "small_2x4.json", "--method", "baseline",
                     "--output", blocker / "plan.json")
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith(f"error: {blocker / 'plan.json'}: cannot write:")


def test_a_device_or_pipe_is_not_read_as_an_instance(tmp_path):
    import os
    pipe = tmp_path / "pipe.json"
    os.mkfifo(pipe)
    for path in (pipe, Path("/dev/zero")):
        result = run_cli("--instance", path)
        assert result.returncode == 2
        assert result.stderr.strip() == f"error: {path}: <root>: expected a regular file, got a device, pipe or socket"
