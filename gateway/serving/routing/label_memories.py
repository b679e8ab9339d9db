"""The label memories a running gateway reads: a tenant's labels move its requests' scores, at once.

`cascade router memory add --tenant T` writes `<store>/memory/T.json` (+ `.npz`), `--tenant` omitted
`shared.json` (`router_models.training.memory_build`). The policy's `learning.label_memory.scope` says which one a
request reads: `tenant` (its tenant's own memory: one tenant's labels never move another's scores), `shared`
(the shared one) or `none` (the default).

`LabelMemories` polls the folder (`interval_s`) and reloads a memory whose files changed, in a worker thread,
verified (`memory_file.load_memory`: format, features, the payload's hash, and the scorer's embedder); a memory
that fails to load is logged and the one loaded before keeps serving. Each memory is attached to the router the
scorer serves (`router_models.serving.label_memory.MemoryRouter`: its residuals are against that router), and
re-attached when a router swap brings another (until then, at most `interval_s`, the new router's scores are
not moved). Memory names are tenant names of at most 40 characters
(`memory_build.memory_path`): a longer tenant's requests get no memory. `adjust` moves one score by one memory:
only a score of the primary model, whose embedding the scorer kept (`Scorer` as `EmbeddingSource`), and for a
memory whose similarity reads the structural columns (`MemoryParams.structure` > 0) its whole feature row
(`FeatureSource`: the scorer keeps the columns its worker thread computed, so nothing is computed on the event
loop); anything else keeps its score. A scorer that keeps no feature rows refuses such a memory at load.
`adjust` takes the scorer as the router checked it once (`ScorerViews`), not checked again per request. The router
calls `adjust_off_loop`: the request's kept row is read on the event loop, and a memory of more than `INLINE_LABELS`
labels is moved in a worker thread, batched with the moves waiting beside it (`memory_batches`: the move's cost grows
with the labels; the loop serves every other request meanwhile).

A memory's labels per pool (`router_models.serving.pool_labels`) move a `routing.tiers` policy's tiers (`tier_moves`):
each tier's predicted quality by that tier's labels near the request, against the quality model and placements the
request was predicted with (their residuals computed once per memory, map and placements, and kept); in a worker
thread past `inline_labels` labels, as the score's move.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from backends.background import stop
from gateway.serving.routing.memory_batches import MoveBatcher
from gateway.serving.routing.tier_trade import QualityModel
from policies.tiers import TierEstimate, moved, remembered
from router_models.serving.artifact import ArtifactError
from router_models.serving.classifier import LinearRouter
from router_models.serving.memory_apply import AttachedMemory, attach_file, gap_move, request_rows
from router_models.serving.pool_labels import TierLabels
from router_models.serving.scorer import ConversationShape, Scorer, ScorerViews

__all__ = ["INLINE_LABELS", "LabelMemories", "MemoryScore"]

log = logging.getLogger("cascade.router")

_Stamp = tuple[float, int, float, int]  # the metadata's and the payload's (mtime, size)
# A memory of at most this many labels moves a score on the event loop (`adjust_off_loop`); a larger one in a worker
# thread. On a 2-vCPU AMD EPYC a move took 0.18 ms (median) at 2,000 labels, 0.29 ms at 10,000 and 3.1 ms at 30,000
# (its matrix past the CPU's cache), and a worker thread's round trip 0.07 ms (p99 2 ms)
INLINE_LABELS = 5000


@dataclass(frozen=True)
class MemoryScore:
    """A score moved by memory `name`, which held `labels` labels: `version` names both for the records. `gap`:
    how far the move took the predicted quality gap target on the memory's scale (`memory_apply.gap_move`; a
    `routing.tiers` trade shifts its tiers by it)."""

    score: float
    name: str
    labels: int
    gap: float = 0.0

    def version(self, router_version: str) -> str:
        """`<router version>+memory/<name>@<labels>`: a name the ledger accepts (no ":"; the router's version
        and a memory name of at most 40 characters keep it under its 128)."""
        return f"{router_version}+memory/{self.name}@{self.labels}"


def _stamp(meta: Path) -> _Stamp | None:
    try:
        a, b = os.stat(meta), os.stat(meta.with_suffix(".npz"))
    except OSError:
        return None
    return (a.st_mtime, a.st_size, b.st_mtime, b.st_size)


class LabelMemories:
    """The memories under `folder`, attached to the current scorer's router. Owns one polling task (`start`,
    `aclose`). `current()` gives the scorer being served (it changes on a router swap)."""

    def __init__(self, folder: Path, current: Callable[[], Scorer | None], interval_s: float = 2.0,
                 inline_labels: int | None = None) -> None:
        self.folder = folder
        self.inline_labels = INLINE_LABELS if inline_labels is None else inline_labels
        self._moves = MoveBatcher()
        self._current = current
        self._interval = interval_s
        self._attached: dict[str, AttachedMemory] = {}
        self._tiers: dict[str, tuple[tuple[object, ...], TierLabels]] = {}  # per memory: its residuals, and against
        # which labels, quality model and placements (by identity: a reload or a router swap brings new ones)
        self._stamps: dict[str, _Stamp] = {}
        self._base: LinearRouter | None = None
        self._task: asyncio.Task[None] | None = None
        self.on_inline: Callable[[], None] | None = None
        """Told of each move made on the calling thread (the metrics: `cascade_label_memory_moves{path="inline"}`);
        the batched ones go to `on_batch`."""

    @property
    def on_batch(self) -> Callable[[int], None] | None:
        """Told each worker-thread batch's size (`MoveBatcher.on_batch`)."""
        return self._moves.on_batch

    @on_batch.setter
    def on_batch(self, hook: Callable[[int], None] | None) -> None:
        self._moves.on_batch = hook

    def names(self) -> list[str]:
        return sorted(self._attached)

    def labels(self, name: str) -> int:
        """Labels in memory `name` as loaded now (0: none loaded)."""
        attached = self._attached.get(name)
        return 0 if attached is None else attached.labels

    def adjust(self, name: str, views: ScorerViews, text: str, score: float,
               shape: ConversationShape | None = None) -> MemoryScore | None:
        """`score` (the primary model's, for the scoring `text` of a conversation of `shape`; None: a plain
        prompt) moved by memory `name`; None when there is no such memory, it is attached to another router than
        the scorer's (`views.scorer`), or the scorer kept no embedding of `text` (no feature row of the
        conversation, for a memory that reads the structural columns). On the calling thread."""
        found = self._row(name, views, text, shape)
        return None if found is None else self._inline(name, *found, score)

    async def adjust_off_loop(self, name: str, views: ScorerViews, text: str, score: float,
                              shape: ConversationShape | None = None) -> MemoryScore | None:
        """`adjust`, with the move of a memory of more than `inline_labels` labels computed in a worker thread,
        batched with the moves waiting beside it (`memory_batches.MoveBatcher`: its cost grows with the labels, and
        on the event loop every other request would wait for it). The kept row is read here, on the loop, as the
        scorer's caches expect."""
        found = self._row(name, views, text, shape)
        if found is None:
            return None
        attached, row = found
        if attached.labels <= self.inline_labels:
            return self._inline(name, attached, row, score)
        return _moved(attached, name, score, await self._moves.move(attached.score, row, score))

    async def move_tiers(self, memory: MemoryScore, estimates: tuple[TierEstimate, ...],
                         row: npt.NDArray[np.float32], placements: tuple[object, ...],
                         model: QualityModel) -> tuple[TierEstimate, ...]:
        """`estimates` (a `routing.tiers` trade's, in tier order, predicted by `model` with `placements` for the
        request of feature `row`) moved by the memory that moved its score (`memory`): each tier by its labels per
        pool (`tier_moves`, `policies.tiers.moved`), or, for a memory with none, every tier by the score's gap move
        (`policies.tiers.remembered`)."""
        tiers = tuple(e.pool for e in estimates)
        moves = await self.tier_moves(memory.name, row, tiers, placements, model)
        return remembered(estimates, memory.gap) if moves is None else moved(estimates, moves)

    async def tier_moves(self, name: str, row: npt.NDArray[np.float32], tiers: tuple[str, ...],
                         placements: tuple[object, ...], model: QualityModel) -> tuple[float, ...] | None:
        """Each of `tiers`' move of its predicted quality by memory `name`'s labels per pool, for the request of
        feature `row` (the whole row the scorer kept), the tiers predicted by `model` with `placements` (module
        docstring); None when there is no such memory or it has no labels per pool."""
        attached = self._attached.get(name)
        if attached is None or attached.pools is None:
            return None
        key: tuple[object, ...] = (attached.pools, model, *placements)  # the objects the residuals are against
        kept = self._tiers.get(name)
        if kept is not None and kept[1].tiers == tiers and len(kept[0]) == len(key) and all(
                a is b for a, b in zip(kept[0], key, strict=True)):
            tier_labels = kept[1]
            moves = (tier_labels.moves(row.reshape(1, -1)) if attached.labels <= self.inline_labels
                     else await asyncio.to_thread(tier_labels.moves, row.reshape(1, -1)))
            return tuple(float(v) for v in moves[0])
        pools = attached.pools

        def against() -> tuple[TierLabels, npt.NDArray[np.float64]]:
            tier_labels = pools.on(tiers, model.quality(pools.rows, placements))
            return tier_labels, tier_labels.moves(row.reshape(1, -1))

        tier_labels, moves = await asyncio.to_thread(against)  # the residuals: one pass of the map over the labels
        self._tiers[name] = (key, tier_labels)
        return tuple(float(v) for v in moves[0])

    def _inline(self, name: str, attached: AttachedMemory, row: npt.NDArray[np.float32],
                score: float) -> MemoryScore:
        moved = _moved(attached, name, score, float(attached.score.adjust(row, np.asarray([score]))[0]))
        if self.on_inline is not None:
            self.on_inline()
        return moved

    def _row(self, name: str, views: ScorerViews, text: str,
             shape: ConversationShape | None) -> tuple[AttachedMemory, npt.NDArray[np.float32]] | None:
        """Memory `name` as attached now and the row of the request it reads (`adjust`'s None cases: None)."""
        attached = self._attached.get(name)
        if attached is None or views.embedding is None or _router_of(views.scorer) is not attached.base:
            return None
        features = views.features.features(text, shape) if views.features is not None else None
        row = request_rows(attached.score, views.embedding.embedding(text), features)
        return None if row is None else (attached, row)

    async def refresh(self) -> None:
        """Load what changed under the folder and attach every memory to the current router (a worker thread)."""
        views = ScorerViews.of(self._current())  # once per poll
        base = _router_of(views.scorer)
        if base is None or views.embedding is None:
            return
        files = {p.stem: p for p in sorted(self.folder.glob("*.json"))} if self.folder.is_dir() else {}
        stamps = {name: s for name, p in files.items() if (s := _stamp(p)) is not None}
        if stamps == self._stamps and base is self._base:
            return
        embedder = views.embedding.embedding_space
        features = views.features is not None and views.features.keeps_features
        self._attached = await asyncio.to_thread(self._load, files, stamps, base, embedder, features)
        self._stamps, self._base = stamps, base

    def _load(self, files: dict[str, Path], stamps: dict[str, _Stamp], base: LinearRouter,
              embedder: str, features: bool) -> dict[str, AttachedMemory]:
        out: dict[str, AttachedMemory] = {}
        for name, stamp in stamps.items():
            before = self._attached.get(name)
            if before is not None and stamp == self._stamps.get(name):
                out[name] = before.on(base)
                continue
            try:
                attached = attach_file(files[name], base, embedder, features)
                out[name] = attached
                log.info("label memory %s loaded: %d labels (%d per pool)", name, attached.labels,
                         0 if attached.pools is None else len(attached.pools))
            except (ArtifactError, ValueError) as exc:
                log.warning("label memory %s not loaded (%s); %s", name, exc,
                            "the previous one keeps serving" if before is not None else "none serves")
                if before is not None:
                    out[name] = before.on(base)
        return out

    def start(self) -> None:
        async def poll() -> None:
            while True:
                try:
                    await self.refresh()
                except Exception:  # a poll that fails is logged and tried again; what serves stays
                    log.exception("label memories not refreshed")
                await asyncio.sleep(self._interval)

        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(poll(), name="label-memories")

    async def aclose(self) -> None:
        await stop(self._task)
        self._task = None


def _moved(attached: AttachedMemory, name: str, score: float, moved: float) -> MemoryScore:
    return MemoryScore(moved, name, attached.labels, gap_move(attached.score, score, moved))


def _router_of(scorer: Scorer | None) -> LinearRouter | None:
    router = getattr(scorer, "router", None)
    return router if isinstance(router, LinearRouter) else None
