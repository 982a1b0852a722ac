"""Named model terms that can be switched off, so that cross-source validation can ablate them.

A term is a piece of physics in the cost or memory model (for example a per-iteration fixed overhead or an
overlap-contention factor). The module that implements it registers it once, at import:

    FIXED_OVERHEAD = terms.register("iteration_overhead", "fixed per-iteration cost (launch, loader, sync)")

and gates its contribution with `terms.enabled(FIXED_OVERHEAD)`. `solve validate --ablation` re-runs the
leave-one-source-out protocol with each registered term disabled (`with terms.disabled(name): ...`), refitting
everything that is fitted, and prints the pooled error with the term on and off.

Disabling a term must leave a valid, self-consistent model (the programs read the same gates), so a term's
"off" value is the model without it, never an invalid state.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

# name -> one-line description; insertion order is the order the ablation table prints.
TERMS: dict[str, str] = {}
_DISABLED: set[str] = set()


def register(name: str, description: str) -> str:
    """Declare a term (idempotent); returns the name so modules can keep it as a constant."""
    TERMS.setdefault(name, description)
    return name


def enabled(name: str) -> bool:
    return name not in _DISABLED


def disabled_terms() -> frozenset[str]:
    """The current switch state; part of any cache key over model outputs."""
    return frozenset(_DISABLED)


@contextmanager
def disabled(*names: str) -> Iterator[None]:
    """Switch the named terms off inside the block (unknown names are an error: a typo must not pass silently)."""
    unknown = [n for n in names if n not in TERMS]
    if unknown:
        raise KeyError(f"unknown model term(s) {unknown}; registered: {sorted(TERMS)}")
    before = set(_DISABLED)
    _DISABLED.update(names)
    try:
        yield
    finally:
        _DISABLED.clear()
        _DISABLED.update(before)
