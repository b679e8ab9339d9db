"""`cascade router memory add`: a user's labels appended to their label memory, no training.

Each label row (a label file, format in `labels.py`) is embedded as the gateway scores it (the artifact's
embedder, the structural features of its text and conversation shape) and appended, with its target
(`label_memory.gap_target`; NaN for a row that names pools only) and its qualities per pool (its micro and flagship
quality as `pool_labels.MICRO` and `FLAGSHIP`, and each pool it names: `router_models.serving.pool_labels`), to the
memory at `<store>/memory/<name>.json` (`memory_file`; `<name>`: a tenant,
or "shared" for labels every tenant's scores read). A running gateway that serves label memories picks the new
file up within seconds. The memory's parameters are the ones measured on the learning curve (MODEL_CARD.md,
"Learning curve"), unless the file already has its own. Labels taken from the gateway's ledger
(`ledger_label_rows`) are recorded by request id in the memory's metadata (`LEDGER_REQUESTS`), and a request already
taken is not taken again (a rating changed after it was taken is not re-read).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from router_models.embedders.factory import make_embedder
from router_models.serving.artifact import load_artifact
from router_models.serving.classifier import feature_matrix
from router_models.serving.label_memory import LabelMemory, MemoryParams, gap_target
from router_models.serving.memory_file import SHARED, load_memory, memory_path, memory_paths, save_memory
from router_models.serving.pool_labels import FLAGSHIP, MICRO
from router_models.serving.refined_model import refine_choice, refine_front
from router_models.training.labels import LabelRow
from router_models.training.outcomes import Example

__all__ = ["LEDGER_REQUESTS", "SHARED", "MemoryUpdate", "add_label_rows", "add_labels", "ledger_label_rows",
           "memory_path", "taken_from_ledger"]

LEDGER_REQUESTS = "ledger_requests"  # the memory metadata's list of request ids whose ledger labels it holds

@dataclass(frozen=True)
class MemoryUpdate:
    """What `add_labels` did: the file written, labels before and after, prompts with conflicting labels."""

    path: Path
    before: int
    after: int
    conflicting_prompts: int


def add_labels(rows: list[Example], path: Path, artifact: Path | None = None,
               params: MemoryParams | None = None, pools: Sequence[Mapping[str, float]] = (),
               ledger_ids: Sequence[str] = ()) -> MemoryUpdate:
    """Append `rows` to the memory at `path` (created when missing), on the vectors of `artifact`'s embedder
    (default: the artifact the gateway serves); `pools`: each row's qualities per named pool (`LabelRow.pools`;
    empty: none); `ledger_ids`: the ledger's request ids among them, added to the ones the memory records it took
    (`LEDGER_REQUESTS`, kept across every add). Raises `ArtifactError` when the existing memory is unreadable or holds
    another embedder's vectors (nothing is written then)."""
    art = load_artifact(refine_front(artifact, refine_choice()) or artifact)  # the rows a two-stage scorer hands out
    embedder = make_embedder(art.embedder)
    texts = [ex.text for ex in rows]
    x = feature_matrix(embedder.embed(texts), texts, [ex.shape for ex in rows])  # as the scorer computes them
    meta_path, _ = memory_paths(path)
    taken: list[str] = []
    if meta_path.exists():
        memory, meta = load_memory(meta_path, embedder=embedder.name)
        taken = [str(rid) for rid in meta.get(LEDGER_REQUESTS) or ()]
    else:
        memory = LabelMemory.empty(x.shape[1], embedder.dim, params or MemoryParams())
    named = list(pools) or [{}] * len(rows)
    grown = memory.extended(x, np.asarray([gap_target(ex.weak, ex.strong) for ex in rows], np.float64),
                            [ex.key for ex in rows], [_qualities(ex, given) for ex, given in zip(rows, named,
                                                                                               strict=True)])
    recorded = sorted({*taken, *ledger_ids})
    save_memory(grown, meta_path, embedder.name, {LEDGER_REQUESTS: recorded} if recorded else None)
    return MemoryUpdate(meta_path, len(memory), len(grown), grown.conflicts())


def add_label_rows(rows: Sequence[LabelRow], path: Path, artifact: Path | None = None,
                   ledger: Sequence[LabelRow] = ()) -> MemoryUpdate:
    """`add_labels` of label rows as read (`labels.read_label_rows`): each with its qualities per named pool, and of
    the `ledger`'s rows (`ledger_label_rows`) those whose request the memory has not taken yet (`taken_from_ledger`),
    so adding the ledger again adds only what is new. Nothing new: nothing is written."""
    taken = taken_from_ledger(path)
    fresh = [r for r in ledger if r.request_id not in taken]
    every = [*rows, *fresh]
    if not every:
        meta_path, _ = memory_paths(path)
        kept = load_memory(meta_path)[0] if meta_path.exists() else None
        return MemoryUpdate(meta_path, len(kept or ()), len(kept or ()), 0 if kept is None else kept.conflicts())
    return add_labels([r.example for r in every], path, artifact, pools=[dict(r.pools) for r in every],
                      ledger_ids=[r.request_id for r in fresh if r.request_id])


def taken_from_ledger(path: Path) -> frozenset[str]:
    """The request ids whose ledger labels the memory at `path` already holds (none when there is no memory)."""
    meta_path, _ = memory_paths(path)
    if not meta_path.exists():
        return frozenset()
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    return frozenset(str(rid) for rid in meta.get(LEDGER_REQUESTS) or ())


def ledger_label_rows(redis_url: str, key_prefix: str, tenant: str | None = None) -> list[LabelRow]:
    """The gateway ledger's label rows (`ledger_labels.read_ledger_labels`: gap labels, and the client's feedback as
    the quality of the pool that served each answer, `pools`), `tenant`'s only when given (the ledger holds every
    tenant's). Raises `redis.RedisError` when the ledger cannot be read, `LabelError` on a malformed row."""
    from router_models.training.labels import label_rows
    from router_models.training.ledger_labels import read_ledger_labels

    rows = read_ledger_labels(redis_url, key_prefix=key_prefix)
    mine = [row for row in rows if tenant is None or row.get("tenant") == tenant]
    return label_rows(mine, default_source="ledger", origin="ledger row", tenant=tenant)


def _qualities(example: Example, named: Mapping[str, float]) -> dict[str, float]:
    """A label's qualities per pool: its micro and flagship quality (when it gives them) and the pools it names."""
    ends = {MICRO: example.weak, FLAGSHIP: example.strong} if math.isfinite(example.weak) else {}
    return ends | dict(named)
