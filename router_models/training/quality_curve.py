"""The router's cost-quality curve: share of the quality gap kept at each flagship share.

An artifact's metadata may hold ``quality_curve = {"flagship_share": [...], "pgr": [...], "basis": str}``:
PGR (performance gap recovered: 0 = all-micro quality, 1 = all-flagship quality) at each share of requests
sent to the flagship, from the router's own evaluation (`basis` says which, e.g. leave-one-source-out).
`QualityCurve.pgr_at(share)` interpolates it linearly. Reading does not load the model.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["METADATA_KEY", "QualityCurve", "artifact_metadata", "artifact_quality_curve", "parse_quality_curve"]

METADATA_KEY = "quality_curve"


@dataclass(frozen=True, slots=True)
class QualityCurve:
    """Points (flagship_share ascending in [0, 1], pgr) and where they come from."""

    flagship_share: tuple[float, ...]
    pgr: tuple[float, ...]
    basis: str

    def pgr_at(self, share: float) -> float:
        """PGR at `share` (clamped to the curve's range), linearly interpolated between points."""
        xs, ys = self.flagship_share, self.pgr
        share = min(max(share, xs[0]), xs[-1])
        for i in range(1, len(xs)):
            if share <= xs[i]:
                span = xs[i] - xs[i - 1]
                t = 0.0 if span == 0 else (share - xs[i - 1]) / span
                return ys[i - 1] + t * (ys[i] - ys[i - 1])
        return ys[-1]


def _floats(value: Any, name: str) -> tuple[float, ...]:
    if not isinstance(value, list) or len(value) < 2:
        raise ValueError(f"quality_curve.{name} must be a list of at least 2 numbers")
    if not all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in value):
        raise ValueError(f"quality_curve.{name} must hold finite numbers only")
    return tuple(float(v) for v in value)


def parse_quality_curve(metadata: Mapping[str, Any]) -> QualityCurve | None:
    """The curve in artifact `metadata`, or None when it has none. Raises ValueError when it is malformed."""
    raw = metadata.get(METADATA_KEY)
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ValueError("quality_curve must be an object with flagship_share, pgr and basis")
    xs, ys = _floats(raw.get("flagship_share"), "flagship_share"), _floats(raw.get("pgr"), "pgr")
    if len(xs) != len(ys):
        raise ValueError(f"quality_curve has {len(xs)} shares but {len(ys)} pgr values")
    if xs[0] < 0 or xs[-1] > 1 or any(b < a for a, b in itertools.pairwise(xs)):
        raise ValueError("quality_curve.flagship_share must ascend within [0, 1]")
    return QualityCurve(xs, ys, str(raw.get("basis") or "router evaluation"))


def artifact_metadata(path: Path | None = None) -> dict[str, Any]:
    """The metadata of the artifact at `path` (either file of the pair; default: the one served,
    `current_artifact_path`). Raises OSError (unreadable) or ValueError (not JSON, not an object)."""
    if path is None:
        from router_models.serving.artifact import current_artifact_path

        path = current_artifact_path()
    meta = json.loads(Path(path).with_suffix(".json").read_text(encoding="utf-8"))
    if not isinstance(meta, dict):
        raise ValueError(f"{path}: artifact metadata must be a JSON object")
    return meta


def artifact_quality_curve(path: Path | None = None) -> QualityCurve | None:
    """The curve of the artifact whose metadata is `path` (default: the one served, `current_artifact_path`),
    or None when the artifact has none. Raises OSError (unreadable) or ValueError (not JSON, malformed curve)."""
    return parse_quality_curve(artifact_metadata(path))
