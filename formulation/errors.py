"""Input errors and a strict reader for nested JSON/YAML sections.

Every problem with user input becomes one `InputError` whose message names the file, the field path and
what was expected, so the CLI can print one line and exit with code 2.
"""

from __future__ import annotations

import codecs
import difflib
import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

# Longest field or problem text an error repeats: a megabyte-long value must not become a megabyte-long line.
MAX_ERROR_TEXT = 400


def _clip(text: str) -> str:
    """One line, of bounded length: keys and values from a file may hold line breaks."""
    text = text.replace("\r", "\\r").replace("\n", "\\n")
    return text if len(text) <= MAX_ERROR_TEXT else f"{text[:MAX_ERROR_TEXT]}... ({len(text):,} characters)"


class InputError(ValueError):
    """Bad input: `file: field: problem`. The CLI prints it on one line and exits with code 2."""

    def __init__(self, file: str | None, field: str, problem: str):
        self.file = file or "<input>"
        self.field = _clip(field or "<root>")
        self.problem = problem = _clip(problem)
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
        unknown = sorted(set(self.data) - self._read, key=str)  # YAML keys may be numbers too
        if unknown:
            raise self.error(unknown[0], "unknown key (check the spelling; units are part of field names)")


# ---- reading documents: JSON strictly (no NaN, no duplicate keys), text as UTF-8 ----------------------------

_BOMS = ((codecs.BOM_UTF32_LE, "UTF-32"), (codecs.BOM_UTF32_BE, "UTF-32"), (codecs.BOM_UTF16_LE, "UTF-16"),
         (codecs.BOM_UTF16_BE, "UTF-16"))


def decode_text(raw: bytes, file: str) -> str:
    """File bytes as UTF-8 text; a UTF-8 byte-order mark (as Windows editors write) is dropped. Other
    encodings, and files with nothing but whitespace, are `InputError`s."""
    for bom, encoding in _BOMS:
        if raw.startswith(bom):
            raise InputError(file, "<root>", f"file is {encoding} (it starts with a byte-order mark); save it as UTF-8")
    skip = len(codecs.BOM_UTF8) if raw.startswith(codecs.BOM_UTF8) else 0
    try:
        text = raw[skip:].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(file, "<root>", f"file is not valid UTF-8 (byte {exc.start + skip})") from None
    if not text.strip():
        raise InputError(file, "<root>", "file is empty" + (" (only whitespace)" if text else ""))
    return text


class DuplicatedMapping(dict):
    """A parsed mapping in which `key` appeared more than once (JSON and YAML silently keep the last)."""

    key: Any = None


def mapping_without_duplicates(pairs: list, found: list) -> dict:
    """A dict of `pairs`; when a key repeats, a `DuplicatedMapping` naming it, also appended to `found`."""
    out = dict(pairs)
    if len(out) == len(pairs):
        return out
    seen: set = set()
    marked = DuplicatedMapping(out)
    marked.key = next(k for k, _ in pairs if k in seen or seen.add(k))
    found.append(marked)
    return marked


def field_path(value: Any, match: Callable[[Any], bool]) -> str | None:
    """Field path, as errors spell it, of the first value (depth first) for which `match` holds; None if none.
    Each container is visited once, so YAML aliases (shared subtrees) cost nothing extra."""
    try:
        return _walk(value, match, "", set())
    except RecursionError:  # as deep as the parser allowed, deeper than this walk may go
        return None


def _walk(value: Any, match: Callable[[Any], bool], path: str, seen: set) -> str | None:
    if match(value):
        return path or "<root>"
    if not isinstance(value, (dict, list)) or id(value) in seen:
        return None
    seen.add(id(value))
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for key, item in items:
        sub = f"{path}[{key}]" if isinstance(value, list) else f"{path}.{key}" if path else str(key)
        found = _walk(item, match, sub, seen)
        if found:
            return found
    return None


def reject_duplicates(data: Any, found: list, file: str) -> None:
    """Raise the `InputError` for the first duplicated key recorded by `mapping_without_duplicates`."""
    if found:
        where = field_path(data, lambda v: v is found[0]) or "<root>"
        key = found[0].key
        field = str(key) if where == "<root>" else f"{where}.{key}"
        raise InputError(file, field, "duplicate key (the parser would silently keep only the last value)")


class _NonFiniteConstant(ValueError):
    pass


def _reject_constant(name: str):
    raise _NonFiniteConstant(f"{name} is not a valid number (JSON allows finite numbers only)")


def parse_json(text: str, file: str) -> Any:
    """Strict JSON: syntax errors, NaN/Infinity, duplicate keys and runaway nesting are `InputError`s."""
    found: list = []
    try:
        data = json.loads(text, parse_constant=_reject_constant,
                          object_pairs_hook=lambda pairs: mapping_without_duplicates(pairs, found))
    except json.JSONDecodeError as exc:
        raise InputError(file, "<root>", f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except _NonFiniteConstant as exc:  # NaN / Infinity: name the field, as every other error does
        try:
            path = field_path(json.loads(text), lambda v: isinstance(v, float) and not math.isfinite(v))
        except RecursionError:
            path = None
        raise InputError(file, path or "<root>", str(exc)) from None
    except RecursionError:
        raise InputError(file, "<root>", "invalid JSON: nested too deeply") from None
    except ValueError as exc:  # e.g. an integer longer than Python's 4300-digit conversion limit
        raise InputError(file, "<root>", str(exc)) from None
    reject_duplicates(data, found, file)
    return data
