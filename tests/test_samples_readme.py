"""The code a reader copies from the docs runs: every command of instances/samples/README.md and the Python of
README.md's Library paragraph (issue 42, finding 8: a snippet imported a module that does not exist)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

import pytest

from conftest import REPO


def _indented_blocks(text: str, after: str) -> list[str]:
    """The indented (4-space) code blocks of the paragraph that starts with `after` (up to the next heading)."""
    start = text.index(after)
    end = text.find("\n#", start)
    section = text[start:None if end < 0 else end]
    return ["\n".join(line[4:] for line in block.splitlines())
            for block in re.findall(r"(?:^    .*\n?)+", section, flags=re.MULTILINE)]


def _run(argv: list[str]) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "COLUMNS": "120"}
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300, env=env)


SAMPLE_COMMANDS = [line for block in _indented_blocks((REPO / "instances" / "samples" / "README.md").read_text(),
                                                      "# Sample") for line in block.splitlines() if line.strip()]


def test_the_samples_readme_has_commands():
    assert len(SAMPLE_COMMANDS) >= 3 and all(c.split()[0] in ("solve", "python") for c in SAMPLE_COMMANDS)


@pytest.mark.parametrize("command", SAMPLE_COMMANDS)
def test_every_command_of_the_samples_readme_runs(command):
    argv = shlex.split(command)
    argv = ([sys.executable, "-m", "solvers.outputs.cli", *argv[1:]] if argv[0] == "solve"
            else [sys.executable, *argv[1:]])
    result = _run(argv)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() and "Traceback" not in result.stderr
    if "mixtral" in command:  # the README says the mixture-of-experts config is read, with its experts
        assert "8 experts" in result.stdout and "2 per token" in result.stdout


def test_the_library_snippet_of_the_readme_runs():
    blocks = _indented_blocks((REPO / "README.md").read_text(), "Library:")
    code = next(b for b in blocks if "import formulation" in b)
    result = _run([sys.executable, "-c", code])
    assert result.returncode == 0, result.stderr
    dict_time, peak, (describe, plan_time, status) = (result.stdout.splitlines()[0], result.stdout.splitlines()[1],
                                                      result.stdout.splitlines()[2].rsplit(" ", 2))
    assert float(dict_time) > 0 and 0 < float(peak) < 80 and status == "feasible"
    assert float(plan_time) <= float(dict_time)  # the baseline sweep covers tp 8 pp 4
