"""A user's calibration: three knobs fitted on a few measured runs of their own cluster and software stack
(`solve calibrate --runs mine.csv --output cal.json`), applied with `--calibration cal.json`.

- `compute_scale` multiplies the GEMM and attention efficiencies of every GPU type (capped below 1);
- `network_scale` multiplies every link bandwidth (intra-node, inter-node, measured pairs);
- `iteration_overhead_s` is added to every iteration (data loading, logging, launch gaps, host syncs).

Each is a change of inputs, so the evaluator and the exact program see an ordinary instance."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from formulation.errors import Section, decode_text, parse_json, read_input_bytes

MAX_EFFICIENCY = 0.98


@dataclass(frozen=True)
class UserCalibration:
    compute_scale: float = 1.0
    network_scale: float = 1.0
    iteration_overhead_s: float = 0.0
    fitted_on: tuple = ()  # what the knobs were fitted on (run names), for the record
    leave_one_out_error: float | None = None  # median |error| predicting each run from the others

    def to_dict(self) -> dict:
        return {"compute_scale": self.compute_scale, "network_scale": self.network_scale,
                "iteration_overhead_s": self.iteration_overhead_s, "fitted_on": list(self.fitted_on),
                "leave_one_out_error": self.leave_one_out_error}


def load_user_calibration(path: str | Path) -> UserCalibration:
    path = Path(path)
    data = parse_json(decode_text(read_input_bytes(path), str(path)), str(path))
    sec = Section(data, str(path), "")
    cal = UserCalibration(sec.number("compute_scale", default=1.0, positive=True),
                          sec.number("network_scale", default=1.0, positive=True),
                          sec.number("iteration_overhead_s", default=0.0, positive=False, minimum=0.0),
                          tuple(sec.raw("fitted_on", [])), sec.raw("leave_one_out_error", None))
    sec.done()
    return cal


def apply_user_calibration(instance, cal: UserCalibration):
    """The instance with the knobs applied (instances are immutable: a new one), which records `cal` so that
    reports can say what was applied."""
    if (cal.compute_scale, cal.network_scale, cal.iteration_overhead_s) == (1.0, 1.0, 0.0):
        return dataclasses.replace(instance, calibration=cal)
    cluster = instance.cluster
    types = {name: dataclasses.replace(
        t, matmul_efficiency=min(MAX_EFFICIENCY, t.matmul_efficiency * cal.compute_scale),
        attention_efficiency=min(MAX_EFFICIENCY, t.attention_efficiency * cal.compute_scale),
        iteration_overhead_s=t.iteration_overhead_s + cal.iteration_overhead_s)
        for name, t in cluster.gpu_types.items()}
    s = cal.network_scale
    cluster = dataclasses.replace(cluster, gpu_types=types, intra_gb_per_s=tuple(m * s for m in cluster.intra_gb_per_s),
                                  inter_gb_per_s=cluster.inter_gb_per_s * s,
                                  gpu_pair_gb_per_s={k: v * s for k, v in cluster.gpu_pair_gb_per_s.items()})
    return dataclasses.replace(instance, cluster=cluster, calibration=cal)
