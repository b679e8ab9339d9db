"""Batch scoring of a JSONL file (`cascade router score`).

Input lines: {"id": ..., "prompt": str} or {"id": ..., "messages": [...]}. Output lines, in input order:
{"id": ..., "score": float, "pool": str}, where pool is the flagship pool when score >= threshold. A bad
line (not JSON, no id, neither prompt nor messages) is reported on stderr with its line number and
skipped; blank lines are ignored.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from router_models.serving.classifier_scorer import BatchModel
from router_models.serving.scorer import ConversationShape, prompt_shape, read_conversation

__all__ = ["parse_line", "score_file", "score_rows"]


_Row = tuple[Any, str, ConversationShape]  # id, scoring text, the conversation's shape


def parse_line(line: str) -> _Row:
    """(id, text, shape) of one input line, as the gateway would score it; raises ValueError saying what is
    wrong."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON ({exc.msg})") from exc
    if not isinstance(row, Mapping) or "id" not in row:
        raise ValueError('expected an object with an "id"')
    if isinstance(row.get("prompt"), str):
        return row["id"], str(row["prompt"]), prompt_shape(str(row["prompt"]))
    messages = row.get("messages")
    if isinstance(messages, list) and all(isinstance(m, Mapping) for m in messages):
        text, shape = read_conversation(messages)
        if text:
            return row["id"], text, shape
        raise ValueError("messages hold no user or system text")
    raise ValueError('expected "prompt" (a string) or "messages" (a list of {role, content})')


def _read(lines: Iterable[str], err: TextIO) -> tuple[list[_Row], int]:
    good: list[_Row] = []
    bad = 0
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            good.append(parse_line(line))
        except ValueError as exc:
            bad += 1
            print(f"line {number}: skipped: {exc}", file=err)
    return good, bad


def _load_model(artifact: Path | None) -> BatchModel:
    from router_models.serving.classifier_scorer import load_model

    return load_model(str(artifact) if artifact else None)


def score_rows(
    rows: Sequence[_Row], model: BatchModel, threshold: float, pools: tuple[str, str], batch: int
) -> Iterable[str]:
    """Output JSON lines for (id, text, shape) rows, scoring `batch` texts per model call."""
    micro, flagship = pools
    for start in range(0, len(rows), batch):
        part = rows[start : start + batch]
        for (rid, _, _), score in zip(part, model([t for _, t, _ in part], [s for _, _, s in part]), strict=True):
            pool = flagship if score >= threshold else micro
            yield json.dumps({"id": rid, "score": round(score, 6), "pool": pool}, ensure_ascii=False)


def score_file(
    inp: Path, out: Path, artifact: Path | None, threshold: float, pools: tuple[str, str], batch: int,
    model: BatchModel | None = None, err: TextIO | None = None,
) -> int:
    """Score `inp` into `out` ('-' means stdin/stdout). Returns 0, or 1 if any line was skipped."""
    err = err or sys.stderr
    with (sys.stdin if str(inp) == "-" else inp.open(encoding="utf-8")) as fh:
        rows, bad = _read(fh, err)
    model = model or _load_model(artifact)
    lines = score_rows(rows, model, threshold, pools, max(1, batch))
    if str(out) == "-":
        for line in lines:
            print(line)
    else:
        with out.open("w", encoding="utf-8") as fh:
            fh.writelines(line + "\n" for line in lines)
    if bad:
        print(f"{bad} bad line(s) skipped; {len(rows)} scored", file=err)
    return 1 if bad else 0

