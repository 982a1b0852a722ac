"""Ways to answer the planning problem. `solve(instance)` returns a `PlanResult`."""

# Loaded on first use (PEP 562): `solve` starts in solvers.outputs.entry, which must import in a blink so that a
# Ctrl-C during the heavy imports (numpy, OR-Tools, rich: seconds on a loaded machine) is an "interrupted" line and
# exit 130, not a traceback. `solve` lives in solvers/strategy.py: a submodule named solvers.solve, once imported,
# would replace the function under that name.
_LAZY = {"PlanResult": "solvers.result", "SolverReport": "solvers.result", "solve": "solvers.strategy"}

__all__ = ["PlanResult", "SolverReport", "solve"]


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'solvers' has no attribute {name!r}")
    import importlib
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value
