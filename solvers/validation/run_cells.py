"""The cells of a runs CSV row read as numbers, flags, schedule families and recompute policies: each bad cell a
ValueError naming its column, which the loader turns into one line naming the file and row."""

from __future__ import annotations

import math


def number_cell(r: dict, key: str) -> float | None:
    """A cell as a finite number >= 0; blank (or OOM in the memory column): None. Anything else names the column."""
    value = (r.get(key) or "").strip()
    if not value or value.upper() == "OOM":
        return None
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"column {key}: expected a finite number >= 0, got {value!r}")
    return number


def whole_cell(r: dict, key: str, default: int | None = None) -> int | None:
    """A cell as a whole number >= 0 (written 8 or 8.0); blank: `default`."""
    number = number_cell(r, key)
    if number is None:
        return default
    if not number.is_integer():
        raise ValueError(f"column {key}: expected a whole number, got {r[key].strip()!r}")
    return int(number)


def flag_cell(r: dict, key: str, default: bool) -> bool:  # an optional true / false cell
    text = (r.get(key) or "").strip().lower()
    if not text:
        return default
    if text not in ("true", "false"):
        raise ValueError(f"column {key}: expected true or false, got {text!r}")
    return text == "true"


# the schedules a runs file may name: the V schedules (ZBV, DualPipeV) hold only where (S3)'s conditions do (vpp 2,
# m >= 2 pp, one layer kind), which validation's unchecked evaluation would not enforce, and no published run uses them
RUN_SCHEDULES = ("1f1b", "zero_bubble")


def schedule_cell(r: dict) -> str:  # the optional `schedule` cell: a schedule family (blank: 1f1b)
    text = (r.get("schedule") or "").strip().lower() or "1f1b"
    if text not in RUN_SCHEDULES:
        raise ValueError(f"column schedule: expected one of {', '.join(RUN_SCHEDULES)}, got {text!r}")
    return text


def recompute_cell(r: dict) -> tuple[str, int]:
    """(policy, block layers) of a row's recompute cell: `block:r` is Megatron-LM's --recompute-method block
    --recompute-num-layers r, i.e. ("full", r); (the cell, -1) where r is not a positive integer."""
    text = (r["recompute"] or "").strip()
    recompute = text.split("+")[0] if text else "none"
    if not recompute.startswith("block:"):
        return recompute, 0
    count = recompute.partition(":")[2].strip()
    return ("full", int(count)) if count.isdigit() and int(count) > 0 else (recompute, -1)
