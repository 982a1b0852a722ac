"""Figures copied from the output of commands too long to run in a test (minutes of fits, benchmarks on a shared
machine): each block carries its command and the commit it ran at, and render.py --check holds the block to them.
Re-running one: run the command at a new commit, paste its figures into the block, and update the commit here."""

from registry import recorded

# docs/validation.md
recorded("fewshot-rules-by-runs", "docs/validation.md", "python docs/fewshot_pairs.py", "32ee563")
recorded("fewshot-every-pair", "docs/validation.md", "python docs/fewshot_pairs.py --per-cluster", "32ee563")
recorded("fewshot-disagreement", "docs/validation.md", "python docs/fewshot_pairs.py --disagreement", "b66c361")
recorded("vendor-configs", "docs/validation.md", "python docs/vendor_configs.py", "3a218b3")
SIZE_TREND = "solve validate --json > v.json && python docs/size_trend.py v.json"
recorded("size-trend", "docs/validation.md", SIZE_TREND, "9344eb2")
recorded("size-trend-pair", "docs/validation.md", SIZE_TREND, "9344eb2")
recorded("size-trend-megatron-efficiency", "docs/validation.md", SIZE_TREND, "9344eb2")

# docs/physics.md
recorded("fixed-parameter-sensitivity", "docs/physics.md",
         "solve validate, with efficiency_half_gflop and attention_efficiency changed in gpu_types.json", "fe03747")

# docs/search-beyond-exact.md
recorded("bench-irregular", "docs/search-beyond-exact.md", "solve bench --family irregular --seeds 3 --budget 60", "793f4b1")
recorded("bench-node-matrix", "docs/search-beyond-exact.md",
         "solve bench --family node-matrix --seeds 3 --budget 10 (and --budget 60)", "548950b")
recorded("node-sa-t0-rule", "docs/search-beyond-exact.md",
         "solve bench --family node-matrix --seeds 3 (node-SA with either T0 rule)", "62c78a2")

# docs/mixed-gpu-types.md
recorded("bench-mixed", "docs/mixed-gpu-types.md", "solve bench --mixed --seeds 3", "c24b0ad")
recorded("mixed-bounds", "docs/mixed-gpu-types.md",
         "solve --instance instances/X.json --time-limit 60 (X in a100_h100_64, mixed_256, mixtral_8x7b_a100_h100_64), "
         "two runs each, at 32ee563 (before) and here (after)", "f753757")
