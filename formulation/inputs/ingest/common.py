"""Reading a measurement file: every failure is an `InputError` naming the file, so the CLI prints one line."""

from __future__ import annotations

from pathlib import Path

from formulation.errors import read_input_bytes


def read_text(path: str | Path) -> str:
    """The file's text (UTF-8; a stray non-UTF-8 byte in a captured terminal log is replaced, not fatal)."""
    return read_input_bytes(path).decode("utf-8", errors="replace")
