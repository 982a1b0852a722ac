"""The `solve` command's entry point: the CLI's imports (seconds on a loaded machine) under a Ctrl-C guard, so that
an interrupt before the CLI runs is one line and exit code 130 like any other interrupt before a plan exists; and
an exit that does not wait for a CP-SAT solve given up at the time limit."""

from __future__ import annotations

import os
import sys
import threading

EXIT_INTERRUPTED = 130


def main(argv: list[str] | None = None) -> None:
    try:
        from solvers.outputs.cli import main as cli_main
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
    try:
        cli_main(argv)
    except SystemExit as stop:
        _exit_now_if_a_solve_runs_on(stop.code)
        raise


def _exit_now_if_a_solve_runs_on(code) -> None:
    """A CP-SAT solve given up at its limit (solvers/backends/cpsat.py) runs on in its daemon thread, and the
    interpreter's teardown waited for it (seed 6 of tests/test_exact.py: the plan printed at 10 s, the shell got
    its prompt back at 23 s): a time limit is a promise, so once every output is written, exit at once."""
    if not any(t.name == "cp-sat" and t.is_alive() for t in threading.enumerate()):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code if isinstance(code, int) else (0 if code is None else 1))


if __name__ == "__main__":
    main()
