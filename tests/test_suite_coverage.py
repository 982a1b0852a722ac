"""The test suite's own coverage rule: the brute-force families split their (seed, backend) pairs between the
quick suite and the slow checks (conftest.seeds_by_backend) without losing a seed or a backend."""

from __future__ import annotations

from conftest import AVAILABLE_BACKENDS, seeds_by_backend


def test_quick_suite_checks_every_seed_with_one_backend_and_every_backend_somewhere():
    """conftest.seeds_by_backend, which the brute-force families use: the quick suite checks each seed (but a
    slow-only one) with exactly one backend, every backend meets some seed there, and every (seed, backend)
    pair runs with the slow checks: each family keeps, in the quick suite, a brute-force check of every seed and of
    every backend."""
    seeds, slow_only = [3, 4, 5, 6, 7], (5,)
    params = seeds_by_backend(seeds, slow_seeds=slow_only)
    quick = [p.values for p in params if not any(mark.name == "slow" for mark in p.marks)]
    assert sorted(p.values for p in params) == sorted((s, b) for s in seeds for b in AVAILABLE_BACKENDS)
    assert sorted(s for s, _ in quick) == [s for s in seeds if s not in slow_only]
    assert {b for _, b in quick} == set(AVAILABLE_BACKENDS)
