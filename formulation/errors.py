"""Input errors and a strict reader for nested JSON/YAML sections.

Every problem with user input becomes one `InputError` whose message names the file, the field path and
what was expected, so the CLI can print one line and exit with code 2.
"""

from __future__ import annotations

import codecs
import difflib
import json
import math
import os
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
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
# Bounds every number read from an input obeys unless its field sets its own: far beyond any real value, and
# narrow enough that every time the model derives stays a number the programs can scale to integers (a
# bandwidth of 1e-300 GB/s or a latency of 1e308 us made CP-SAT's domains overflow; a global batch of 1e18
# made the divisor enumeration run for hours)
MAX_INTEGER = 10**9
MAX_NUMBER = 1e9
MIN_POSITIVE = 1e-3
# A link: 10 MB/s (slower than 1 Gb Ethernet) to 1 PB/s
MIN_GB_PER_S, MAX_GB_PER_S = 0.01, 1e6


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
        if positive and value < MIN_POSITIVE:
            raise self.error(key, f"expected a positive number (at least {MIN_POSITIVE:g}), got {value!r}")
        if minimum is not None and value < minimum:
            raise self.error(key, f"expected a number >= {minimum:g}, got {value!r}")
        maximum = MAX_NUMBER if maximum is None else maximum
        if value > maximum:
            raise self.error(key, f"expected a number <= {maximum:g}, got {value!r}")
        return float(value)

    def bandwidth(self, key: str, default: Any = _MISSING) -> float:
        """A link's bandwidth in GB/s, in [MIN_GB_PER_S, MAX_GB_PER_S]."""
        return self.number(key, default, minimum=MIN_GB_PER_S, maximum=MAX_GB_PER_S)

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
        maximum = MAX_INTEGER if maximum is None else maximum
        if value > maximum:
            raise self.error(key, f"expected an integer <= {maximum:,}, got {value:,}")
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
    reject_lone_surrogates(data, file)
    return data


def reject_lone_surrogates(data: Any, file: str) -> None:
    """JSON's \\ud800-\\udfff escapes decode to unpaired surrogates, which no output (a table, a plan file) can
    encode: refused here, with the field, rather than failing when the plan is written. A walk that visits each
    container once: a YAML alias bomb is not expanded."""
    def lone(text: Any) -> bool:
        return isinstance(text, str) and any(0xD800 <= ord(c) <= 0xDFFF for c in text)

    path = field_path(data, lambda v: lone(v) or (isinstance(v, dict) and any(map(lone, v))))
    if path is not None:
        raise InputError(file, path, "text holds an unpaired UTF-16 surrogate escape (\\ud800-\\udfff)")


# Larger than any instance, placement, runs file or measurement log: a device such as /dev/zero would be read
# until memory runs out
MAX_INPUT_BYTES = 256 * 2**20


def file_problem(path: str | os.PathLike) -> str | None:
    """Why `path` cannot be an input file, or None: missing, a directory, not a regular file (a device is read
    forever, a pipe may block), larger than MAX_INPUT_BYTES, or unreadable."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return "file not found"
    except OSError as exc:
        return f"cannot read file: {exc.strerror or exc}"
    if stat.S_ISDIR(info.st_mode):
        return "expected a file, got a directory"
    if not stat.S_ISREG(info.st_mode):
        return "expected a regular file, got a device, pipe or socket"
    if info.st_size > MAX_INPUT_BYTES:
        return f"file of {info.st_size / 2**20:,.0f} MiB; an input file is at most {MAX_INPUT_BYTES // 2**20} MiB"
    return None


def read_input_bytes(path: str | os.PathLike, file: str | None = None, field: str = "<root>") -> bytes:
    """The bytes of an input file; every problem (file_problem, or the read itself) an `InputError` at `field`
    of `file` (default: the file itself)."""
    problem = file_problem(path)
    if problem is None:
        try:
            return Path(path).read_bytes()
        except OSError as exc:
            problem = f"cannot read file: {exc.strerror or exc}"
    if file is not None and file != str(path):
        problem = f"{path}: {problem}"
    raise InputError(file or str(path), field, problem)
