"""The serving router artifact, swapped while the gateway serves.

`RouterSwap.reload()` (`POST /admin/router/reload`, or the store watcher when `cascade router train` or
`rollback` changes what is current) loads the artifact the gateway should serve: the one `--router-artifact`
names, else the last promoted into the store, else the shipped one. The new scorer is checked before it
serves: `load_model` verifies the artifact's hash and that its features match the embedder's; then a probe
set is scored, and every score must be a finite probability. A bad artifact is refused (`ArtifactError`) and
the running scorer keeps serving. Once checked, the request router scores the next requests with it; a
request already being scored finishes on the old one, which is closed after `grace_s`. One swap at a time: a
second waits for the first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable
from pathlib import Path

from gateway.serving.routing.router import RequestRouter
from gateway.settings import Settings
from gateway.telemetry.gc_pauses import freeze_heap
from router_models.serving.artifact import ArtifactError, current_artifact_path
from router_models.serving.scorer import LengthScorer, Scorer

__all__ = ["PROBE_TEXTS", "RouterSwap", "make_scorer", "watched_paths"]

log = logging.getLogger("cascade.router")

PROBE_TEXTS = (
    "hi",
    "Translate 'good morning' into French.",
    "Prove that there are infinitely many primes, then explain the proof to a ten-year-old.",
    "Write a Python function that merges two sorted lists, with tests.",
    "",
)
"""A sanity check of a new artifact's outputs (finite probabilities for short, long, code and empty text);
not a quality measure."""


def make_scorer(settings: Settings) -> Scorer | None:
    """The scorer `settings` ask for (loads the embedding model for `classifier`: seconds, call in a thread)."""
    if settings.scorer == "none":
        return None
    if settings.scorer == "length":
        return LengthScorer()
    from router_models.serving.classifier_scorer import load_scorer

    return load_scorer(str(settings.router_artifact) if settings.router_artifact else None,
                       overflow=settings.router_overflow)


def watched_paths(settings: Settings) -> tuple[Path, ...]:
    """The files whose change means another artifact should serve: the named artifact, or the store's history
    (a promotion or a rollback) and the artifact now current."""
    if settings.router_artifact is not None:
        return (Path(settings.router_artifact),)
    from router_models.serving.artifact import default_store_dir

    return (default_store_dir() / "history.json", current_artifact_path())


async def _check(scorer: Scorer) -> None:
    scores = await scorer.score(list(PROBE_TEXTS))
    bad = [s for s in scores if not (math.isfinite(s) and 0.0 <= s <= 1.0)]
    if len(scores) != len(PROBE_TEXTS) or bad:
        raise ArtifactError(f"router {scorer.version} scored the probe set {scores}: not a probability per text")


class RouterSwap:
    """Owns the scorers it retires (closed after `grace_s`, or at `aclose`). `on_swap(new)`, when set, is told
    of each swap (the runtime keeps the current scorer, and attaches its metrics hooks)."""

    def __init__(self, settings: Settings, router: RequestRouter, grace_s: float = 30.0) -> None:
        self._settings = settings
        self._router = router
        self.on_swap: Callable[[Scorer], None] | None = None
        self._grace = grace_s
        self._lock = asyncio.Lock()
        self._retiring: set[asyncio.Task[None]] = set()

    async def reload(self) -> tuple[str, bool]:
        """Load, check and serve the artifact the gateway should serve now; returns (its version, whether it
        changed). Raises `ArtifactError` (the running scorer stays) and `ValueError` when the gateway runs no
        trained router (`--scorer length|none`)."""
        if self._settings.scorer != "classifier":
            raise ValueError(f"the gateway runs --scorer {self._settings.scorer}: there is no router artifact to "
                             "reload (start it with --scorer classifier)")
        async with self._lock:
            new = await asyncio.to_thread(make_scorer, self._settings)
            assert new is not None
            old = self._router.scorer
            try:
                await _check(new)
            except BaseException:
                await new.aclose()
                raise
            if old is not None and old.version == new.version:
                await new.aclose()
                return new.version, False
            self._router.use_scorer(new)
            if self.on_swap is not None:
                self.on_swap(new)
            log.info("router swapped", extra={"router_version": new.version,
                                              "previous": None if old is None else old.version})
            if old is not None:
                task = asyncio.create_task(self._retire(old), name=f"retire-router:{old.version}")
                self._retiring.add(task)
                task.add_done_callback(self._retiring.discard)
            return new.version, True

    async def _retire(self, scorer: Scorer) -> None:
        try:
            await asyncio.sleep(self._grace)  # requests scored by it a moment ago still hold it
        finally:
            await scorer.aclose()
        if self._settings.gc_freeze:
            del scorer
            freeze_heap("router swap")  # the retired router collected, the new one frozen

    async def aclose(self) -> None:
        for task in list(self._retiring):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
