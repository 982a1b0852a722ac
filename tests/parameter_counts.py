"""Prints, for every model preset, the parameter counts docs/outputs.md tabulates: the planner's, the HF config's
modelling files', megatron-core's GPTModel built from the exported megatron_args.sh, and torchtitan 0.3.0's flavour of
the same shape (with the fields where it still differs). The framework tests assert the same equalities.

    PYTHONPATH=.:tests python tests/parameter_counts.py
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from formulation.inputs.model import PRESET_DIR, preset_names
from frameworks import hf_parameter_count, megatron_gpt_model, torchtitan_flavour_facts
from solvers.outputs.torchtitan import torchtitan_flavour
from test_frameworks_megatron import exported_megatron_argv


def main() -> None:
    for name in preset_names():
        model, argv = exported_megatron_argv(name, Path(tempfile.mkdtemp()))
        built = sum(p.numel() for p in megatron_gpt_model(argv)[0].parameters())
        hf = hf_parameter_count(json.loads((PRESET_DIR / f"{name}.json").read_text()))
        flavour, diffs = torchtitan_flavour(model)
        tt = torchtitan_flavour_facts(flavour.module, flavour.name)["params"] if flavour else None
        print(f"| {name} | {model.total_params:,} | {hf:,} | {built:,} | {tt and f'{flavour.name}: {tt:,}' or 'none'} "
              f"| {'equal' if len({model.total_params, hf, built} | ({tt} if tt else set())) == 1 else 'DIFFERENT'} |"
              + (f" {'; '.join(diffs)}" if flavour and diffs else ""), flush=True)


if __name__ == "__main__":
    main()
