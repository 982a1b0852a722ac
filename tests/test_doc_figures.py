"""The figures and tables of README.md and docs/ that the code produces (docs/figures/render.py): the cheap ones
regenerate to exactly what the documents hold (the slow suite does the same for the slow ones, a leave-one-source-out
run), the expensive and recorded ones name the command and an existing commit that made them, a block that differs
from its generator is caught, and the reference documents carry no diary (dates, session numbers)."""

from __future__ import annotations

import importlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RENDER = ROOT / "docs" / "figures" / "render.py"

# The documents that describe the current model and its evidence (docs/figures/ writes their generated blocks).
REFERENCE_DOCS = ["docs/validation.md", "docs/physics.md", "docs/search-beyond-exact.md", "docs/model.md",
                  "docs/moe.md", "docs/programs.md", "docs/mixed-gpu-types.md", "docs/links.md"]
DIARY = re.compile(r"\b20\d\d-\d\d-\d\d\b|\b[Ss]ession\b|\b(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|"
                   r"tenth|eleventh|twelfth|thirteenth|fourteenth|fifteenth|sixteenth|seventeenth) session\b")


@pytest.fixture(scope="module")
def render():
    if str(RENDER.parent) not in sys.path:
        sys.path.insert(0, str(RENDER.parent))  # docs/figures/ is a folder of scripts, not a package
    return importlib.import_module("render")


def copy_docs(tmp_path: Path) -> Path:
    (tmp_path / "docs").mkdir()
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    for doc in (ROOT / "docs").glob("*.md"):
        shutil.copy(doc, tmp_path / "docs" / doc.name)
    return tmp_path


def test_cheap_figures_match_their_generators(render):
    assert render.render(costs=("cheap",), check=True) == []


@pytest.mark.slow
def test_slow_figures_match_their_generators(render):
    """The tables of a leave-one-source-out run (about a minute on 2 cores, more on a busy machine)."""
    assert render.render(costs=("slow",), check=True) == []


def test_every_kind_of_figure_is_placed(render):
    figures = render.discover()
    assert {f.cost for f in figures.values()} == {"cheap", "slow", "expensive", "recorded"}
    for fig in figures.values():
        names = [m["name"] for m in render.blocks((ROOT / fig.doc).read_text())]
        assert names.count(fig.name) == 1, f"{fig.doc}: figure {fig.name}"


def test_a_changed_block_is_caught_and_rewritten(render, tmp_path):
    root = copy_docs(tmp_path)
    model = root / "docs" / "model.md"
    text = model.read_text()
    changed = text.replace("| `h100-sxm-80gb` | 79.6 | 989 |", "| `h100-sxm-80gb` | 79.6 | 999 |")
    assert changed != text
    model.write_text(changed)
    problems = [p for p in render.render(["gpu-catalog"], check=True, root=root) if "gpu-catalog" in p]
    assert len(problems) == 1 and "figure gpu-catalog differs" in problems[0]
    assert "+| `h100-sxm-80gb` | 79.6 | 989 |" in problems[0]
    render.render(["gpu-catalog"], root=root)  # rewritten in place
    assert model.read_text() == text


def test_a_recorded_block_must_keep_its_command_and_commit(render, tmp_path):
    root = copy_docs(tmp_path)
    doc = root / "docs" / "validation.md"
    text = doc.read_text()
    doc.write_text(text.replace("(at commit 3a218b3).", "(at commit 1234567)."))
    problems = render.render(costs=(), check=True, root=root)
    assert [p for p in problems if "vendor-configs" in p], problems
    doc.write_text(text.replace("<!-- figure: vendor-configs -->", "<!-- figure: vendor-configs-renamed -->"))
    problems = render.render(costs=(), check=True, root=root)
    assert any("no block for figure vendor-configs" in p for p in problems)
    assert any("vendor-configs-renamed names no figure" in p for p in problems)


def test_stamped_commits_exist(render):
    """Every commit an expensive or recorded block names is a commit of this repository."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    stamped = set()
    for fig in render.discover().values():
        if fig.cost in ("expensive", "recorded"):
            match = next(m for m in render.blocks((ROOT / fig.doc).read_text()) if m["name"] == fig.name)
            lines = match["body"].splitlines()
            stamp = render.STAMP.match(lines[0]) if lines else None
            assert stamp, f"{fig.doc}: figure {fig.name} names no command and commit"
            stamped.add(stamp["commit"].rstrip("+"))
    assert stamped
    for commit in sorted(stamped):
        done = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True)
        assert done.returncode == 0, f"no commit {commit}"


@pytest.mark.parametrize("doc", REFERENCE_DOCS)
def test_reference_docs_carry_no_diary(doc):
    hits = [f"{doc}:{i}: {line.strip()}" for i, line in enumerate((ROOT / doc).read_text().splitlines(), 1)
            if DIARY.search(line)]
    assert hits == []
