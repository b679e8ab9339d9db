"""Promote or remove a pool's canary in policy YAML text, touching only that pool's lines. Pure (text in, text out).

Comments and every other line stay as they were. A key's block is its line and the lines below it that are
blank, comments, or more indented (so block style and flow style spread over several lines both work).
- `remove_canary`: the `canary:` block of `pools.<name>` is deleted.
- `promote_canary`: the pool's `engine:` block is replaced by the canary's `engine:` block, shifted to the pool's
  indentation, and the `canary:` block is deleted.
Flow-style `pools: {...}` or pool entries are not edited (`CanaryEditError`). The caller validates the result with
the loader (and that it says what was meant) before writing it.
"""

from __future__ import annotations

import re

__all__ = ["CanaryEditError", "promote_canary", "remove_canary"]


class CanaryEditError(ValueError):
    """The text has no block-style entry to edit (the message says which); edit the policy by hand."""


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _inside(line: str, indent: int) -> bool:
    """Whether `line` belongs to the block of a key indented by `indent`."""
    return not line.strip() or line.lstrip().startswith("#") or _indent(line) > indent


def _key(lines: list[str], start: int, end: int, key: str, indent: int | None) -> tuple[int, int]:
    """(index of the `key:` line directly in `lines[start:end]` at `indent` (None: the first child indent), index
    after its block). Raises `CanaryEditError` when there is none."""
    children = [_indent(x) for x in lines[start:end] if x.strip() and not x.lstrip().startswith("#")]
    level = indent if indent is not None else (children[0] if children else 0)
    pattern = re.compile(rf"^ {{{level}}}{re.escape(key)}\s*:(\s|$)")
    for i in range(start, end):
        if pattern.match(lines[i]):
            stop = i + 1
            while stop < end and _inside(lines[stop], level):
                stop += 1
            while stop > i + 1 and not lines[stop - 1].strip():  # a blank line after the block stays
                stop -= 1
            return i, stop
    raise CanaryEditError(f"no block-style `{key}:` found where expected; edit the policy by hand")


def _pool(lines: list[str], name: str) -> tuple[int, int]:
    pools, end = _key(lines, 0, len(lines), "pools", 0)
    if lines[pools].split(":", 1)[1].strip().startswith("{"):
        raise CanaryEditError("`pools:` is written in flow style; edit the policy by hand")
    return _key(lines, pools + 1, end, name, None)


def remove_canary(text: str, pool: str) -> str:
    """`text` without `pools.<pool>.canary`."""
    lines = text.splitlines(keepends=True)
    start, end = _pool(lines, pool)
    canary, stop = _key(lines, start + 1, end, "canary", None)
    return "".join([*lines[:canary], *lines[stop:]])


def promote_canary(text: str, pool: str) -> str:
    """`text` with `pools.<pool>.engine` set to its canary's engine and the canary removed."""
    lines = text.splitlines(keepends=True)
    start, end = _pool(lines, pool)
    canary, canary_end = _key(lines, start + 1, end, "canary", None)
    engine, engine_end = _key(lines, start + 1, end, "engine", _indent(lines[canary]))
    new_engine, new_end = _key(lines, canary + 1, canary_end, "engine", None)
    shift = _indent(lines[new_engine]) - _indent(lines[engine])
    moved = [line[shift:] if line.strip() and _indent(line) >= shift else line.lstrip(" ")
             for line in lines[new_engine:new_end]]
    spans = sorted([(engine, engine_end, moved), (canary, canary_end, [])])
    out, at = [], 0
    for first, stop, replacement in spans:
        out += [*lines[at:first], *replacement]
        at = stop
    return "".join([*out, *lines[at:]])
