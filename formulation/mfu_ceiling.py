"""The plausibility guard on MFU: the highest MFU published per GPU type, precision class and model kind
(formulation/data/mfu_ceilings.json, each with its run and source), and the check of an estimate against it.

An estimate above its ceiling by more than the table's tolerance (2 %, docs/decisions.md) is more likely the
model's optimism than a record: the report, the plan file and the sweep table say so, with the ceiling's source.
MFU is the planner's throughout (formulation/evaluate.py): Megatron-LM's model FLOPs (full attention, no
recompute) per second per GPU over the 16-bit dense peak, FP8 runs included. A GPU type without an entry of its
own takes the entries of the chip it shares a die and peaks with (`same_chip`: the H200 takes the H100 SXM's)."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

from formulation.data import DATA_DIR
from formulation.inputs.gpus import gpu_catalog
from formulation.intervals import FP8, SIXTEEN_BIT

CEILINGS_PATH = DATA_DIR / "mfu_ceilings.json"
PRECISIONS = (SIXTEEN_BIT, FP8)
KINDS = ("dense", "moe")


@dataclass(frozen=True)
class Ceiling:
    gpu_type: str
    precision: str  # "16-bit" or "fp8" (formulation/intervals.py)
    model_kind: str  # "dense" or "moe"
    mfu: float  # the planner's definition
    run: dict  # model, gpus, seq_length, global_batch_size, run_precision, measured, stack
    published: str  # what the source published and how it counted
    conversion: str  # how the figure became the planner's MFU
    source: dict  # title, url
    reference: dict | None = None  # {"file", "row"} in formulation/data/reference/
    derived: dict | None = None  # {"preset", "tokens_per_s_per_gpu", "peak_tflops"} for a figure not in the reference

    def describe(self) -> str:
        r = self.run
        return (f"{100 * self.mfu:.1f} % ({r['model']} on {r['gpus']} {self.gpu_type}, {r['seq_length']} tokens; "
                f"{self.source['title']}, {self.source['url']})")

    def to_dict(self) -> dict:
        out = {"gpu_type": self.gpu_type, "precision": self.precision, "model_kind": self.model_kind,
               "mfu": self.mfu, "run": dict(self.run), "published": self.published, "conversion": self.conversion,
               "source": dict(self.source)}
        if self.reference:
            out["reference"] = dict(self.reference)
        return out


@dataclass(frozen=True)
class Ceilings:
    entries: tuple[Ceiling, ...]
    tolerance: float  # relative: an estimate above ceiling x (1 + tolerance) is flagged
    same_chip: dict  # GPU type -> {"as": other type, "reason": ...}

    def best(self, gpu_type: str, precision: str, kind: str) -> Ceiling | None:
        """The highest entry of a GPU type (and of the chip it shares a die with) for a precision and model kind."""
        types = {gpu_type}
        if gpu_type in self.same_chip:
            types.add(self.same_chip[gpu_type]["as"])
        found = [c for c in self.entries if c.gpu_type in types and c.precision == precision and c.model_kind == kind]
        return max(found, key=lambda c: c.mfu, default=None)


def _problem(path: Path, field: str, problem: str) -> ValueError:
    return ValueError(f"{path}: {field}: {problem}")


def load_ceilings(path: str | Path = CEILINGS_PATH) -> Ceilings:
    """Read and check the ceiling table: every entry names a known precision and kind, an MFU in (0, 1] and a
    source with a title and a URL."""
    path = Path(path)
    data = json.loads(path.read_text(encoding="utf-8"))
    entries = []
    for i, e in enumerate(data["entries"]):
        field = f"entries[{i}]"
        if e.get("precision") not in PRECISIONS or e.get("model_kind") not in KINDS:
            raise _problem(path, field, f"precision must be one of {PRECISIONS}, model_kind one of {KINDS}")
        if not 0 < float(e.get("mfu", 0)) <= 1:
            raise _problem(path, f"{field}.mfu", "expected a fraction in (0, 1]")
        source = e.get("source") or {}
        if not source.get("title") or not str(source.get("url", "")).startswith("https://"):
            raise _problem(path, f"{field}.source", "expected a title and an https URL")
        entries.append(Ceiling(gpu_type=e["gpu_type"], precision=e["precision"], model_kind=e["model_kind"],
                               mfu=float(e["mfu"]), run=e["run"], published=e["published"],
                               conversion=e["conversion"], source=source, reference=e.get("reference"),
                               derived=e.get("derived")))
    tolerance = float(data["tolerance"])
    if not 0 <= tolerance < 0.5:
        raise _problem(path, "tolerance", "expected a relative margin in [0, 0.5)")
    return Ceilings(tuple(entries), tolerance, dict(data.get("same_chip", {})))


@functools.cache
def ceilings() -> Ceilings:
    """The packaged table."""
    return load_ceilings()


def catalog_type(name: str, gpu) -> str | None:
    """The table's name for an instance's GPU type: its own name where the table or the catalog knows it, else the
    catalog type with the same 16-bit and FP8 peaks and the nearest memory (a preset with its own name)."""
    table = {c.gpu_type for c in ceilings().entries} | set(ceilings().same_chip)
    catalog = {k: v for k, v in gpu_catalog().items() if not k.startswith("__")}
    if name in table or name in catalog:
        return name
    same = [(abs(v.get("memory_gib", 0.0) - gpu.memory_gib), k) for k, v in catalog.items()
            if v.get("peak_tflops") == gpu.peak_tflops and v.get("peak_fp8_tflops", 0.0) == gpu.peak_fp8_tflops]
    return min(same)[1] if same else None


@dataclass(frozen=True)
class MfuCheck:
    mfu: float
    ceiling: Ceiling
    tolerance: float
    gpu_type: str  # the table's name of the GPU type checked
    precision: str
    model_kind: str

    @property
    def limit(self) -> float:
        return self.ceiling.mfu * (1 + self.tolerance)

    @property
    def above(self) -> bool:
        return self.mfu > self.limit

    @property
    def excess(self) -> float:
        """How far the estimate is above the ceiling, relative (negative: below it)."""
        return self.mfu / self.ceiling.mfu - 1

    def warning(self) -> str:
        """One sentence for a flagged estimate, empty otherwise."""
        if not self.above:
            return ""
        via = "" if self.ceiling.gpu_type == self.gpu_type else f" (an {self.ceiling.gpu_type} figure: same chip)"
        return (f"MFU {100 * self.mfu:.1f} % is above the highest MFU published for {self.model_kind} "
                f"{self.precision} training on {self.gpu_type}{via} by {100 * self.excess:.0f} %: "
                f"{self.ceiling.describe()}; treat as optimistic")

    def to_dict(self) -> dict:
        return {"status": "above_published" if self.above else "within_published", "mfu": self.mfu,
                "gpu_type": self.gpu_type, "precision": self.precision, "model_kind": self.model_kind,
                "ceiling_mfu": self.ceiling.mfu, "tolerance": self.tolerance, "excess": self.excess,
                "warning": self.warning(), "ceiling": self.ceiling.to_dict()}


def mfu_check(cluster, estimate) -> MfuCheck | None:
    """The estimate against the ceiling of its GPU types (the highest among the types its stages run on), its
    precision class (FP8 where its GEMMs run in FP8) and model kind; None where the table has no entry."""
    kind = "moe" if "ep_comm_s" in estimate.breakdown else "dense"  # evaluate() prices expert traffic for MoE only
    # the interval group is a precision group, or `level+precision` where the stack, GPU or regime has no
    # measured runs (formulation/intervals.py): the ceiling is per precision
    precision = estimate.interval_group.rpartition("+")[2]
    table = ceilings()
    found = []
    for used in sorted({stage.gpu_type for stage in estimate.stages}):
        name = catalog_type(used, cluster.gpu_types[used])
        best = table.best(name, precision, kind) if name else None
        if best is not None:
            found.append((best.mfu, name, best))
    if not found:
        return None
    _, name, best = max(found, key=lambda t: t[0])
    return MfuCheck(estimate.mfu, best, table.tolerance, name, precision, kind)


def mfu_warning(cluster, estimate) -> str:
    """The guard's sentence for the report's caveats: empty unless the estimate is above its ceiling."""
    check = mfu_check(cluster, estimate)
    return check.warning() if check else ""
