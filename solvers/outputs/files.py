"""Atomic file writes: every output goes to a temporary file in the same directory and is renamed into place,
so a reader (or a crash) never sees half a file."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def _write_atomic(path: str | Path, write: Callable[[str], None], mode: int | None = None) -> Path:
    """Call `write(temporary_path)`, then rename the temporary file onto `path`. mode None: the umask's."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        if mode is None:  # mkstemp makes 0600; an output is an ordinary file
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_text_atomic(path: str | Path, text: str, executable: bool = False) -> Path:
    def write(tmp: str) -> None:
        Path(tmp).write_text(text)
    return _write_atomic(path, write, 0o755 if executable else None)


def write_json_atomic(path: str | Path, data: dict, indent: int = 2) -> Path:
    return write_text_atomic(path, json.dumps(data, indent=indent) + "\n")


def save_figure_atomic(fig, path: str | Path) -> Path:
    """A matplotlib figure as PNG."""
    return _write_atomic(path, lambda tmp: fig.savefig(tmp, format="png"))
