"""Instance files: loading (JSON or YAML), strict validation, one-line errors naming file and field."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import yaml

from .cluster import Cluster, load_cluster_section
from .errors import InputError, Section
from .job import TrainingJob, load_training_section
from .model import Model, load_model_section


@dataclass(frozen=True, eq=False)
class Instance:
    name: str
    description: str
    model: Model
    training: TrainingJob
    cluster: Cluster
    source: str = "<memory>"


def read_document(path: str | Path) -> dict:
    """Parse a JSON or YAML file into a dict; any problem is an `InputError` naming the file."""
    path = Path(path)
    file = str(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise InputError(file, "<root>", "file not found") from None
    except IsADirectoryError:
        raise InputError(file, "<root>", "expected a file, got a directory") from None
    except OSError as exc:
        raise InputError(file, "<root>", f"cannot read file: {exc.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(file, "<root>", f"file is not valid UTF-8 (byte {exc.start})") from None
    if path.suffix.lower() in (".yaml", ".yml"):
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
            raise InputError(file, "<root>", f"invalid YAML{where}") from None
        except ValueError as exc:  # e.g. an integer longer than Python's 4300-digit conversion limit
            raise InputError(file, "<root>", f"invalid YAML: {exc}") from None
    else:
        try:
            data = json.loads(text, parse_constant=_reject_constant)
        except json.JSONDecodeError as exc:
            raise InputError(file, "<root>", f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
        except _NonFiniteConstant as exc:  # NaN / Infinity: name the field, as every other error does
            raise InputError(file, _non_finite_path(json.loads(text)) or "<root>", str(exc)) from None
        except ValueError as exc:  # e.g. an integer longer than Python's 4300-digit conversion limit
            raise InputError(file, "<root>", str(exc)) from None
    if not isinstance(data, dict):
        raise InputError(file, "<root>", "expected an object at the top level")
    return data


class _NonFiniteConstant(ValueError):
    pass


def _reject_constant(name: str):
    raise _NonFiniteConstant(f"{name} is not a valid number (JSON allows finite numbers only)")


def _non_finite_path(value, path: str = "") -> str | None:
    """Field path of the first NaN or infinite number in parsed JSON (None if there is none)."""
    if isinstance(value, float) and not math.isfinite(value):
        return path or "<root>"
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        sub = f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}" if path else str(key)
        found = _non_finite_path(item, sub)
        if found:
            return found
    return None


def instance_from_dict(data: dict, file: str = "<memory>", base_dir: Path | None = None) -> Instance:
    sec = Section(data, file, "")
    base_dir = base_dir or Path(".")
    name = sec.string("name")
    description = sec.raw("description", "")
    if not isinstance(description, str):
        raise sec.error("description", "expected a string")
    model = load_model_section(sec.raw("model"), file, base_dir)
    training = load_training_section(sec.raw("training"), file)
    cluster = load_cluster_section(sec.raw("cluster"), file, training.software_stack, base_dir)
    sec.done()
    _check_consistency(model, training, cluster, file)
    return Instance(name=name, description=description, model=model, training=training, cluster=cluster,
                    source=file)


def _check_consistency(model: Model, training: TrainingJob, cluster: Cluster, file: str) -> None:
    if cluster.num_gpus > 1_000_000:
        raise InputError(file, "cluster.nodes", f"{cluster.num_gpus} GPUs exceed the supported 1,000,000")


def load_instance(path: str | Path) -> Instance:
    """Load and validate an instance file (JSON or YAML). Raises `InputError` on any problem."""
    path = Path(path)
    data = read_document(path)
    return instance_from_dict(data, str(path), path.resolve().parent)
