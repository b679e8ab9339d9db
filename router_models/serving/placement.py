"""A pool's place on the pool map (`pool_map`): its ability vector, fitted from that pool's own judged answers
(`place_from_outcomes`, the prompt side held fixed) or read from a shared source model's fit (`place_from_shared`).

The fit: maximum a-posteriori of the k+1 abilities under the map's model, P(good) = sigmoid(overall + theta . a(x) -
difficulty(x)), each row's quality in [0, 1] read as a (soft) Bernoulli outcome, with the map's prior (the spread of
the shared models' abilities, so a pool is placed among models like it; `placement_prior`: below `FULL_PRIOR_ROWS`
rows the domain axes' spread is narrowed by sqrt(rows / FULL_PRIOR_ROWS), since few right-or-wrong rows say much
less about a pool's domains than about its overall strength: measured leave one source out, MODEL_CARD.md, "Pool
map"). Newton steps on k+1 parameters: instant.
The standard errors are the square roots of the inverse Hessian's diagonal at the optimum (how sure each figure is;
they shrink like 1/sqrt(rows)). `MIN_ROWS` rows are needed; 100 place a pool to about +-0.2 logits overall.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from router_models.serving.artifact import ArtifactError
from router_models.serving.pool_map import PoolMap, quality_logits, served_pool_map
from router_models.serving.scorer import ConversationShape

__all__ = ["FULL_PRIOR_ROWS", "MIN_ROWS", "PLACEMENT_FORMAT", "PlaceRow", "Placement", "PlacementError",
           "fit_ability", "place_from_outcomes", "place_from_shared", "placement_prior"]

Floats = npt.NDArray[np.float64]
PLACEMENT_FORMAT = 1
MIN_ROWS = 50
"""Fewest judged rows a placement is fitted from (100 recommended: MODEL_CARD.md, "Pool map")."""
FULL_PRIOR_ROWS = 400
"""From this many rows a placement's domain axes get the map's whole prior spread (`placement_prior`)."""
_REPLACE = "place the pool again with `cascade router place` against the map the gateway serves"


class PlacementError(ValueError):
    """A placement (or the rows it is fitted from) that cannot be used; the message names the file, line or field
    and what to do."""


@dataclass(frozen=True)
class PlaceRow:
    """One judged answer of the pool: the conversation (text and shape as the router reads it), its quality in
    [0, 1], and where it came from (`file:line`, for messages)."""

    text: str
    quality: float
    shape: ConversationShape | None = None
    where: str = ""


@dataclass(frozen=True)
class Placement:
    """A pool's place on a map (`map_version`, on `embedder`'s feature rows): `ability` (overall, then one per domain
    axis, logits), `se` (their standard errors), `rows` it was fitted from and their `mean_quality`, and where it
    came from (`origin`: {"outcomes": path} or {"shared_model": "source/model"})."""

    pool: str
    map_version: str
    embedder: str
    ability: tuple[float, ...]
    se: tuple[float, ...]
    rows: int
    mean_quality: float
    origin: dict[str, str] = field(default_factory=dict)
    axes: tuple[str, ...] = ()
    created: str = ""

    def check(self, pool_map: PoolMap, where: str = "") -> None:
        """Raise `PlacementError` unless this placement belongs on `pool_map` (same version, embedder, axes)."""
        at = where or f"placement of pool {self.pool!r}"
        if self.embedder != pool_map.embedder:
            raise PlacementError(f"{at}: field 'embedder' is {self.embedder!r} but the pool map reads "
                                 f"{pool_map.embedder!r} feature rows; {_REPLACE}")
        if self.map_version != pool_map.version:
            raise PlacementError(f"{at}: field 'map_version' is {self.map_version!r} but the gateway serves pool map "
                                 f"{pool_map.version!r}; {_REPLACE}")
        if len(self.ability) != pool_map.k + 1:
            raise PlacementError(f"{at}: field 'ability' has {len(self.ability)} values, the map needs "
                                 f"{pool_map.k + 1}; {_REPLACE}")

    def save(self, path: Path) -> Path:
        data = {"placement_format": PLACEMENT_FORMAT, **asdict(self)}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=2) + "\n")
        return path

    @classmethod
    def named(cls, model_name: str) -> Placement:
        """The placement of the served map's shared model `model_name` (`place_from_shared`). Raises
        `PlacementError`."""
        return place_from_shared(_served(f"shared_model {model_name!r}"), model_name)

    @classmethod
    def load(cls, path: Path, pool_map: PoolMap | None = None, check: bool = True) -> Placement:
        """The placement at `path`, validated and (`check`) checked against `pool_map` (default: the served map,
        `pool_map.served_pool_map`). Raises `PlacementError` naming the file and field."""
        try:
            data = json.loads(Path(path).read_text())
        except FileNotFoundError as exc:
            raise PlacementError(f"placement file {path} not found; create it with `cascade router place`") from exc
        except (OSError, ValueError) as exc:
            raise PlacementError(f"placement file {path} is unreadable ({exc}); {_REPLACE}") from exc
        placement = _validated(data, path)
        if check:
            placement.check(pool_map or _served(f"placement file {path}"), f"placement file {path}")
        return placement


def _served(what: str) -> PoolMap:
    try:
        return served_pool_map()
    except ArtifactError as exc:
        raise PlacementError(f"{what}: the pool map it is placed on cannot be loaded ({exc})") from exc


def _validated(data: Any, path: Path) -> Placement:
    if not isinstance(data, dict):
        raise PlacementError(f"placement file {path} is not a JSON object; {_REPLACE}")
    if data.get("placement_format") != PLACEMENT_FORMAT:
        raise PlacementError(f"placement file {path}: field 'placement_format' is {data.get('placement_format')!r}, "
                             f"this code reads {PLACEMENT_FORMAT}; {_REPLACE}")
    try:
        placement = Placement(str(data["pool"]), str(data["map_version"]), str(data["embedder"]),
                              tuple(float(v) for v in data["ability"]), tuple(float(v) for v in data["se"]),
                              int(data["rows"]), float(data["mean_quality"]),
                              {str(k): str(v) for k, v in dict(data.get("origin") or {}).items()},
                              tuple(str(a) for a in data.get("axes", ())), str(data.get("created", "")))
    except KeyError as exc:
        raise PlacementError(f"placement file {path}: field {exc.args[0]!r} is missing; {_REPLACE}") from exc
    except (TypeError, ValueError) as exc:
        raise PlacementError(f"placement file {path}: a field has the wrong type ({exc}); {_REPLACE}") from exc
    if placement.rows < MIN_ROWS:
        raise PlacementError(f"placement file {path}: field 'rows' is {placement.rows}, a placement needs at least "
                             f"{MIN_ROWS} judged rows (100 or more recommended); place it again from more rows")
    if not 0.0 <= placement.mean_quality <= 1.0:
        raise PlacementError(f"placement file {path}: field 'mean_quality' is {placement.mean_quality}, outside "
                             "[0, 1]; qualities are P(good answer); place it again from valid rows")
    if not all(math.isfinite(v) for v in (*placement.ability, *placement.se)) or \
            len(placement.se) != len(placement.ability):
        raise PlacementError(f"placement file {path}: fields 'ability' and 'se' must be finite and of one length; "
                             f"{_REPLACE}")
    return placement


def fit_ability(positions: Floats, quality: Floats, prior_mean: Floats, prior_sd: Floats,
                iterations: int = 50) -> tuple[Floats, Floats]:
    """MAP ability (k+1,) and its standard errors for rows at `positions` (n, k+1) with `quality` (n,) in [0, 1],
    under a normal prior (`prior_mean`, `prior_sd` per entry). Newton's method; deterministic."""
    design = np.hstack([np.ones((positions.shape[0], 1)), positions[:, 1:]])
    precision = 1.0 / np.square(prior_sd)
    theta = prior_mean.astype(np.float64).copy()
    hessian = np.diag(precision)
    for _ in range(iterations):
        z = quality_logits(positions, theta[None, :])[:, 0]
        p = 1.0 / (1.0 + np.exp(-np.clip(z, -30.0, 30.0)))
        grad = design.T @ (quality - p) - precision * (theta - prior_mean)
        hessian = (design * (p * (1.0 - p))[:, None]).T @ design + np.diag(precision)
        step = np.linalg.solve(hessian, grad)
        theta = theta + step
        if float(np.abs(step).max()) < 1e-8:
            break
    return theta, np.sqrt(np.diag(np.linalg.inv(hessian)))


def placement_prior(pool_map: PoolMap, rows: int) -> tuple[Floats, Floats]:
    """(mean, sd) of the prior a pool placed from `rows` judged rows is fitted under: the map's (`prior_mean`,
    `prior_sd`), the domain axes' spread times min(1, sqrt(rows / FULL_PRIOR_ROWS)) (module docstring; 100 rows:
    half the spread)."""
    k1 = pool_map.k + 1
    mean = np.asarray(pool_map.prior_mean or (0.0,) * k1, np.float64)
    sd = np.asarray(pool_map.prior_sd or (2.0,) * k1, np.float64)
    sd[1:] *= min(1.0, math.sqrt(max(rows, 0) / FULL_PRIOR_ROWS))
    return mean, np.maximum(sd, 1e-3)


def check_rows(rows: Sequence[PlaceRow], source: str) -> None:
    """Raise `PlacementError` for too few rows or a quality outside [0, 1] (naming the row's file:line)."""
    for row in rows:
        if not (math.isfinite(row.quality) and 0.0 <= row.quality <= 1.0):
            raise PlacementError(f"{row.where or source}: field 'quality' is {row.quality}, outside [0, 1]; give "
                                 "each row's judged quality as a number from 0 (bad) to 1 (good)")
    if len(rows) < MIN_ROWS:
        raise PlacementError(f"{source}: {len(rows)} rows, a placement needs at least {MIN_ROWS} judged rows (100 or "
                             "more recommended; more rows place the pool more surely)")


def place_from_outcomes(pool_map: PoolMap, rows: Sequence[PlaceRow],
                        embed: Callable[[Sequence[str], Sequence[ConversationShape | None]], npt.NDArray[np.floating]],
                        pool: str, origin: str = "") -> Placement:
    """The pool's placement from its judged rows; `embed(texts, shapes)` gives the router's feature rows (n, d).
    Only the pool's ability is fitted; the prompt side stays the map's. Raises `PlacementError` for bad rows."""
    check_rows(rows, origin or "outcome rows")
    x = np.asarray(embed([r.text for r in rows], [r.shape for r in rows]))
    y = np.asarray([r.quality for r in rows], np.float64)
    mean, sd = placement_prior(pool_map, len(rows))
    theta, se = fit_ability(pool_map.positions(x), y, mean, sd)
    return _placement(pool_map, pool, theta, se, len(rows), float(y.mean()), {"outcomes": origin})


def place_from_shared(pool_map: PoolMap, model_name: str, pool: str | None = None) -> Placement:
    """The placement of a model the map was fitted on: `model_name` is "source/model" or a model name that only
    one source has (`pool_map.shared`). Raises `PlacementError` (listing close names) when there is none."""
    matches = [n for n in pool_map.shared if n == model_name or n.split("/", 1)[1] == model_name]
    if len(matches) != 1:
        close = [n for n in pool_map.shared if model_name.lower() in n.lower()][:12]
        what = "names several shared models" if matches else "is no shared model"
        raise PlacementError(f"shared_model {model_name!r} {what}; give one of "
                             f"{', '.join(matches or close) or 'those `cascade router pools` lists'}")
    shared = pool_map.shared[matches[0]]
    return _placement(pool_map, pool or model_name, np.asarray(shared.ability), np.asarray(shared.se), shared.rows,
                      shared.mean_quality, {"shared_model": matches[0]})


def _placement(pool_map: PoolMap, pool: str, theta: Floats, se: Floats, rows: int, mean_quality: float,
               origin: dict[str, str]) -> Placement:
    return Placement(pool, pool_map.version, pool_map.embedder, tuple(round(float(v), 6) for v in theta),
                     tuple(round(float(v), 6) for v in se), rows, round(mean_quality, 6), origin, pool_map.axes,
                     datetime.now(UTC).isoformat(timespec="seconds"))
