"""Batch scoring of a JSONL file (`cascade router score`).

Input lines: {"id": ..., "prompt": str} or {"id": ..., "messages": [...]}. Output lines, in input order:
{"id": ..., "score": float, "pool": str, "in_domain": float | null}, where pool is the flagship pool when
score >= threshold and `in_domain` is how close the prompt is to the router's training data
(`router_models.serving.domain`; null when the artifact has no domain reference, which stderr then says once).
A bad line (not JSON, no id, neither prompt nor messages) is reported on stderr with its line number and
skipped; blank lines are ignored.

With a label memory (`--memory NAME`: "shared" or a tenant's, `memory_apply.attach_named`), each score is moved by it
exactly as the gateway moves a served request's (`memory_apply.request_rows` and `MemoryRouter.adjust`), the pool
follows the moved score, and the line also carries "router_score" (the score before the move). Only the memory's
gap labels move a score, as in the gateway; its labels per pool move a tiers policy's tiers (`cascade router route
--memory`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from router_models.serving.classifier_scorer import BatchModel, BatchScores, EmbeddingModel, score_texts
from router_models.serving.domain import DomainReference
from router_models.serving.label_memory import MemoryRouter
from router_models.serving.memory_apply import request_rows
from router_models.serving.scorer import ConversationShape, prompt_shape, read_conversation

__all__ = ["moved_scores", "parse_line", "score_file", "score_rows"]


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


def _load_model(artifact: Path | None) -> tuple[BatchModel, DomainReference | None]:
    """The artifact's model and its domain reference (None: it has none)."""
    from router_models.serving.classifier_scorer import load_model
    from router_models.serving.domain_file import reference_for
    from router_models.serving.refined_model import rows_artifact

    model = load_model(str(artifact) if artifact else None)
    found = reference_for(rows_artifact(artifact), model.embedder_name)  # the front's rows, in two stages
    return model, None if found is None else found[0]


def _attach(model: BatchModel, store: Path, name: str) -> MemoryRouter:
    """Memory `name` of `store` attached to `model`'s router, as the gateway attaches it to the scorer's."""
    from router_models.serving.artifact import ArtifactError
    from router_models.serving.classifier_scorer import EmbeddingClassifier
    from router_models.serving.memory_apply import attach_named

    if not isinstance(model, EmbeddingClassifier):
        raise ArtifactError("--memory needs a router artifact with an embedder and a trained head (label memories "
                            "take their residuals against it)")
    return attach_named(store, name, model.router, model.embedder_name).score  # score reads no tiers


def score_rows(
    rows: Sequence[_Row], model: BatchModel, threshold: float, pools: tuple[str, str], batch: int,
    domain: DomainReference | None = None, memory: MemoryRouter | None = None,
) -> Iterable[str]:
    """Output JSON lines for (id, text, shape) rows, scoring `batch` texts per model call; `in_domain` from
    `domain` and the model's own embeddings (null without a reference or a model that gives no embeddings);
    scores moved by `memory` (module docstring)."""
    micro, flagship = pools
    for start in range(0, len(rows), batch):
        part = rows[start : start + batch]
        scored = score_texts(model, [t for _, t, _ in part], [s for _, _, s in part],
                             domain is not None or memory is not None, domain)
        figures: list[float | None] = list(scored.figures) if scored.figures is not None else [None] * len(part)
        moved = scored.scores if memory is None else moved_scores(memory, scored)
        for (rid, _, _), score, before, figure in zip(part, moved, scored.scores, figures, strict=True):
            pool = flagship if score >= threshold else micro
            line = {"id": rid, "score": round(score, 6), "pool": pool, "in_domain": figure}
            if memory is not None:
                line["router_score"] = round(before, 6)
            yield json.dumps(line, ensure_ascii=False)


def moved_scores(memory: MemoryRouter, scored: BatchScores) -> list[float]:
    """A batch's scores moved by `memory` as the gateway moves them (the rows it reads: `request_rows`). ValueError
    when the model gave no embeddings (or no structural columns, for a memory that reads them)."""
    features = (None if scored.vectors is None or scored.structure is None
                else np.hstack([scored.vectors, scored.structure]))
    rows = request_rows(memory, scored.vectors, features)
    if rows is None:
        raise ValueError("the label memory reads rows this model does not give (embeddings and structural columns)")
    return [float(v) for v in memory.adjust(rows, np.asarray(scored.scores, np.float64))]


def score_file(
    inp: Path, out: Path, artifact: Path | None, threshold: float, pools: tuple[str, str], batch: int,
    model: BatchModel | None = None, err: TextIO | None = None, domain: DomainReference | None = None,
    memory: tuple[Path, str] | None = None,
) -> int:
    """Score `inp` into `out` ('-' means stdin/stdout). Returns 0, or 1 if any line was skipped. `model` (and
    `domain`, its reference) replace the artifact's. `memory`: (store, name) of the label memory that moves the
    scores (`ArtifactError` when it names none, or the model has no router it can attach to)."""
    err = err or sys.stderr
    with (sys.stdin if str(inp) == "-" else inp.open(encoding="utf-8")) as fh:
        rows, bad = _read(fh, err)
    if model is None:
        model, domain = _load_model(artifact)
    if domain is None or not isinstance(model, EmbeddingModel):
        print("in_domain: null on every row: the artifact has no domain reference (build one with "
              "`cascade router domain build`)", file=err)
    attached = None if memory is None else _attach(model, *memory)
    lines = score_rows(rows, model, threshold, pools, max(1, batch), domain, attached)
    if str(out) == "-":
        for line in lines:
            print(line)
    else:
        with out.open("w", encoding="utf-8") as fh:
            fh.writelines(line + "\n" for line in lines)
    if bad:
        print(f"{bad} bad line(s) skipped; {len(rows)} scored", file=err)
    return 1 if bad else 0

