"""Fakes of the pool map's side (`router_models.serving.pool_map`) for tiers tests: placements as small JSON files
or names, a map that predicts from two made-up features, and a scorer that keeps a feature row per text.

The numbers here are made up to make routing visible; they back no quality claim."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from router_models.serving.scorer import ConversationShape

__all__ = ["NAMED", "FakeMap", "FakePlacements", "FeatureScorer", "fake_the_map"]

NAMED = {"general-7b": {"base": 0.80, "code": -0.50, "hard": -0.60},
         "code-34b": {"base": 0.70, "code": 0.15, "hard": -0.50},
         "frontier": {"base": 0.95, "code": 0.0, "hard": 0.0}}
"""Placements by name: P(good) = base + code * is_code + hard * is_hard, clipped to [0, 1]."""


class FakePlacements:
    """`gateway.serving.routing.placements.PlacementSource`: a file holds one placement as JSON; names are `NAMED`'s."""

    def load(self, path: Path) -> Any:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)

    def named(self, name: str) -> Any:
        if name not in NAMED:
            raise KeyError(f"no shared source has a model named {name!r}")
        return NAMED[name]


class FakeMap:
    """`gateway.serving.routing.tier_trade.QualityModel` over rows (is_code, is_hard)."""

    def __init__(self) -> None:
        self.rows = 0

    def quality(self, features: npt.NDArray[np.float32], placements: Sequence[Any]) -> npt.NDArray[np.float64]:
        self.rows += len(features)
        out = [[p["base"] + p["code"] * row[0] + p["hard"] * row[1] for p in placements] for row in features]
        return np.clip(np.asarray(out, dtype=np.float64), 0.0, 1.0)


class FeatureScorer:
    """A scorer that keeps a feature row per text (`FeatureSource`): (mentions code, asks for a proof)."""

    version = "features"
    keeps_features = True

    async def score(self, texts: Sequence[str]) -> list[float]:
        return [0.3 for _ in texts]

    async def score_one(self, text: str, shape: ConversationShape | None = None) -> tuple[float, str]:
        return 0.3, "primary"

    def features(self, text: str, shape: ConversationShape | None = None) -> npt.NDArray[np.float32]:
        lowered = text.lower()
        return np.asarray([float("python" in lowered), float("prove" in lowered)], dtype=np.float32)

    async def aclose(self) -> None:
        return None


def fake_the_map(monkeypatch: pytest.MonkeyPatch) -> FakeMap:
    """A gateway built after this places pools with `FakePlacements` and predicts with the returned `FakeMap`
    (scoring with `FeatureScorer`)."""
    from gateway.api import runtime
    from gateway.serving.routing import placements, router

    fake = FakeMap()
    monkeypatch.setattr(placements, "MapPlacements", FakePlacements)
    monkeypatch.setattr(router, "map_of", lambda scorer: fake if isinstance(scorer, FeatureScorer) else None)
    monkeypatch.setattr(runtime, "make_scorer", lambda settings: FeatureScorer())
    return fake
