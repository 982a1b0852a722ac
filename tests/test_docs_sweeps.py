"""docs/sweeps.md's table of the shipped sweep is what the code gives: docs/figures/sweeps.py evaluates the stored
placements of that sweep with the current model (the search itself, 60 s per cell, is stored with its command and
commit), and this test fails on any difference, so a change of the cost model, the calibration or the MFU ceilings
cannot leave the page behind."""

from __future__ import annotations

import importlib.util
import json

from conftest import REPO


def _figure():
    spec = importlib.util.spec_from_file_location("docs_figures_sweeps", REPO / "docs" / "figures" / "sweeps.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_sweeps_table_is_regenerated_from_the_stored_plans():
    figure = _figure()
    stored = json.loads(figure.STORED.read_text())
    assert stored["command"].startswith("solve sweep instances/sweeps/llama31_70b_15t.yaml") and stored["commit"]
    block = figure.render(stored)
    text = figure.DOC.read_text()
    assert figure.replace_block(text, block) == text, "docs/sweeps.md is stale: run python docs/figures/sweeps.py"


def test_the_table_marks_exactly_the_cells_above_their_published_mfu_ceiling():
    """Each row names the ceiling it was checked against (the highest 16-bit dense MFU published for the chip: the
    H200 takes the H100 SXM's), and the page marks and lists exactly the rows the sweep flags."""
    from formulation.mfu_ceiling import ceilings
    figure = _figure()
    stored = json.loads(figure.STORED.read_text())
    rows = figure.rows(stored)
    ceiling = ceilings().best("h100-sxm-80gb", "16-bit", "dense")
    assert len(rows) == 8 and all(r["mfu_ceiling"] == ceiling.mfu for r in rows)
    flagged = [r for r in rows if r["mfu_above_published"]]
    block = figure.render(stored)
    assert block.count("**above**") == len(flagged)
    tolerance = f"{100 * ceilings().tolerance:.0f}%"
    assert f"Cells above their ceiling (by more than the table's {tolerance} tolerance): {len(flagged)} of 8" in block
    for r in flagged:
        assert f"{r['gpus']} {r['gpu_type']} ({100 * r['mfu']:.1f}%)" in block
