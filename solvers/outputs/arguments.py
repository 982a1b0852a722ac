"""Command-line parsing shared by `solve` and its subcommands: a parser whose errors are one line, as every
other error of the tool is (argparse prints its usage block first), checks of the numeric flags, and the exit
codes with the one line each planning failure prints."""

from __future__ import annotations

import argparse
import math
import sys

from formulation.inputs.frameworks import FRAMEWORKS

EXIT_OK, EXIT_INFEASIBLE, EXIT_BAD_INPUT = 0, 1, 2

# CP-SAT and numpy take a 32-bit signed seed
MAX_SEED = 2**31 - 1


class OneLineParser(argparse.ArgumentParser):
    """argparse, with a bad flag reported as `prog: error: message (see prog --help)` and exit code 2."""

    def error(self, message: str):
        print(f"{self.prog}: error: {message} (see {self.prog} --help)".replace("\n", " "), file=sys.stderr)
        sys.exit(2)


def seconds(text: str) -> float:
    """A positive, finite number of seconds (argparse type)."""
    value = float(text)
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def count(text: str) -> int:
    """A positive whole number (argparse type)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def seed(text: str) -> int:
    """A seed in 0 .. 2^31 - 1 (argparse type)."""
    value = int(text)
    if not 0 <= value <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"expected an integer in 0 .. {MAX_SEED}, got {text!r}")
    return value


def add_framework_option(parser: argparse.ArgumentParser) -> None:
    """--framework megatron|torchtitan: plan for the framework the plan is launched with."""
    parser.add_argument("--framework", default=None, choices=FRAMEWORKS,
                        help="plan for the framework you launch: its software stack (calibrated efficiencies and "
                             "behaviours) and only the decisions it runs (torchtitan: FSDP2 as zero_stage 3, replicate "
                             "only without tp, pp or cp), so that the plan and its launch files agree; an instance "
                             "naming another software_stack is an error. Default: the instance's stack (megatron if "
                             "unset), Megatron-LM's decisions")


def fail(code: int, message: str) -> int:
    """Print `message` as one line on stderr and return the exit `code`."""
    print(message.replace("\n", " "), file=sys.stderr)
    return code


def planning_failure(exc: Exception) -> int:
    """The exit of a search that raised InputError (2: bad input), InfeasibleError (1: no plan fits) or
    NoPlanInTime (1: none within the time limit), printed as the one line the user reads."""
    from formulation import InputError, InfeasibleError

    if isinstance(exc, InputError):
        return fail(EXIT_BAD_INPUT, f"error: {exc}")
    if isinstance(exc, InfeasibleError):
        return fail(EXIT_INFEASIBLE, f"infeasible: {exc}")
    return fail(EXIT_INFEASIBLE, f"timeout: {exc}")


def write_plan_file(path: str, plan: dict) -> int | None:
    """Write the plan atomically; the exit code of a path that cannot be written, None when written."""
    from solvers.outputs.files import write_json_atomic

    try:
        write_json_atomic(path, plan)
    except OSError as exc:
        return fail(EXIT_BAD_INPUT, f"error: {path}: cannot write: {exc.strerror or exc}")
    return None
