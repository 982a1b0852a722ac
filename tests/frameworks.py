"""The real frameworks (the `frameworks` extra) for the tests: imported or skipped, and Megatron's groups as
megatron-core itself builds them.

With LLM_PLANNER_REQUIRE_FRAMEWORKS=1 (set by .ci/run) a framework that fails to import fails the test instead of
skipping it, so CI cannot pass without having run them.
"""

from __future__ import annotations

import importlib
import os
from unittest import mock

import pytest

# Megatron-LM's group_desc of each group the plan cares about (megatron/core/parallel_state.py)
GROUP_DESCS = {"tp": "TENSOR_MODEL_PARALLEL_GROUP", "cp": "CONTEXT_PARALLEL_GROUP", "dp": "DATA_PARALLEL_GROUP",
               "dp-cp": "DATA_PARALLEL_GROUP_WITH_CP", "pp": "PIPELINE_MODEL_PARALLEL_GROUP"}
RANK_TOKENS = {"tp": "tp", "cp": "cp", "dp": "dp", "dp-cp": "dp-cp", "pp": "pp"}
EXPERT_GROUP_DESCS = {"ep": "EXPERT_MODEL_PARALLEL_GROUP", "tp": "EXPERT_TENSOR_PARALLEL_GROUP",
                      "dp": "EXPERT_DATA_PARALLEL_GROUP", "tp-ep": "EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP"}


def require(module: str):
    """Import `module`, or skip the test (fail it under LLM_PLANNER_REQUIRE_FRAMEWORKS=1)."""
    try:
        return importlib.import_module(module)
    except Exception as error:  # torchtitan fails with ImportError or RuntimeError when a dependency is missing
        if os.environ.get("LLM_PLANNER_REQUIRE_FRAMEWORKS") == "1":
            pytest.fail(f"{module} is required here (LLM_PLANNER_REQUIRE_FRAMEWORKS=1) but fails to import: {error}")
        pytest.skip(f"{module} not importable ({error}); pip install -e '.[frameworks]'")


class _RecordedGroup:
    def __init__(self, ranks, desc):
        self.ranks, self.desc = list(ranks), desc


def initialize_model_parallel_groups(tp: int, cp: int, dp: int, pp: int, ep: int = 1, etp: int | None = None,
                                     descs: dict[str, str] = GROUP_DESCS) -> dict[str, list[list[int]]]:
    """The groups megatron-core's real `initialize_model_parallel` creates, in creation order (the dense ones, or
    with `descs=EXPERT_GROUP_DESCS` the expert ones for `ep` and `etp`).

    torch.distributed is told it runs `tp*cp*dp*pp` ranks and `new_group` records its ranks and group_desc
    instead of creating a communicator; every rank creates every group, so rank 0's calls list them all.
    """
    parallel_state = require("megatron.core.parallel_state")
    dist = require("torch.distributed")
    created: list[_RecordedGroup] = []

    def new_group(ranks=None, group_desc=None, **_):
        created.append(_RecordedGroup(ranks, group_desc))
        return created[-1]

    fake = dict(is_initialized=lambda: True, get_world_size=lambda *a, **k: tp * cp * dp * pp,
                get_rank=lambda *a, **k: 0, new_group=new_group)
    with mock.patch.multiple(dist, **fake):
        parallel_state.destroy_model_parallel()
        try:
            parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                                                     context_parallel_size=cp, expert_model_parallel_size=ep,
                                                     expert_tensor_parallel_size=etp)
        finally:
            parallel_state.destroy_model_parallel()
    return {name: [g.ranks for g in created if g.desc == desc] for name, desc in descs.items()}


def rank_generator_groups(tp: int, cp: int, dp: int, pp: int) -> dict[str, list[list[int]]]:
    """The groups of megatron-core's `RankGenerator` with initialize_model_parallel's default order."""
    parallel_state = require("megatron.core.parallel_state")
    generator = parallel_state.RankGenerator(tp=tp, ep=1, dp=dp, pp=pp, cp=cp, order="tp-cp-ep-dp-pp")
    return {name: generator.get_ranks(token) for name, token in RANK_TOKENS.items()}


def rank_generator_expert_groups(etp: int, ep: int, expert_dp: int, pp: int) -> dict[str, list[list[int]]]:
    """The expert groups of megatron-core's expert `RankGenerator`, as initialize_model_parallel builds it."""
    parallel_state = require("megatron.core.parallel_state")
    generator = parallel_state.RankGenerator(tp=etp, ep=ep, dp=expert_dp, pp=pp, cp=1, order="tp-cp-ep-dp-pp")
    return {token: generator.get_ranks(token) for token in EXPERT_GROUP_DESCS}
