"""The fit behind `solve calibrate --write` and every leave-one-source-out fold: per chip and software stack the
large-GEMM efficiency `matmul_efficiency` (C1), and one per-iteration overhead `iteration_overhead_s` (C14) that
every run shares, minimising Huber's loss of the log errors of iteration time over the training runs (squared
up to the few-shot fit's scale, 1.345 x 0.057, linear beyond: solvers/validation/fewshot.py): cross-source
residuals are heavy-tailed, and with squares three torchtitan runs 18-24% off for reasons of their own
(Llama-3.1-8B with FSDP x TP8, float8) moved the shared overhead from 0.056 s to 0.074 s for every chip.

The overhead is what an iteration costs beyond the model's compute and communication whatever its size: the
optimizer's kernel launches, the loss and gradient-norm all-reduces, timers and logging that synchronise the
host, the next batch. Fitted per chip and stack it was degenerate (0.002 s on one fold, 0.47 s on another:
docs/physics.md); one value shared by every stack and chip is what the runs determine.

Iteration time is additive in the overhead (C14), so each run's time is tabulated once against the efficiency
(`EFFICIENCY_GRID`, linear in 1/e between points) and every fit is then a search over tables: for each overhead
on `OVERHEAD_GRID_S`, each chip and stack's best efficiency on `EFFICIENCY_FINE`; the overhead whose total
error is least wins. Predictions are then made by the evaluator itself with the fitted values.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from formulation.evaluate import evaluate
from formulation.physics.cost import term

# 1 / e evenly spaced: the compute part of a run's time is linear in 1 / e, so linear interpolation is exact
# there and errs only around the kinks where hidden communication becomes exposed: at most 0.37% from the
# evaluator over the reference runs (six random efficiencies in 0.45-0.85 each); the fits' efficiencies land
# 0.0005 apart, and every prediction is the evaluator's own
EFFICIENCY_GRID = 1.0 / np.linspace(1 / 0.95, 1 / 0.40, 32)
EFFICIENCY_FINE = np.round(np.arange(0.40, 0.95 + 1e-9, 0.0005), 4)
OVERHEAD_GRID_S = np.round(np.arange(0.0, 0.2 + 1e-9, 0.001), 3)


@dataclass(frozen=True)
class Fit:
    efficiency: dict  # calibration key -> matmul_efficiency
    overhead_s: float


class TimeTables:
    """Each run's predicted iteration time without overhead, against the efficiency on `EFFICIENCY_FINE`."""

    def __init__(self, runs, with_parameters):
        self._with = with_parameters
        self._fine: dict[int, np.ndarray] = {}
        for run in runs:
            self.fine(run)

    def fine(self, run) -> np.ndarray:
        if run.row not in self._fine:
            coarse = np.array([evaluate(self._with(run, {"matmul_efficiency": float(e), "iteration_overhead_s": 0.0}),
                                        run.placement, check=False).iteration_time_s for e in EFFICIENCY_GRID])
            # linear in 1 / e (increasing along the grid, as np.interp needs)
            self._fine[run.row] = np.interp(1 / EFFICIENCY_FINE, 1 / EFFICIENCY_GRID, coarse)
        return self._fine[run.row]


def joint_fit(runs, key_of, tables: TimeTables, votes=None) -> Fit:
    """The efficiencies per `key_of(run)` and the shared overhead minimising the summed Huber loss of the log
    errors of `runs` (the overhead held at 0 when the `iteration_overhead` physics term is off).
    `votes(key)`: whether a key's runs choose the overhead (all of them by default; where none of the keys
    present votes, all do); the other keys fit their efficiency at the overhead the voters chose, so adding
    their runs moves no voter's figure."""
    from solvers.validation.fewshot import HUBER_RUNS, RUN_SPREAD  # fewshot imports crossval, which imports us
    overheads = OVERHEAD_GRID_S if term("iteration_overhead") else np.zeros(1)
    keys = sorted({key_of(r) for r in runs})
    losses, best_index = [], []
    for key in keys:
        rows = [r for r in runs if key_of(r) == key]
        times = np.stack([tables.fine(r) for r in rows])  # rows x efficiencies
        measured = np.log([r.measured_iter_s for r in rows])[:, None]
        # overheads x efficiencies: summed Huber loss of the log error
        loss = np.stack([huber_loss(np.log(times + c) - measured, HUBER_RUNS * RUN_SPREAD).sum(axis=0)
                         for c in overheads])
        best_index.append(loss.argmin(axis=1))
        losses.append(loss.min(axis=1))
    voters = [loss for key, loss in zip(keys, losses) if votes is None or votes(key)] or losses
    c = int(np.argmin(np.sum(voters, axis=0)))
    return Fit({key: float(EFFICIENCY_FINE[best[c]]) for key, best in zip(keys, best_index)}, float(overheads[c]))


def huber_loss(r: np.ndarray, scale: float) -> np.ndarray:
    """Huber's loss: r^2 within `scale`, 2 scale |r| - scale^2 beyond (fewshot.huber_residual is its signed root,
    for least squares)."""
    a = np.abs(r)
    return np.where(a <= scale, r * r, 2 * scale * a - scale * scale)
