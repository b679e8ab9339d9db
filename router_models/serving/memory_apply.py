"""One named label memory applied as the gateway applies it: shared by the gateway
(`gateway.serving.routing.label_memories`) and the offline tools (`cascade router score --memory`,
`cascade router route --memory`), so what a user measures offline on labelled traffic they held back is what their
labels would do to served requests.

Contract:
- Memories live at `<store>/memory/<name>.json` (+ `.npz`): `<name>` is a tenant's name or "shared"
  (`router_models.serving.memory_file.memory_path`); the store is `$CASCADE_HOME/router` by default.
- `attach_file` loads one memory verified (`memory_file.load_memory`: format, features, payload hash, the scorer's
  embedder) and attaches it to the router being served (`AttachedMemory`: its gap labels move the score,
  `MemoryRouter.attach`; its labels per pool move a `routing.tiers` policy's tiers, `pool_labels.PoolLabels`); a
  memory that reads a request's whole feature row is refused (ValueError) where the scorer keeps no feature rows.
- `request_rows` is the row a memory reads of each request: the embedding alone, or (`MemoryRouter.reads_features`)
  the whole feature row (the embedding, then the structural columns the scorer computed beside it). The move itself
  is `MemoryRouter.adjust` (row by row independent: a batch moves each row as alone).
- `gap_moves` is what a move did on the memory's own scale (the quality gap bottom -> top tier mapped to [0, 1],
  `label_memory.gap_target`; `gap_move` for one request): a `routing.tiers` trade of a memory with no labels per
  pool (written before them) shifts its tiers' predicted quality by it (`policies.tiers.remembered`); one with labels
  per pool moves each tier by its own labels instead (`pool_labels.TierLabels.moves`, `policies.tiers.moved`).
- `attach_named` is the offline tools' entry: an unknown or malformed name is an `ArtifactError` that lists the
  memories there are and how to write one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from router_models.serving.artifact import ArtifactError
from router_models.serving.classifier import LinearRouter
from router_models.serving.label_memory import LabelMemory, MemoryRouter
from router_models.serving.memory_file import load_memory, memory_path
from router_models.serving.pool_labels import PoolLabels

__all__ = ["AttachedMemory", "attach_file", "attach_named", "gap_move", "gap_moves", "memory_names",
           "request_rows"]

_EPS = 1e-6


def memory_names(store: Path) -> list[str]:
    """The memories under `<store>/memory` (file stems), sorted."""
    folder = store / "memory"
    return sorted(p.stem for p in folder.glob("*.json")) if folder.is_dir() else []


@dataclass(frozen=True)
class AttachedMemory:
    """One label memory (`memory`, every label) attached to a router: `score` moves the router's score by its gap
    labels, `pools` a tiers policy's predicted qualities by its labels per pool (None: it has none)."""

    memory: LabelMemory
    score: MemoryRouter
    pools: PoolLabels | None

    @classmethod
    def attach(cls, base: LinearRouter, memory: LabelMemory) -> AttachedMemory:
        return cls(memory, MemoryRouter.attach(base, memory), PoolLabels.of(memory))

    @property
    def labels(self) -> int:
        """Every label (gap labels and labels per pool)."""
        return len(self.memory)

    @property
    def base(self) -> LinearRouter:
        return self.score.base

    def on(self, base: LinearRouter) -> AttachedMemory:
        """The same labels attached to `base` (a swapped router; the labels per pool do not read it)."""
        return self if base is self.base else AttachedMemory(self.memory, MemoryRouter.attach(base, self.memory),
                                                             self.pools)


def attach_file(path: Path, base: LinearRouter, embedder: str, keeps_features: bool) -> AttachedMemory:
    """The memory at `path`, verified and attached to `base` (module docstring). Raises `ArtifactError` or
    ValueError."""
    memory, _ = load_memory(path, embedder=embedder)
    attached = AttachedMemory.attach(base, memory)
    if attached.score.reads_features and not keeps_features:  # `adjust` could read the embedding alone
        raise ValueError(f"it reads {_what_it_reads(attached.score)} of each request, which this scorer does not "
                         "keep per request")
    return attached


def attach_named(store: Path, name: str, base: LinearRouter, embedder: str) -> AttachedMemory:
    """Memory `name` ("shared" or a tenant's) of `store`, attached to `base`. `ArtifactError` for a name that is
    malformed or names no memory (listing those there are), or a memory that does not load."""
    try:
        path = memory_path(store, name)
    except ValueError as exc:
        raise ArtifactError(f"--memory: {exc}") from exc
    if not path.is_file():
        there = memory_names(store)
        raise ArtifactError(f"--memory {name!r}: no label memory {path} (memories in {path.parent}: "
                            f"{', '.join(there) if there else 'none'}); give \"shared\" or a tenant's name, or write "
                            "one with `cascade router memory add [--tenant NAME] LABELS.jsonl`")
    try:
        return attach_file(path, base, embedder, keeps_features=True)
    except ValueError as exc:
        raise ArtifactError(f"label memory {path}: {exc}") from exc


def request_rows(attached: MemoryRouter, vectors: npt.NDArray[np.floating] | None,
                 features: npt.NDArray[np.floating] | None) -> npt.NDArray[np.float32] | None:
    """The rows `attached` reads of requests whose embeddings are `vectors` (n, e) and whole feature rows (the
    embedding, then the structural columns) `features` (n, d): the whole rows when it reads them, else the
    embeddings; None when the one it reads is not there (a scorer that kept none)."""
    row = features if attached.reads_features else vectors
    return None if row is None else np.asarray(row, np.float32).reshape(-1, row.shape[-1])


def gap_moves(attached: MemoryRouter, before: npt.NDArray[np.floating],
              after: npt.NDArray[np.floating]) -> npt.NDArray[np.float64]:
    """How far a move took each request's predicted gap target (bottom -> top tier, on [0, 1]): scores `before`
    and `after` the move both read on the memory's scale (`MemoryRouter.back`: the scale a moved score returned
    from), after minus before. 0 where the memory did not move the score."""
    slope, level = attached.back

    def read(scores: npt.NDArray[np.floating]) -> npt.NDArray[np.float64]:
        p = np.clip(np.asarray(scores, np.float64), _EPS, 1.0 - _EPS)
        z = slope * (np.log(p) - np.log1p(-p)) + level
        return np.asarray(1.0 / (1.0 + np.exp(-np.clip(z, -40.0, 40.0))), np.float64)

    return np.asarray(read(after) - read(before), np.float64)


def gap_move(attached: MemoryRouter, before: float, after: float) -> float:
    """`gap_moves` of one request on Python floats (the gateway's per-request path: numpy's per-call cost on
    one-element arrays is most of the work there); equal to its last bits."""
    slope, level = attached.back

    def read(score: float) -> float:
        p = min(max(score, _EPS), 1.0 - _EPS)
        z = slope * (math.log(p) - math.log1p(-p)) + level
        return 1.0 / (1.0 + math.exp(-min(max(z, -40.0), 40.0)))

    return read(after) - read(before)


def _what_it_reads(attached: MemoryRouter) -> str:
    """What of a request's feature row beyond its embedding a memory reads (for the refusal)."""
    p = attached.memory.params
    parts = [f"the structural columns (structure {p.structure:g})"] if p.structure > 0 else []
    if attached.source_logits.shape[1]:
        parts.append(f"the whole row for the router's per-source routers (sources {p.sources:g})")
    return " and ".join(parts)
