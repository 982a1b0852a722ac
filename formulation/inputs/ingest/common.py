"""Reading a measurement file: every failure is an `InputError` naming the file, so the CLI prints one line."""

from __future__ import annotations

from pathlib import Path

from formulation.errors import InputError


def read_text(path: str | Path) -> str:
    """The file's text (UTF-8; a stray non-UTF-8 byte in a captured terminal log is replaced, not fatal)."""
    path = Path(path)
    try:
        return path.read_bytes().decode("utf-8", errors="replace")
    except FileNotFoundError:
        raise InputError(str(path), "<root>", "file not found") from None
    except IsADirectoryError:
        raise InputError(str(path), "<root>", "expected a file, got a directory") from None
    except OSError as exc:
        raise InputError(str(path), "<root>", f"cannot read file: {exc.strerror}") from None
