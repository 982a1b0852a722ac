"""The `solve` command's entry point: the CLI's imports (seconds on a loaded machine) under a Ctrl-C guard, so that
an interrupt before the CLI runs is one line and exit code 130 like any other interrupt before a plan exists."""

from __future__ import annotations

import sys

EXIT_INTERRUPTED = 130


def main(argv: list[str] | None = None) -> None:
    try:
        from solvers.outputs.cli import main as cli_main
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
    cli_main(argv)


if __name__ == "__main__":
    main()
