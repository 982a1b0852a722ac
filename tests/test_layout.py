"""The house rules of docs/layout.md, checked on the source: one-way imports, no private names across modules,
and a module list that matches the tree."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from conftest import REPO

PACKAGES = ("formulation", "solvers")
# A room of solvers/ may import rooms of its own level or below, never above (docs/layout.md).
SOLVER_LEVELS = {"result": 0, "backends": 0, "bounds": 1, "local": 1, "search": 2, "solve": 3, "strategy": 3, "__init__": 3,
                 "outputs": 4, "validation": 4, "sweep": 4}


def _modules() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (REPO / package).rglob("*.py"))


def _imports(path: Path) -> list[ast.ImportFrom | ast.Import]:
    return [node for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, (ast.Import, ast.ImportFrom))]


def _imported_modules(node) -> list[str]:
    if isinstance(node, ast.ImportFrom):  # `from solvers import backends` imports the room solvers.backends
        return ([f"{node.module}.{alias.name}" for alias in node.names] if node.module in PACKAGES
                else [node.module or ""])
    return [alias.name for alias in node.names]


def _room(module: str) -> str:
    """solvers.search.uniform -> search; solvers.strategy -> strategy; solvers -> __init__."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_formulation_never_imports_solvers():
    offenders = [f"{p.relative_to(REPO)}: {m}" for p in _modules() if p.relative_to(REPO).parts[0] == "formulation"
                 for node in _imports(p) for m in _imported_modules(node) if m.split(".")[0] == "solvers"]
    assert offenders == []


def test_solver_rooms_import_only_downwards():
    offenders = []
    for path in _modules():
        rel = path.relative_to(REPO)
        if rel.parts[0] != "solvers":
            continue
        own = _room(".".join(rel.with_suffix("").parts))
        for node in _imports(path):
            for module in _imported_modules(node):
                if module.split(".")[0] == "solvers" and SOLVER_LEVELS.get(_room(module), 3) > SOLVER_LEVELS[own]:
                    offenders.append(f"{rel} ({own}) imports {module}")
    assert offenders == []


def test_no_private_name_is_imported_across_modules():
    offenders = [f"{p.relative_to(REPO)}: {node.module}.{alias.name}" for p in _modules() for node in _imports(p)
                 if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in PACKAGES
                 for alias in node.names if alias.name.startswith("_") and not alias.name.startswith("__")]
    assert offenders == []


def test_layout_doc_lists_every_module_and_only_modules():
    listed = set(re.findall(r"^((?:formulation|solvers)/\S+\.py)\s", (REPO / "docs" / "layout.md").read_text(),
                            flags=re.M))
    present = {str(p.relative_to(REPO)) for p in _modules()}
    assert sorted(present - listed) == [], "modules missing from docs/layout.md"
    assert sorted(listed - present) == [], "docs/layout.md names modules that do not exist"


def test_no_function_over_60_lines_outside_the_program_builders():
    """Issue 13's rule: long functions only where a program is written constraint family by family."""
    offenders = []
    for path in _modules():
        rel = path.relative_to(REPO)
        if rel.parts[:2] == ("formulation", "programs"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 60:
                offenders.append(f"{rel}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)")
    assert offenders == []
