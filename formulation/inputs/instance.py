"""Instance files: loading (JSON or YAML), strict validation, one-line errors naming file and field."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from formulation.inputs.mxfp8 import check_mxfp8
from formulation.inputs.cluster import Cluster
from formulation.inputs.cluster_section import load_cluster_section
from formulation.errors import (
    DuplicatedMapping,
    InputError,
    Section,
    decode_text,
    parse_json,
    read_input_bytes,
    reject_duplicates,
    reject_lone_surrogates,
)
from formulation.inputs.frameworks import model_problem
from formulation.inputs.job import TrainingJob, load_training_section
from formulation.inputs.model import Model, load_model_section
from formulation.inputs.plausibility import plausibility_warnings


@dataclass(frozen=True, eq=False)
class Instance:
    name: str
    description: str
    model: Model
    training: TrainingJob
    cluster: Cluster
    source: str = "<memory>"
    warnings: tuple[str, ...] = ()  # plausibility warnings (likely unit mistakes); the CLI prints them
    calibration: object = None  # the user calibration applied (formulation/inputs/user_calibration.py), for the labels


def read_document(path: str | Path) -> dict:
    """Parse a JSON or YAML file into a dict; any problem is an `InputError` naming the file."""
    path = Path(path)
    file = str(path)
    text = decode_text(read_input_bytes(path), file)
    data = _parse_yaml(text, file) if path.suffix.lower() in (".yaml", ".yml") else parse_json(text, file)
    if not isinstance(data, dict):
        raise InputError(file, "<root>", "expected an object at the top level")
    return data


class _StrictYamlLoader(yaml.SafeLoader):
    """`yaml.safe_load` that marks mappings whose own keys repeat (PyYAML silently keeps the last value). A key
    repeated through a merge (`<<: *defaults`, then the key again) is an override, not a duplicate."""

    def __init__(self, stream):
        super().__init__(stream)
        self.duplicates: list = []

    def construct_strict_map(self, node):
        keys = [(k.tag, k.value) for k, _ in node.value
                if isinstance(k, yaml.ScalarNode) and k.tag != "tag:yaml.org,2002:merge"]
        data: dict = {}
        if len(set(keys)) != len(keys):
            seen: set = set()
            data = DuplicatedMapping()
            data.key = next(value for key, value in keys if key in seen or seen.add(key))
            self.duplicates.append(data)
        yield data
        data.update(self.construct_mapping(node))


_StrictYamlLoader.add_constructor("tag:yaml.org,2002:map", _StrictYamlLoader.construct_strict_map)
# YAML 1.1 (PyYAML) reads 15e12 and 1.5e12 as strings: it wants a dot and a signed exponent (1.5e+12). Users
# write token budgets and bandwidths the way JSON and Python do, so those spellings are floats here too.
_StrictYamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."))


def _parse_yaml(text: str, file: str):
    loader = _StrictYamlLoader(text)
    try:
        data = loader.get_single_data()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        raise InputError(file, "<root>", f"invalid YAML{where}") from None
    except RecursionError:
        raise InputError(file, "<root>", "invalid YAML: nested too deeply") from None
    except ValueError as exc:  # e.g. an integer longer than Python's 4300-digit conversion limit
        raise InputError(file, "<root>", f"invalid YAML: {exc}") from None
    finally:
        loader.dispose()
    reject_duplicates(data, loader.duplicates, file)
    reject_lone_surrogates(data, file)
    return data


def instance_from_dict(data: dict, file: str = "<memory>", base_dir: Path | None = None,
                       framework: str | None = None) -> Instance:
    """An instance from its parsed document; `framework` (solve --framework) as if `training.framework` named it."""
    sec = Section(data, file, "")
    base_dir = base_dir or Path(".")
    name = sec.string("name")
    description = sec.raw("description", "")
    if not isinstance(description, str):
        raise sec.error("description", "expected a string")
    model = load_model_section(sec.raw("model"), file, base_dir)
    training = load_training_section(sec.raw("training"), file, framework)
    problem = model_problem(training.framework, model)
    if problem:
        raise InputError(file, "training.framework", problem)
    cluster = load_cluster_section(sec.raw("cluster"), file, training.software_stack, base_dir)
    check_mxfp8(training, cluster, file)
    sec.done()
    return Instance(name=name, description=description, model=model, training=training, cluster=cluster,
                    source=file, warnings=tuple(plausibility_warnings(data, file)))


def load_instance(path: str | Path, framework: str | None = None) -> Instance:
    """Load and validate an instance file (JSON or YAML), planned for `framework` (megatron, torchtitan) if given
    (formulation/inputs/frameworks.py). Raises `InputError` on any problem."""
    path = Path(path)
    data = read_document(path)
    return instance_from_dict(data, str(path), path.resolve().parent, framework)
