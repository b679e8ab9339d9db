"""Set `routing.threshold` in policy YAML text, touching only that line. Pure (text in, text out).

Comments, ordering and every other line stay as they were. The `threshold:` line directly under the
top-level `routing:` block is replaced (its trailing comment kept when the old value was a plain scalar);
a block-style share mapping below it (more-indented lines) is removed with it; without such a line, one
is added as the first key of the block. Flow-style `routing: {...}` is not edited (`ThresholdEditError`).
The caller validates the result with the loader before writing it.
"""

from __future__ import annotations

import re

__all__ = ["ThresholdEditError", "set_routing_threshold"]

_TOP_KEY = re.compile(r"^[^\s#][^:]*:")
_THRESHOLD = re.compile(r"^(?P<indent>\s+)threshold:(?P<value>[^#]*)(?P<comment>#.*)?$")


class ThresholdEditError(ValueError):
    """The text has no block-style top-level `routing:` mapping to edit."""


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _block(lines: list[str]) -> tuple[int, int]:
    """(index of the `routing:` line, index after its block)."""
    start = next((i for i, line in enumerate(lines) if re.match(r"^routing:\s*(#.*)?$", line)), None)
    if start is None:
        raise ThresholdEditError("no block-style top-level `routing:` mapping found; edit the threshold by hand")
    end = start + 1
    while end < len(lines) and not _TOP_KEY.match(lines[end]):
        end += 1
    return start, end


def _child_indent(lines: list[str], start: int, end: int) -> int:
    children = [_indent(line) for line in lines[start + 1:end] if line.strip() and not line.lstrip().startswith("#")]
    return children[0] if children else 2


def set_routing_threshold(text: str, value: str) -> str:
    """`text` with `routing.threshold` set to `value` (YAML, e.g. ``0.42`` or ``{flagship_share: 0.3}``)."""
    lines = text.splitlines(keepends=True)
    start, end = _block(lines)
    indent = _child_indent(lines, start, end)
    for i in range(start + 1, end):
        match = _THRESHOLD.match(lines[i].rstrip("\n"))
        if match is None or len(match["indent"]) != indent:
            continue
        stop = i + 1
        if not match["value"].strip():  # block-style mapping: drop its more-indented lines
            while stop < end and lines[stop].strip() and _indent(lines[stop]) > indent:
                stop += 1
        comment = match["comment"] if match["comment"] and not match["value"].strip().startswith("{") else None
        new = f"{' ' * indent}threshold: {value}" + (f"  {comment}" if comment else "") + "\n"
        return "".join([*lines[:i], new, *lines[stop:]])
    new = f"{' ' * indent}threshold: {value}\n"
    return "".join([*lines[:start + 1], new, *lines[start + 1:]])
