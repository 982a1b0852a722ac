"""The configuration space does not grow with limits that cannot bind: a micro-batch divides the replica's batch."""

from __future__ import annotations

import pytest

from conftest import build_instance, small_instance_dict
from formulation import InputError
from formulation.errors import MAX_INTEGER
from formulation.space import divisors, configurations


def test_divisors_in_order_without_scanning_up_to_n():
    assert divisors(1) == [1]
    assert divisors(36) == [1, 2, 3, 4, 6, 9, 12, 18, 36]
    assert divisors(97) == [1, 97]
    big = 2**40 * 3
    assert divisors(big)[-1] == big and len(divisors(big)) == 41 * 2


def test_a_huge_micro_batch_limit_gives_the_space_of_the_batch_itself():
    """The largest limit an instance may give (formulation.errors.MAX_INTEGER; 10**300 is an input error) is
    clipped to the batch, not enumerated."""
    capped = small_instance_dict(2, 4, global_batch_size=16)
    capped["training"]["max_micro_batch_size"] = 16
    huge = small_instance_dict(2, 4, global_batch_size=16)
    huge["training"]["max_micro_batch_size"] = MAX_INTEGER
    assert list(configurations(build_instance(huge))) == list(configurations(build_instance(capped)))
    huge["training"]["max_micro_batch_size"] = 10**300
    with pytest.raises(InputError, match="max_micro_batch_size: expected an integer <= 1,000,000,000"):
        build_instance(huge)


def test_a_placement_is_its_configuration_plus_the_map():
    """One type for the choices: a placement built from a configuration gives it back, field for field, and
    a plan file's placement round-trips through it."""
    from formulation.placement import Config, Placement
    from formulation.space import placement_for
    instance = build_instance(small_instance_dict(2, 4, global_batch_size=16))
    configs = list(configurations(instance))
    assert configs
    for config in configs:
        world = config.tp * config.pp * config.cp * config.dp
        placement = placement_for(config, (1,) * config.pp, range(world))
        assert isinstance(placement, Config) and type(placement.config) is Config
        assert placement.config == config and placement.config_key() == config.config_key()
        assert placement.describe() == config.describe()
        assert Placement.of(placement.config, placement.layers_per_stage, placement.gpus) == placement
