"""The terminal, report.html and the plan file say the same thing (issue 42, findings 5-7): report.html carries
every line and table cell the terminal prints, memory parts add up to their totals, a large cluster's GPU map is
folded after the summary, piped output respects COLUMNS, and labels say which calibration was applied."""

from __future__ import annotations

import html
import json
import os
import random
import re
import subprocess
import sys

import pytest

from conftest import H100_128, REPO, small_instance_dict, write_instance
from formulation import default_placement, evaluate, load_instance
from formulation.inputs.user_calibration import UserCalibration, apply_user_calibration
from solvers.outputs.report import detail_tables, gpu_map, rounded_parts, summary_table
from solvers.validation.report import mode_label

BOX = set("┌┐└┘├┤┬┴┼─│┏┓┗┛┣┫┳┻╋━┃┡┩╇╈╍")
H100_16384 = REPO / "instances" / "h100_16384.json"
CALIBRATION = {"compute_scale": 0.9, "network_scale": 0.8, "iteration_overhead_s": 0.2, "fitted_on": ["a", "b", "c"],
               "leave_one_out_error": 0.12}  # runs that disagree (above fewshot.DISAGREEMENT): a warning


def solve(*args, columns: str | None = "400") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    if columns is not None:
        env["COLUMNS"] = columns
    return subprocess.run([sys.executable, "-m", "solvers.outputs.cli", *map(str, args)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


def _flat(text: str) -> str:
    return " ".join(text.split())


def terminal_parts(text: str) -> tuple[list[str], list[str]]:
    """(lines that are not part of a table's frame or rows, table cells) of the terminal's output."""
    lines, cells = [], []
    for line in text.splitlines():
        if not line.strip():
            continue
        if line.strip()[0] in BOX:
            cells += [c.strip() for c in re.split("[│┃]", line) if c.strip() and not set(c.strip()) <= BOX]
        else:
            lines.append(_flat(line))
    return lines, cells


def html_parts(page: str) -> tuple[str, set[str]]:
    """(all the page's text, the text of every table cell and caption)."""
    cells = {_flat(html.unescape(c)) for c in re.findall(r"<(?:td|th|caption)[^>]*>(.*?)</(?:td|th|caption)>", page,
                                                         flags=re.S)}
    return _flat(html.unescape(re.sub(r"<[^>]+>", " ", page))), cells


@pytest.fixture(scope="module")
def cautious_plan(tmp_path_factory):
    """A plan with every kind of caveat: a unit mistake (400 Gb/s as GB/s), the software stack not set, a
    calibration whose runs disagree, zero_stage 1 (torchtitan cannot run it), runners-up; planned with
    --output-dir. Returns (terminal text, stderr, report.html, plan.json)."""
    tmp = tmp_path_factory.mktemp("cautious")
    data = small_instance_dict(2, 4)
    data["cluster"]["network"]["inter_node_gb_per_s"] = 400
    data["training"]["zero_stage"] = [1]
    cal = tmp / "cal.json"
    cal.write_text(json.dumps(CALIBRATION))
    out = solve("--instance", write_instance(tmp, data), "--method", "baseline", "--top", "3", "--calibration", cal,
                "--output-dir", tmp / "out")
    assert out.returncode == 0, out.stderr
    return (out.stdout, out.stderr, (tmp / "out" / "report.html").read_text(),
            json.loads((tmp / "out" / "plan.json").read_text()))


def test_report_html_carries_every_line_and_cell_the_terminal_prints(cautious_plan):
    stdout, stderr, page, _ = cautious_plan
    text, cells = html_parts(page)
    lines, terminal_cells = terminal_parts(stdout + "\n" + stderr)
    missing = [line for line in lines if not line.startswith(("wrote ", "plan written")) and line not in text]
    assert missing == []
    assert sorted(set(terminal_cells) - cells) == []
    flat = _flat(stdout + " " + stderr)
    for caveat in ("p10-p90", "training.software_stack not set", "Megatron-style default", "torchtitan_args.sh",
                   "zero_stage 1 cannot run as planned", "400 Gb/s = 50 GB/s", "calibration runs disagree",
                   "with your calibration applied: compute x0.900, network x0.800, +0.200 s per iteration", "#2:"):
        assert caveat in flat and caveat in text, caveat


def test_the_plan_file_carries_the_warnings_and_the_calibration_the_terminal_names(cautious_plan):
    stdout, stderr, _, plan = cautious_plan
    printed = [line.removeprefix("warning: ") for line in stderr.splitlines() if line.startswith("warning: ")]
    printed += [line.removeprefix("WARNING: ") for line in stdout.splitlines() if line.startswith("WARNING: ")]
    assert len(printed) == 3 and [_flat(w) for w in plan["warnings"]] == [_flat(w) for w in printed]
    assert plan["calibration"] == CALIBRATION


def test_a_calibrated_band_says_the_calibration_was_applied():
    """Finding 7: after --calibration the band no longer claims to come from other sources' runs alone."""
    instance = load_instance(H100_128)
    placement = default_placement(instance, tp=4, pp=4, cp=2, vpp=5)
    calibrated = apply_user_calibration(instance, UserCalibration(**{**CALIBRATION, "fitted_on": ("a", "b", "c")}))
    plain_row = dict(summary_table(instance, placement, evaluate(instance, placement)).rows)["iteration time"]
    row = dict(summary_table(calibrated, placement, evaluate(calibrated, placement)).rows)["iteration time"]
    assert "from the model's errors on other sources' published" in plain_row and "calibration" not in plain_row
    assert "with your calibration applied: compute x0.900, network x0.800, +0.200 s per iteration, fitted on 3 " \
           "runs, leave-one-out error 12.0 %" in row
    assert "from the model's errors" not in row and "around this calibrated estimate" in row


def test_validate_names_the_calibration_it_applied(tmp_path):
    lines = (REPO / "formulation" / "data" / "reference" / "published_runs.csv").read_text().splitlines()
    runs = tmp_path / "mine.csv"
    runs.write_text("\n".join([lines[0]] + [line for line in lines[1:] if "README_8b" in line][:3]) + "\n")
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps(CALIBRATION))
    plain = json.loads(solve("validate", "--runs", runs, "--json").stdout)["mode"]
    out = solve("validate", "--runs", runs, "--calibration", cal)
    assert out.returncode == 0, out.stderr
    calibrated = json.loads(solve("validate", "--runs", runs, "--calibration", cal, "--json").stdout)["mode"]
    assert plain == "stored calibration, fitted on the reference runs"
    assert calibrated.startswith(plain + ", then your calibration") and str(cal) in calibrated
    assert "compute x0.900" in calibrated and calibrated.split(":")[0] in _flat(out.stdout)
    assert mode_label(False, False, None) == "leave-one-source-out"
    assert "then your calibration" in mode_label(False, True, UserCalibration(compute_scale=0.5))


@pytest.mark.parametrize("digits", [1, 3])
def test_rounded_parts_add_up_to_the_rounded_total_and_stay_within_one_unit(digits):
    rng = random.Random(digits)
    unit = 10.0 ** -digits
    for _ in range(500):
        parts = [rng.choice([0.0, rng.uniform(0, 0.2), rng.uniform(0, 40)]) for _ in range(rng.randint(1, 9))]
        shown = rounded_parts(parts, digits)
        assert shown[-1] == f"{sum(parts):.{digits}f}" or abs(float(shown[-1]) - sum(parts)) <= unit / 2 + 1e-9
        assert round(sum(float(v) for v in shown[:-1]) / unit) == round(float(shown[-1]) / unit)
        assert all(abs(float(v) - x) < unit for v, x in zip(shown, parts))


def _add_up(rows: list[tuple[str, ...]], first: int, total: int) -> bool:
    return all(round(sum(float(v) for v in r[first:total]) * 10) == round(float(r[total]) * 10) for r in rows)


def test_memory_parts_add_up_to_the_total_on_the_terminal_and_in_html(cautious_plan):
    """Finding 5: report.html dropped buffers and runtime, so its parts did not add up to the stage's total."""
    instance = load_instance(H100_128)
    for placement in (default_placement(instance, tp=4, pp=4, cp=2, vpp=5),
                      default_placement(instance, tp=8, pp=8, recompute="full", zero_stage=3)):
        estimate = evaluate(instance, placement)
        memory = detail_tables(estimate)[2]
        assert memory.columns[1:7] == ("weights", "grads", "optim", "activ.", "buffers", "runtime")
        assert _add_up(memory.rows, 1, 7)
        assert all(r[7] == f"{s.memory.total_gib:.1f}" for r, s in zip(memory.rows, estimate.stages))
        crit = detail_tables(estimate)[0].rows
        assert round(sum(float(r[1]) for r in crit[:-1]) * 1000) == round(float(crit[-1][1]) * 1000)
    _, _, page, plan = cautious_plan
    table = page[page.index("per stage: memory per GPU"):]
    table = table[:table.index("</table>")]
    rows = [tuple(html.unescape(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row))
            for row in re.findall(r"<tr[^>]*>(.*?)</tr>", table, flags=re.S)]
    rows = [r for r in rows if r]
    assert len(rows) == len(plan["estimate"]["stages"]) and _add_up(rows, 1, 7)
    for row, stage in zip(rows, plan["estimate"]["stages"]):  # the plan file's total, as the page shows it
        assert row[7] == f"{stage['memory']['total_gib']:.1f}"


def test_a_large_cluster_prints_its_summary_first_and_folds_the_gpu_map(tmp_path):
    """Finding 6: 16,384 GPUs printed ~2,159 lines, a 2,048-row GPU map ahead of the solver's summary."""
    placement = tmp_path / "placement.json"
    placement.write_text(json.dumps({"tp": 8, "pp": 16, "recompute": "selective", "zero_stage": 1}))
    out = solve("--instance", H100_16384, "--evaluate", placement, "--output", tmp_path / "plan.json", columns="200")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) < 120
    assert "h100_16384" in lines[0] and "iteration time" in out.stdout.split("critical path")[0]
    assert "2,032 rows folded" in out.stdout and "h100-0000" in out.stdout and "h100-2047" in out.stdout
    assert "h100-1000" not in out.stdout
    plan = json.loads((tmp_path / "plan.json").read_text())  # the full map stays in the plan file
    assert len(plan["placement"]["gpus"]) == 16384 and "h100-1000:3" in plan["placement"]["gpus"]
    instance = load_instance(H100_16384)
    p = default_placement(instance, tp=8, pp=16, recompute="selective")
    assert len(gpu_map(instance, p).rows) == 17 and len(gpu_map(instance, p, fold=False).rows) == 2048
    assert len(gpu_map(load_instance(H100_128), default_placement(load_instance(H100_128), tp=8, pp=4)).rows) == 16


def test_piped_output_respects_columns(tmp_path):
    placement = tmp_path / "placement.json"
    placement.write_text(json.dumps({"tp": 4, "pp": 4, "cp": 2, "vpp": 5, "zero_stage": 1}))
    widths = {}
    for columns in ("90", None):
        out = solve("--instance", H100_128, "--evaluate", placement, columns=columns)
        assert out.returncode == 0, out.stderr
        widths[columns] = max(len(line) for line in out.stdout.splitlines())
    assert widths["90"] <= 90 < widths[None] <= 160
