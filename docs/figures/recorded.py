"""Figures copied from the output of commands too long to run in a test (minutes of fits, benchmarks on a shared
machine): each block carries its command and the commit it ran at, and render.py --check holds the block to them.
Re-running one: run the command at a new commit, paste its figures into the block, and update the commit here."""

from registry import recorded

# docs/validation.md
recorded("fewshot-rules-by-runs", "docs/validation.md", "python docs/fewshot_pairs.py", "6fa2ce3")
recorded("fewshot-every-pair", "docs/validation.md", "python docs/fewshot_pairs.py --per-cluster", "6ff3680")
recorded("fewshot-disagreement", "docs/validation.md", "python docs/fewshot_pairs.py --disagreement", "b66c361")
recorded("vendor-configs", "docs/validation.md", "python docs/vendor_configs.py", "3a218b3")

# docs/physics.md
recorded("fixed-parameter-sensitivity", "docs/physics.md",
         "solve validate, with efficiency_half_gflop and attention_efficiency changed in gpu_types.json", "fe03747")
