"""Where a command's text output goes: standard output, or the file named by its `--out`."""

from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["write_output"]


def write_output(text: str, out: str | Path | None) -> None:
    """Write `text` to `out` (UTF-8), or to standard output when `out` is None."""
    if out is None:
        sys.stdout.write(text)
    else:
        Path(out).write_text(text, encoding="utf-8")
