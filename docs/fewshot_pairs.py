"""Few-shot calibration measured on every pair (and every 3-, 4- and 6-subset, 60 at most) of runs of each
visible cluster (source x GPU type, >= 4 runs): which knobs two or more runs can fit.

    python docs/fewshot_pairs.py                 # about 4 minutes on 2 cores
    python docs/fewshot_pairs.py --per-cluster   # two runs, the shipped rule, every pair: per cluster (~12 min)
    python docs/fewshot_pairs.py --per-document  # the same with clusters per document (page at one commit) x GPU
    python docs/fewshot_pairs.py --rules         # two runs, other rules than the shipped one, per cluster (~5 min)
    python docs/fewshot_pairs.py --disagreement  # how the runs' leave-one-out error foretells the others' (~3 min)

Each run's iteration time is tabulated on a grid of (log compute scale, log network scale) over the
leave-one-source-out model (overhead is additive), so that thousands of fits take seconds; each fit is the
least-squares knob choice on that grid with the same priors as solvers/validation/fewshot.py. Prints, per
number of calibration runs, the median over clusters of the median |error| of the other runs (and how many
clusters are above 5%) for: three knobs with the shipped priors, and the compute scale alone. With
--per-cluster: for two runs and the compute scale alone (the shipped rule for two runs), per cluster over every
pair of its runs, the median, quartiles and share of pairs above 5% of the median |error| of its other runs:
what `solve validate --few-shot`'s one pair (the runs at the quartiles of measured time) is a sample of. With
--per-document the clusters are one document each (a page at one commit, or one of DGX Cloud's per-model pages)
and GPU type instead of one source family and GPU type. With
--rules: the same per-cluster median over every pair for other two-run rules than the shipped one (a single
knob chosen by the fit's own objective among compute, network and overhead; two knobs; all three). With
--disagreement: every pair and up to 60 subsets of 3 runs of each cluster, binned by the calibration runs' own
median leave-one-out error (what `solve calibrate` prints and warns on above fewshot.DISAGREEMENT), with the
median |error| of the cluster's other runs per bin.
"""

import itertools
import math
import random
import re
import statistics
import sys

import numpy as np
from scipy.interpolate import RegularGridInterpolator

from formulation.evaluate import evaluate
from formulation.inputs.user_calibration import UserCalibration, apply_user_calibration
from solvers.validation import crossval
from solvers.validation.fewshot import DISAGREEMENT, HUBER_RUNS, KNOB_SPREAD, MIN_RUNS_FOR_ALL_KNOBS, RUN_SPREAD
from solvers.validation.joint_fit import huber_loss

LOG_C, LOG_N = np.linspace(-0.4, 0.4, 17), np.linspace(-1.5, 1.5, 13)
FINE_C, FINE_N, FINE_O = np.linspace(-0.4, 0.4, 81), np.linspace(-1.5, 1.5, 61), np.linspace(0, 0.3, 31)


def tabulate(prediction) -> np.ndarray:
    grid = np.array([[evaluate(apply_user_calibration(prediction.instance, UserCalibration(math.exp(c), math.exp(n))),
                               prediction.run.placement, check=False).iteration_time_s for n in LOG_N] for c in LOG_C])
    fine = RegularGridInterpolator((LOG_C, LOG_N), np.log(grid))
    c, n = np.meshgrid(FINE_C, FINE_N, indexing="ij")
    return np.exp(fine(np.stack([c, n], -1)))


def _huber(r: np.ndarray) -> np.ndarray:
    """Huber's loss at the scale solvers/validation/fewshot.py fits with (HUBER_RUNS x RUN_SPREAD)."""
    return huber_loss(r, HUBER_RUNS * RUN_SPREAD)


def fit(chosen, all_knobs: bool, knobs: tuple | None = None):
    """The knob choice on the grid; `knobs` (compute, network, overhead: True where the knob is free, with its
    shipped prior) overrides `all_knobs`. Returns the grid indices, the overhead in seconds and the objective."""
    knobs = knobs or ((True, True, True) if all_knobs else (True, False, False))
    mean_t = statistics.fmean(m for _, m in chosen)
    objective = sum(_huber(np.log((t[:, :, None] + FINE_O[None, None, :] * mean_t) / m)) for t, m in chosen)
    pull = [RUN_SPREAD / s if free else 1e3 for s, free in zip(KNOB_SPREAD, knobs)]
    objective = objective + (pull[0] * FINE_C[:, None, None]) ** 2 + (pull[1] * FINE_N[None, :, None]) ** 2 \
        + (pull[2] * FINE_O[None, None, :]) ** 2
    i, j, k = np.unravel_index(np.argmin(objective), objective.shape)
    return i, j, FINE_O[k] * mean_t, objective[i, j, k]


def rest_error(runs: list, chosen: tuple, fitted: tuple) -> float:
    """Median |error| of the cluster's runs outside `chosen` under the knobs of `fitted` (fit's grid indices and
    overhead)."""
    i, j, o = fitted[:3]
    return statistics.median(abs((t[i, j] + o) / m - 1) for k, (t, m) in enumerate(runs) if k not in chosen)


def document(prediction) -> str:
    """The document a run comes from: its family, and the page's commit or DGX Cloud's per-model page."""
    commit = re.search(r"@([0-9a-f]{7,8})", prediction.run.source)
    page = re.search(r"(README_\d+b)\.md", prediction.run.source)
    return prediction.family + (f" @{commit[1]}" if commit else "") + (f" {page[1]}" if page else "")


def per_cluster(clusters: dict) -> None:
    """Two runs, compute scale alone, every pair of each cluster's runs."""
    medians = []
    for (family, gpu_type), runs in sorted(clusters.items()):
        if len(runs) < 4:
            continue
        per_pair = []
        for pair in itertools.combinations(range(len(runs)), 2):
            per_pair.append(rest_error(runs, pair, fit([runs[k] for k in pair], False)))
        q1, _, q3 = statistics.quantiles(per_pair, n=4)
        above = sum(e > 0.05 for e in per_pair) / len(per_pair)
        print(f"{family} ({gpu_type}): {len(runs)} runs, {len(per_pair)} pairs: median "
              f"{100 * statistics.median(per_pair):.1f}%, quartiles {100 * q1:.1f}-{100 * q3:.1f}%, "
              f"pairs above 5%: {above:.0%}", flush=True)
        medians.append(statistics.median(per_pair))
    print(f"{len(medians)} clusters of 4 runs or more: {sum(m > 0.05 for m in medians)} above 5%, median over "
          f"clusters {100 * statistics.median(medians):.1f}%")


TWO_RUN_RULES = {"compute": [(True, False, False)],  # the shipped rule
                 "best single knob": [(True, False, False), (False, True, False), (False, False, True)],
                 "compute + network": [(True, True, False)], "compute + overhead": [(True, False, True)],
                 "three knobs": [(True, True, True)]}


def compare_rules(clusters: dict) -> None:
    """Two runs, every pair of each cluster's runs, per two-run rule: the median over pairs of the other runs'
    median |error|. A rule with several candidates keeps the one whose fit objective is lowest."""
    per_rule = {name: [] for name in TWO_RUN_RULES}
    for (family, gpu_type), runs in sorted(clusters.items()):
        if len(runs) < 4:
            continue
        cells = []
        for name, candidates in TWO_RUN_RULES.items():
            per_pair = []
            for pair in itertools.combinations(range(len(runs)), 2):
                best = min((fit([runs[k] for k in pair], False, knobs) for knobs in candidates), key=lambda f: f[3])
                per_pair.append(rest_error(runs, pair, best))
            per_rule[name].append(statistics.median(per_pair))
            cells.append(f"{name} {100 * per_rule[name][-1]:.1f}%")
        print(f"{family} ({gpu_type}), {len(runs)} runs: " + ", ".join(cells), flush=True)
    for name, medians in per_rule.items():
        print(f"{name}: median over {len(medians)} clusters {100 * statistics.median(medians):.1f}%, "
              f"above 5%: {sum(m > 0.05 for m in medians)}")


def _leave_one_out(chosen: list) -> float:
    """Median |error| of each calibration run predicted from the shipped rule's fit on the others."""
    errors = []
    for y, (t, m) in enumerate(chosen):
        others = [run for k, run in enumerate(chosen) if k != y]
        i, j, o, _ = fit(others, len(others) >= MIN_RUNS_FOR_ALL_KNOBS)
        errors.append(abs((t[i, j] + o) / m - 1))
    return statistics.median(errors)


def disagreement(clusters: dict) -> None:
    """Does the calibration runs' disagreement foretell how well they calibrate the rest of their cluster?"""
    for shots in (2, 3):
        binned = []
        for runs in clusters.values():
            if len(runs) < shots + 2:
                continue
            subsets = list(itertools.combinations(range(len(runs)), shots))
            random.Random(0).shuffle(subsets)
            for subset in subsets if shots == 2 else subsets[:60]:
                chosen = [runs[k] for k in subset]
                rest = rest_error(runs, subset, fit(chosen, shots >= MIN_RUNS_FOR_ALL_KNOBS))
                binned.append((_leave_one_out(chosen), rest))
        for lo, hi in ((0.0, 0.05), (0.05, DISAGREEMENT), (DISAGREEMENT, 0.12), (0.12, 0.2), (0.2, math.inf)):
            rests = [r for loo, r in binned if lo <= loo < hi]
            if rests:
                print(f"{shots} runs, leave-one-out {100 * lo:.1f}-{100 * hi:.1f}%: {len(rests)} subsets, the other "
                      f"runs' median |error| {100 * statistics.median(rests):.1f}%, above 5% in "
                      f"{sum(r > 0.05 for r in rests) / len(rests):.0%}", flush=True)
        for name, side in (("below", [r for loo, r in binned if loo < DISAGREEMENT]),
                           ("at or above", [r for loo, r in binned if loo >= DISAGREEMENT])):
            print(f"{shots} runs, leave-one-out {name} {100 * DISAGREEMENT:.1f}%: {len(side)} subsets, the other runs' "
                  f"median |error| {100 * statistics.median(side):.1f}%")


def main() -> None:
    predictions = [p for p in crossval.cross_validate(crossval.reference_runs()) if p.timed]
    clusters: dict = {}
    by_document = "--per-document" in sys.argv[1:]
    for p in predictions:
        clusters.setdefault((document(p) if by_document else p.family, p.run.gpu_type), []).append(
            (tabulate(p), p.run.measured_iter_s))
    if "--per-cluster" in sys.argv[1:] or by_document:
        per_cluster(clusters)
        return
    if "--rules" in sys.argv[1:]:
        compare_rules(clusters)
        return
    if "--disagreement" in sys.argv[1:]:
        disagreement(clusters)
        return
    for shots in (2, 3, 4, 6):
        for all_knobs in (True, False):
            medians = []
            for runs in clusters.values():
                if len(runs) < max(4, shots + 2):
                    continue
                subsets = list(itertools.combinations(range(len(runs)), shots))
                random.Random(0).shuffle(subsets)
                per_subset = []
                for subset in subsets[:60]:
                    per_subset.append(rest_error(runs, subset, fit([runs[k] for k in subset], all_knobs)))
                medians.append(statistics.median(per_subset))
            print(f"{shots} runs, {'three knobs' if all_knobs else 'compute only'}: median over {len(medians)} "
                  f"clusters {100 * statistics.median(medians):.1f}%, above 5%: {sum(m > 0.05 for m in medians)}")


if __name__ == "__main__":
    main()
