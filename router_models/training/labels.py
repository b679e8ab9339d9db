"""Outcomes a user brings for their own model pair, and the gateway's own labels, as training examples.

Label file (`cascade router train --labels FILE`): JSON Lines, one prompt per line, UTF-8:

    {"prompt": "...", "needs_flagship": 1}                       # the micro answer fell short (0 = it did not)
    {"messages": [{"role": "user", "content": "..."}], "needs_flagship": 0.25}   # a probability is fine
    {"prompt": "...", "micro": 0.4, "flagship": 0.9}             # quality of each pool's answer, in [0, 1]
    {"prompt": "...", "pools": {"code": 0.0}}                     # a named pool's answer judged, in [0, 1]
    {"prompt": "...", "pools": {"general": 0.2, "code": 1.0}}     # several named pools' answers
    optional on every line: "id" (string), "source" (a name for your traffic; default "labels"), "tenant" (string)

Give `prompt` or `messages` (scored as the gateway scores them: `conversation_text`, the latest user turn first, and
`conversation_shape`, the turns and whole length; a `prompt` is one user turn), and either `needs_flagship` or both
`micro` and `flagship`, or named pools' qualities (`pools`), or both. `needs_flagship = p`
is read as micro quality `1 - p` against flagship quality 1. A pool's name is a policy's pool (labels per pool move
that pool's predicted quality in a `routing.tiers` policy, `router_models.serving.pool_labels`; `micro` and
`flagship` are its first and last tier); a row that names pools only (`LabelRow.has_gap` False) moves no two-pool
score and trains no router (`cascade router train` skips it). Rows from the gateway's ledger
(`ledger_labels.read_ledger_labels`) use the same fields, plus the shape the gateway saw of the conversation their
`prompt` came from (`"shape": {...}`, the counts named in `ledger_labels.SHAPE_FIELDS`). A bad row is refused with
its line number and field, and nothing is trained. Read for one tenant (`read_label_rows(..., tenant=T)`: `cascade
router memory add --tenant T`), a row whose "tenant" names another tenant is a bad row. Checks across rows (request
ids the ledger does not know, contradicting labels): `label_checks.py`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from router_models.serving.scorer import ConversationShape, prompt_shape, read_conversation
from router_models.training.outcomes import MAX_CHARS, Example, prompt_key

__all__ = ["LabelError", "LabelRow", "examples_from_rows", "label_rows", "read_label_file", "read_label_rows",
           "split_held_back"]


class LabelError(ValueError):
    """A label row is malformed: the message names the line (or row) and the field."""


@dataclass(frozen=True)
class LabelRow:
    """One label row read: its `example`, `where` it is (`file:line`, or `<origin> <n>` for rows not from a
    file), and the request id (`"id"`) and tenant (`"tenant"`) it names ("" when none)."""

    example: Example
    where: str
    request_id: str = ""
    tenant: str = ""
    pools: tuple[tuple[str, float], ...] = ()  # (pool name, quality) the row gives per named pool

    @property
    def has_gap(self) -> bool:
        """Whether the row gives micro and flagship quality (`needs_flagship`, or `micro` and `flagship`): the
        example's `weak` and `strong` are NaN when it names pools only."""
        return math.isfinite(self.example.weak)


def _quality(row: Mapping[str, Any], field: str, where: str) -> float:
    value = row[field]
    if isinstance(value, bool):
        value = int(value)
    if not isinstance(value, int | float) or not math.isfinite(value) or not 0.0 <= value <= 1.0:
        raise LabelError(f"{where}: field {field!r} must be a number in [0, 1], got {value!r}")
    return float(value)


def _text(row: Mapping[str, Any], where: str) -> tuple[str, ConversationShape]:
    if isinstance(row.get("prompt"), str) and row["prompt"].strip():
        prompt = str(row["prompt"]).strip()
        return prompt[:MAX_CHARS], _given_shape(row, where) or prompt_shape(prompt)
    messages = row.get("messages")
    if isinstance(messages, list) and messages and all(isinstance(m, Mapping) for m in messages):
        text, shape = read_conversation(messages)
        if text:
            return text, shape
    raise LabelError(f"{where}: give a non-empty 'prompt' string or a 'messages' list with text")


def _given_shape(row: Mapping[str, Any], where: str) -> ConversationShape | None:
    """The row's "shape" (what the gateway saw of the conversation a ledger row's prompt came from), if any."""
    given = row.get("shape")
    if given is None:
        return None
    counts = tuple(f.name for f in fields(ConversationShape) if f.name != "system_prompt")
    if not isinstance(given, Mapping) or not isinstance(given.get("system_prompt", False), bool) or any(
            isinstance(given.get(f, 0), bool) or not isinstance(given.get(f, 0), int) or given.get(f, 0) < 0
            for f in counts):
        raise LabelError(f"{where}: field 'shape' must be an object of counts ({', '.join(counts)}) "
                         "and 'system_prompt' (true or false)")
    base = ConversationShape()
    return ConversationShape(**{f: given.get(f, getattr(base, f)) for f in (*counts, "system_prompt")})


def _pool_qualities(row: Mapping[str, Any], where: str) -> dict[str, float]:
    """The row's qualities per named pool (`pools`); {} when it names none. (A ledger row's `pool`, the pool whose
    answer the client got, is information, not a label.)"""
    out: dict[str, float] = {}
    if "pools" in row:
        given = row["pools"]
        if not isinstance(given, Mapping) or not given:
            raise LabelError(f"{where}: field 'pools' must be an object of pool name -> quality (0..1), "
                             'e.g. {"general": 0.2, "code": 1}')
        for name in given:
            out[_pool_name(name, where)] = _quality(given, name, f"{where}: pools")
    return out


def _pool_name(name: Any, where: str) -> str:
    if not isinstance(name, str) or not name.strip() or name.strip().startswith("@"):
        raise LabelError(f"{where}: a pool's name must be a non-empty string not starting with '@' (a policy's "
                         f"pool), got {name!r}")
    return name.strip()


def _example(row: Any, where: str, default_source: str, pools: bool = False) -> Example:
    """The row's example; `pools`: the row names pools, so micro and flagship may be left out (then NaN)."""
    if not isinstance(row, Mapping):
        raise LabelError(f"{where}: expected a JSON object, got {type(row).__name__}")
    text, shape = _text(row, where)
    if "needs_flagship" in row:
        weak, strong = 1.0 - _quality(row, "needs_flagship", where), 1.0
    elif "micro" in row and "flagship" in row:
        weak, strong = _quality(row, "micro", where), _quality(row, "flagship", where)
    elif pools:
        weak = strong = math.nan
    else:
        raise LabelError(f"{where}: give 'needs_flagship' (0..1), both 'micro' and 'flagship' (0..1), or named "
                         "pools' qualities ('pools': {name: quality})")
    source = row.get("source", default_source)
    if not isinstance(source, str) or not source.strip():
        raise LabelError(f"{where}: field 'source' must be a non-empty string")
    return Example(text, f"labels:{source.strip()}", "labels", weak, strong, prompt_key(text), shape=shape)


def _optional_text(row: Mapping[str, Any], field: str, where: str) -> str:
    """The row's `field` ("" when absent or empty: a ledger row of a request kept without a tenant has "")."""
    value = row.get(field, "")
    if not isinstance(value, str):
        raise LabelError(f"{where}: field {field!r} must be a string, got {value!r}")
    return value.strip()


def _label_row(row: Any, where: str, default_source: str, tenant: str | None) -> LabelRow:
    pools = _pool_qualities(row, where) if isinstance(row, Mapping) else {}
    example = _example(row, where, default_source, bool(pools))
    request_id, owner = _optional_text(row, "id", where), _optional_text(row, "tenant", where)
    if tenant is not None and owner and owner != tenant:
        raise LabelError(f"{where}: field 'tenant' is {owner!r}, but these labels are for tenant {tenant!r}")
    return LabelRow(example, where, request_id, owner, tuple(pools.items()))


def label_rows(rows: Iterable[Any], default_source: str = "labels", origin: str = "row",
               tenant: str | None = None) -> list[LabelRow]:
    """Label rows (dicts) read; raises LabelError naming `origin` + row number on the first bad row."""
    return [_label_row(row, f"{origin} {n}", default_source, tenant) for n, row in enumerate(rows, start=1)]


def examples_from_rows(rows: Iterable[Any], default_source: str = "labels", origin: str = "row") -> list[Example]:
    """Examples from label rows (dicts) that give a gap (`LabelRow.has_gap`); raises LabelError naming `origin` +
    row number on the first bad row."""
    return [r.example for r in label_rows(rows, default_source, origin) if r.has_gap]


def read_label_rows(path: Path, default_source: str = "labels", tenant: str | None = None) -> list[LabelRow]:
    """Every row of a label file (format above), for `tenant` when given (a row naming another tenant is
    refused). Raises LabelError (file:line: field) on the first bad row, or FileNotFoundError."""
    out: list[LabelRow] = []
    with path.open(encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise LabelError(f"{where}: not valid JSON ({exc})") from exc
            out.append(_label_row(row, where, default_source, tenant))
    if not out:
        raise LabelError(f"{path}: no label rows")
    return out


def read_label_file(path: Path, default_source: str = "labels") -> list[Example]:
    """The examples of every row of a label file that gives a gap (`read_label_rows`, `LabelRow.has_gap`)."""
    return [r.example for r in read_label_rows(path, default_source) if r.has_gap]


def split_held_back(examples: Sequence[Example], share: float = 0.3) -> tuple[list[Example], list[Example]]:
    """(train, held back): a deterministic split by prompt key, so a prompt never lands on both sides."""
    import hashlib

    def held(ex: Example) -> bool:
        return int(hashlib.sha256(ex.key.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF < share

    return [e for e in examples if not held(e)], [e for e in examples if held(e)]
