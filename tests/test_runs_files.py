"""A user's runs CSV (`solve validate --runs`, `solve calibrate --runs`) is read as strictly as an instance: a bad
file or cell is one line naming the file, the row or header, and the column, with exit code 2; rows that
cannot be scored are named with their reason. Each case below was found by fuzzing the CLI (2026-11-27): it
crashed, printed a bare KeyError, or exited 0 with an empty table."""

from __future__ import annotations

import contextlib
import csv
import io
from pathlib import Path

import pytest

from formulation.data import REFERENCE_DIR
from solvers.validation import validate

# Korthikanti et al.'s first three runs: quick to score
HEADER, *ROWS = list(csv.reader((REFERENCE_DIR / "published_runs.csv").read_text(encoding="utf-8").splitlines()))
KORTHIKANTI = [r for r in ROWS if r[0].startswith("Korthikanti")][:3]


def write_runs(path: Path, header: list[str], rows: list[list[str]], prefix: bytes = b"") -> Path:
    text = io.StringIO()
    csv.writer(text).writerows([header, *rows])
    path.write_bytes(prefix + text.getvalue().encode("utf-8"))
    return path


def with_cell(column: str, value: str, rows=None) -> list[list[str]]:
    k = HEADER.index(column)
    return [r[:k] + [value] + r[k + 1:] for r in (rows or KORTHIKANTI)]


def validate_cli(*argv, command: str = "validate") -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = validate.main(command, [str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def test_a_valid_file_with_a_byte_order_mark_is_read(tmp_path):
    """Spreadsheets save CSV with a UTF-8 byte-order mark; the first column kept it in its name ('source' was
    then missing)."""
    code, out, _ = validate_cli("--runs", write_runs(tmp_path / "bom.csv", HEADER, KORTHIKANTI, b"\xef\xbb\xbf"))
    assert code == 0 and "pooled" in out


@pytest.mark.parametrize("case, phrase", [
    ("missing column", "<header>: missing columns: tp;"),
    ("nan time", "row 0: column iter_s: expected a finite number >= 0, got 'nan'"),
    ("inf time", "row 0: column iter_s: expected a finite number >= 0, got 'inf'"),
    ("text in a number", "row 0: column layers: expected a finite number >= 0, got 'many'"),
    ("gpus_per_node 0", "row 0: column gpus_per_node: expected a positive whole number, got 0"),
    ("empty file", "<header>: empty file: expected a header line"),
    ("no row scores", "<rows>: no run can be scored (3 rows: row 0: cannot build the model"),
])
def test_a_bad_runs_file_is_one_line_naming_row_and_column(tmp_path, case, phrase):
    path = tmp_path / "runs.csv"
    if case == "missing column":
        k = HEADER.index("tp")
        write_runs(path, HEADER[:k] + HEADER[k + 1:], [r[:k] + r[k + 1:] for r in KORTHIKANTI])
    elif case == "empty file":
        path.write_text("")
    else:
        column, value = {"nan time": ("iter_s", "nan"), "inf time": ("iter_s", "inf"),
                         "text in a number": ("layers", "many"), "gpus_per_node 0": ("gpus_per_node", "0"),
                         "no row scores": ("gpu_type", "h999")}[case]
        write_runs(path, HEADER, with_cell(column, value))
    for command in ("validate", "calibrate"):
        code, out, err = validate_cli("--runs", path, *(["--output", tmp_path / "cal.json"] if command ==
                                                        "calibrate" else []), command=command)
        assert code == 2 and out == "" and len(err.splitlines()) == 1, err
        assert err.startswith(f"error: {path}: ") and phrase in err, err


def test_rows_that_cannot_be_scored_are_named_with_their_reason(tmp_path):
    rows = KORTHIKANTI[:2] + with_cell("precision", "fp3", KORTHIKANTI[2:])
    code, out, err = validate_cli("--runs", write_runs(tmp_path / "runs.csv", HEADER, rows))
    assert code == 0 and "pooled" in out
    assert "row 2 not scored: precision fp3 is not modelled yet" in err


@pytest.mark.parametrize("target", ["/dev/null", "fifo"])
def test_a_runs_path_that_is_no_regular_file(tmp_path, target):
    import os
    path = Path(target) if target.startswith("/") else tmp_path / target
    if target == "fifo":
        os.mkfifo(path)
    code, _, err = validate_cli("--runs", path)
    assert code == 2 and err.strip() == f"error: {path}: <root>: expected a regular file, got a device, pipe or socket"


def test_outputs_that_are_directories_are_refused_before_the_work(tmp_path):
    runs = write_runs(tmp_path / "runs.csv", HEADER, KORTHIKANTI)
    code, out, err = validate_cli("--runs", runs, "--rows", "--plot", tmp_path)
    assert code == 2 and out == "" and err.strip() == f"error: --plot: {tmp_path} is a directory; expected a file path"
    code, out, err = validate_cli("--runs", runs, "--output", tmp_path, command="calibrate")
    assert code == 2 and err.strip() == f"error: --output: {tmp_path} is a directory; expected a file path"


def test_an_nvlink_domain_column_declares_racks_and_a_size_that_does_not_tile_is_one_line(tmp_path):
    """`nvlink_domain_gpus` (docs/validation.md) cuts a run's nodes into NVLink domains; a size that is not whole
    nodes or does not divide the run's nodes names the row and the column."""
    from solvers.validation.runs import load_runs
    header = HEADER + ["nvlink_domain_gpus"]
    k = HEADER.index("gpus_per_node")
    trays = [r[:k] + ["4"] + r[k + 1:] + ["8"] for r in KORTHIKANTI]  # 4-GPU nodes, two to a domain
    runs = load_runs(write_runs(tmp_path / "racks.csv", header, trays))
    for run in runs:
        nodes = len(run.instance.cluster.nodes)
        assert run.skipped_reason is None and nodes == run.placement.world_size // 4 > 1
        assert run.instance.cluster.domain_of_node == tuple(n // 2 for n in range(nodes))
    path = write_runs(tmp_path / "bad.csv", header, [r[:-1] + ["6"] for r in trays])
    code, out, err = validate_cli("--runs", path)
    assert code == 2 and out == "" and len(err.splitlines()) == 1, err
    assert err.startswith(f"error: {path}: row 0: column nvlink_domain_gpus: 6 GPUs per domain"), err
