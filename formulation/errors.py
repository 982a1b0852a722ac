"""Input errors and a strict reader for nested JSON/YAML sections.

Every problem with user input becomes one `InputError` whose message names the file, the field path and
what was expected, so the CLI can print one line and exit with code 2.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from typing import Any, Iterable


class InputError(ValueError):
    """Bad input: `file: field: problem`. The CLI prints it on one line and exits with code 2."""

    def __init__(self, file: str | None, field: str, problem: str):
        self.file = file or "<input>"
        self.field = field or "<root>"
        self.problem = problem
        super().__init__(f"{self.file}: {self.field}: {problem}")


class InfeasibleError(RuntimeError):
    """No plan fits: the message names the smallest shortfall (exit code 1)."""


_MISSING = object()


def is_finite(value: int | float) -> bool:
    """math.isfinite that treats integers too large for a float (e.g. 1 followed by 400 digits) as infinite."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


@dataclass
class Section:
    """A mapping read field by field; `done()` rejects every key that was not read."""

    data: dict
    file: str
    path: str

    def __post_init__(self):
        if not isinstance(self.data, dict):
            raise InputError(self.file, self.path, f"expected an object, got {_type_name(self.data)}")
        self._read: set[str] = set()

    def _field(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def error(self, key: str, problem: str) -> InputError:
        return InputError(self.file, self._field(key), problem)

    def has(self, key: str) -> bool:
        return key in self.data

    def raw(self, key: str, default: Any = _MISSING) -> Any:
        self._read.add(key)
        if key not in self.data:
            if default is _MISSING:
                unread = [k for k in self.data if isinstance(k, str) and k not in self._read]
                close = difflib.get_close_matches(key, unread, n=1, cutoff=0.6)
                hint = f" (found unknown key {close[0]!r}: misspelled?)" if close else ""
                raise self.error(key, f"required field is missing{hint}")
            return default
        return self.data[key]

    def number(self, key: str, default: Any = _MISSING, *, positive: bool = True, minimum: float | None = None,
               maximum: float | None = None) -> float:
        value = self.raw(key, default)
        if value is default and default is not _MISSING:
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.error(key, f"expected a number, got {_type_name(value)} {value!r}")
        if not is_finite(value):
            raise self.error(key, f"expected a finite number, got {value!r}")
        if positive and value <= 0:
            raise self.error(key, f"expected a positive number, got {value!r}")
        if minimum is not None and value < minimum:
            raise self.error(key, f"expected a number >= {minimum}, got {value!r}")
        if maximum is not None and value > maximum:
            raise self.error(key, f"expected a number <= {maximum}, got {value!r}")
        return float(value)

    def integer(self, key: str, default: Any = _MISSING, *, minimum: int = 1, maximum: int | None = None) -> int:
        value = self.raw(key, default)
        if value is default and default is not _MISSING:
            return value
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(key, f"expected an integer, got {_type_name(value)} {value!r}")
        if not is_finite(value):  # beyond float range: every later computation would overflow
            raise self.error(key, "expected an integer of at most 308 digits, got a longer one")
        if value < minimum:
            raise self.error(key, f"expected an integer >= {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise self.error(key, f"expected an integer <= {maximum}, got {value}")
        return value

    def string(self, key: str, default: Any = _MISSING, *, choices: Iterable[str] | None = None) -> str:
        value = self.raw(key, default)
        if value is default and default is not _MISSING:
            return value
        if not isinstance(value, str) or not value:
            raise self.error(key, f"expected a non-empty string, got {_type_name(value)} {value!r}")
        if choices is not None and value not in choices:
            raise self.error(key, f"expected one of {', '.join(map(str, choices))}; got {value!r}")
        return value

    def boolean(self, key: str, default: Any = _MISSING) -> bool:
        value = self.raw(key, default)
        if not isinstance(value, bool):
            raise self.error(key, f"expected true or false, got {_type_name(value)} {value!r}")
        return value

    def section(self, key: str, default: Any = _MISSING) -> "Section":
        value = self.raw(key, default)
        return Section(value, self.file, self._field(key))

    def items(self, key: str, default: Any = _MISSING, *, non_empty: bool = True) -> list:
        value = self.raw(key, default)
        if not isinstance(value, list):
            raise self.error(key, f"expected a list, got {_type_name(value)}")
        if non_empty and not value:
            raise self.error(key, "expected a non-empty list")
        return value

    def done(self) -> None:
        unknown = sorted(set(self.data) - self._read)
        if unknown:
            raise self.error(unknown[0], "unknown key (check the spelling; units are part of field names)")
