"""Writes tests/megatron_lm_flags.json: every option of Megatron-LM's own argument parser (`add_megatron_arguments`
of megatron/training/arguments.py, tag core_v0.16.1, which the megatron-core wheel does not ship), with its dest,
action, type, nargs and default, so that the tests read the exported arguments as pretrain_gpt.py would.

    git clone https://github.com/NVIDIA/Megatron-LM && git -C Megatron-LM checkout core_v0.16.1
    PYTHONPATH=Megatron-LM python tests/megatron_lm_flags.py   # megatron-core 0.16.1 installed

(Megatron-LM's tokenizer modules import `six` and `regex`, which argument parsing never uses: stubbed if absent.)
"""

from __future__ import annotations

import argparse
import json
import sys
import types
from pathlib import Path

OUT = Path(__file__).with_name("megatron_lm_flags.json")


def _parser() -> argparse.ArgumentParser:
    for name in ("six", "regex"):
        try:
            __import__(name)
        except ImportError:
            sys.modules[name] = types.ModuleType(name)
    from megatron.training.arguments import add_megatron_arguments
    return add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))


def _jsonable(value):
    try:
        json.dumps(value)
        return value
    except TypeError:
        return repr(value)


def main() -> None:
    options = {}
    for action in _parser()._actions:
        kind = type(action).__name__.lstrip("_").replace("Action", "").lower()  # store, storetrue, storefalse, ...
        entry = {"dest": action.dest, "action": kind, "nargs": action.nargs,
                 "type": getattr(action.type, "__name__", None), "default": _jsonable(action.default)}
        if kind == "storeconst":
            entry["const"] = _jsonable(action.const)
        for flag in action.option_strings:
            options[flag] = entry
    OUT.write_text(json.dumps({"source": "Megatron-LM core_v0.16.1 megatron/training/arguments.py",
                               "options": dict(sorted(options.items()))}, indent=0) + "\n")
    print(f"{OUT}: {len(options)} options")


if __name__ == "__main__":
    main()
