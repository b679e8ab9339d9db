"""The pool map: where each request sits (difficulty and domain loadings) and where each pool sits (an ability on
the same axes), and P(a pool answers the request well) from the two. Serving side: numpy only, no pickle.

Model (multidimensional item response theory, fitted in `router_models.training.pool_map_fit`): for a request with
feature row x (the router's own row, `classifier.feature_matrix`: the embedding, then the structural features, so the
map costs the gateway no second embedding) and a pool with ability vector theta = (overall, theta_1 .. theta_k),

    P(good answer) = sigmoid(overall + theta_1 a_1(x) + ... + theta_k a_k(x) - difficulty(x))

where `positions(x) = x @ weights + bias = (difficulty, a_1 .. a_k)`: one (d, k+1) matmul per batch of requests.
The loadings a_m(x) say how much of the request is "domain m"; a pool strong on that domain has a large theta_m.

Files: the map is `pool-map.json` (metadata: format, version, embedder, axes, the payload's sha256, and every shared
source model's ability, `shared`) beside `pool-map.npz` (`weights` (d, k+1) float32, `bias` (k+1,)); a pool's
placement is a small JSON file (`Placement`, see `router_models.serving.placement`).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from router_models.embedders.features import FEATURE_NAMES, FEATURE_VERSION
from router_models.serving.artifact import ArtifactError, read_metadata, read_payload, replace_atomically

__all__ = ["DEFAULT_POOL_MAP", "MAP_FORMAT", "STATIC_POOL_MAP", "Placed", "PoolMap", "SharedAbility", "abilities",
           "load_pool_map", "pool_map_for", "quality", "quality_logits", "save_pool_map", "served_pool_map",
           "shipped_pool_map"]

Floats = npt.NDArray[np.float64]
MAP_FORMAT = 1
DEFAULT_POOL_MAP = Path(__file__).resolve().parents[1] / "artifacts" / "pool-map.json"
STATIC_POOL_MAP = DEFAULT_POOL_MAP.with_name("pool-map-static.json")  # the same fit on the fast artifact's rows
_log = logging.getLogger(__name__)
_FIX = "rebuild it with `python -m router_models.training.pool_map_build` (MODEL_CARD.md, \"Pool map\")"


@dataclass(frozen=True)
class SharedAbility:
    """A shared source model's fitted ability (`ability`, k+1 logits: overall then one per domain axis), its
    standard errors (`se`), how many graded items it was fitted on (`rows`) and its mean graded outcome there."""

    ability: tuple[float, ...]
    se: tuple[float, ...]
    rows: int
    mean_quality: float


@dataclass(frozen=True)
class PoolMap:
    """The prompt side of the map. `weights` (d, k+1) and `bias` (k+1,) give `positions`; `axes` names the k+1
    columns ("difficulty", then the k domain axes); `embedder` must be the router artifact's (the map reads its
    feature row); `version` names this map (placements fitted on another version are refused); `shared`: every
    shared source model's ability, keyed "source/model" (`place_from_shared`); `prior_mean` / `prior_sd`: the
    spread of those abilities, the prior a new pool's placement starts from."""

    weights: npt.NDArray[np.float32]
    bias: Floats
    axes: tuple[str, ...]
    embedder: str
    version: str
    shared: dict[str, SharedAbility] = field(default_factory=dict, repr=False, compare=False)
    prior_mean: tuple[float, ...] = ()
    prior_sd: tuple[float, ...] = ()
    metadata: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        k1 = len(self.axes)
        if self.weights.ndim != 2 or self.weights.shape[1] != k1 or self.bias.shape != (k1,):
            raise ValueError(f"pool map: {k1} axes but weights {self.weights.shape} and bias {self.bias.shape}")
        if k1 < 1 or self.axes[0] != "difficulty":
            raise ValueError(f"pool map: the first axis must be 'difficulty', got {self.axes}")

    @property
    def dim(self) -> int:
        """The feature row width the map reads."""
        return int(self.weights.shape[0])

    @property
    def k(self) -> int:
        """The number of domain axes (the ability vector has k+1 entries: overall, then one per axis)."""
        return len(self.axes) - 1

    def positions(self, features: npt.NDArray[np.floating]) -> Floats:
        """(n, k+1): each row's (difficulty, loading on each domain axis), from feature rows (n, d)."""
        if features.ndim != 2 or features.shape[1] != self.dim:
            raise ValueError(f"pool map {self.version} reads (n, {self.dim}) feature rows, got {features.shape}")
        return np.asarray(features.astype(np.float32) @ self.weights, np.float64) + self.bias


class Placed(Protocol):
    """A pool's place on a map, as `quality` reads it (`router_models.serving.placement.Placement`: this module does
    not import it, since it imports this one)."""

    @property
    def ability(self) -> tuple[float, ...]: ...

    def check(self, pool_map: PoolMap, where: str = "") -> None: ...


def abilities(placements: Sequence[Placed], pool_map: PoolMap) -> Floats:
    """(P, k+1) ability matrix of `placements`, checked against `pool_map` (`Placement.check`)."""
    for p in placements:
        p.check(pool_map)
    return np.asarray([p.ability for p in placements], np.float64).reshape(len(placements), pool_map.k + 1)


def quality_logits(positions: Floats, ability: Floats) -> Floats:
    """(n, P) logits of P(good answer) for positions (n, k+1) and abilities (P, k+1)."""
    return np.asarray(ability[:, 0] + positions[:, 1:] @ ability[:, 1:].T - positions[:, :1], np.float64)


def quality(pool_map: PoolMap, features: npt.NDArray[np.floating], placements: Sequence[Placed]) -> Floats:
    """(n, P): P(pool p answers request i well), for feature rows (n, d) and the pools' placements (in order)."""
    z = quality_logits(pool_map.positions(features), abilities(placements, pool_map))
    return np.asarray(1.0 / (1.0 + np.exp(-np.clip(z, -30.0, 30.0))), np.float64)


def save_pool_map(pool_map: PoolMap, path: Path = DEFAULT_POOL_MAP) -> Path:
    """Write the map at `path` (.json; the payload beside it, .npz), payload first. The version is the payload's
    hash (`pool-map@<12 hex>`), whatever `pool_map.version` said. Returns the metadata path."""
    meta_path, payload_path = path.with_suffix(".json"), path.with_suffix(".npz")
    meta_path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    np.savez(buf, weights=pool_map.weights.astype(np.float32), bias=pool_map.bias.astype(np.float64))
    payload = buf.getvalue()
    digest = hashlib.sha256(payload).hexdigest()
    replace_atomically(payload_path, payload)
    meta = dict(pool_map.metadata)
    meta.update(map_format=MAP_FORMAT, version=f"pool-map@{digest[:12]}", embedder=pool_map.embedder,
                axes=list(pool_map.axes), dim=pool_map.dim, feature_version=FEATURE_VERSION,
                feature_names=list(FEATURE_NAMES), prior_mean=list(pool_map.prior_mean),
                prior_sd=list(pool_map.prior_sd),
                shared={name: {"ability": list(s.ability), "se": list(s.se), "rows": s.rows,
                               "mean_quality": s.mean_quality} for name, s in sorted(pool_map.shared.items())},
                payload_file=payload_path.name, payload_sha256=digest)
    replace_atomically(meta_path, (json.dumps(meta, indent=1, sort_keys=True) + "\n").encode())
    return meta_path


def _check_meta(meta: dict[str, Any], meta_path: Path, embedder: str | None) -> None:
    for key, expected in (("map_format", MAP_FORMAT), ("feature_version", FEATURE_VERSION),
                          ("feature_names", list(FEATURE_NAMES))):
        if meta.get(key) != expected:
            raise ArtifactError(f"pool map {meta_path} has {key}={meta.get(key)!r} but this code needs "
                                f"{expected!r}; {_FIX}")
    if embedder is not None and meta.get("embedder") != embedder:
        raise ArtifactError(f"pool map {meta_path} reads feature rows of embedder {meta.get('embedder')!r}, but the "
                            f"router embeds with {embedder!r}; {_FIX} on the router's embedder")


def load_pool_map(path: Path | None = None, embedder: str | None = None) -> PoolMap:
    """The map at `path` (default: the shipped one), verified (format, features, payload hash, and `embedder` when
    given: the router artifact's). Raises `ArtifactError` saying what is wrong and how to fix it."""
    meta_path = (path or DEFAULT_POOL_MAP).with_suffix(".json")
    meta = read_metadata(meta_path, "pool map", "pool map metadata", _FIX)
    _check_meta(meta, meta_path, embedder)
    payload_path, payload = read_payload(meta, meta_path, "pool map payload", _FIX)
    try:
        with np.load(io.BytesIO(payload), allow_pickle=False) as npz:
            weights, bias = np.asarray(npz["weights"], np.float32), np.asarray(npz["bias"], np.float64)
        shared = {str(n): SharedAbility(tuple(float(v) for v in s["ability"]), tuple(float(v) for v in s["se"]),
                                        int(s["rows"]), float(s["mean_quality"]))
                  for n, s in dict(meta.get("shared") or {}).items()}
        pool_map = PoolMap(weights, bias, tuple(str(a) for a in meta["axes"]), str(meta["embedder"]),
                           str(meta["version"]), shared, tuple(float(v) for v in meta.get("prior_mean", ())),
                           tuple(float(v) for v in meta.get("prior_sd", ())), meta)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ArtifactError(f"pool map {payload_path} is unreadable ({exc}); {_FIX}") from exc
    if pool_map.dim != meta.get("dim") or not np.all(np.isfinite(weights)):
        raise ArtifactError(f"pool map {payload_path} has weights {weights.shape} for dim {meta.get('dim')}; {_FIX}")
    return pool_map


_SERVED: dict[tuple[str, int, int], PoolMap] = {}


def shipped_pool_map() -> Path:
    """The shipped map on the feature rows the served scorer hands out: `pool-map-static.json` when they are the fast
    artifact's (the shipped default served in two stages, or the fast artifact alone), else `pool-map.json`."""
    from router_models.serving.refined_model import rows_artifact

    try:
        on_static = read_metadata(rows_artifact()).get("embedder") == read_metadata(STATIC_POOL_MAP).get("embedder")
    except ArtifactError:
        return DEFAULT_POOL_MAP
    return STATIC_POOL_MAP if on_static else DEFAULT_POOL_MAP


def served_pool_map() -> PoolMap:
    """The map the gateway serves: `$CASCADE_POOL_MAP`, else the shipped one on the served scorer's rows
    (`shipped_pool_map`); loaded once per version of the file. Raises `ArtifactError`."""
    path = Path(os.environ.get("CASCADE_POOL_MAP") or shipped_pool_map()).with_suffix(".json")
    try:
        stat = path.stat()
        key = (str(path), stat.st_mtime_ns, stat.st_size)
    except OSError:
        key = (str(path), 0, 0)
    if key not in _SERVED:
        _SERVED.clear()
        _SERVED[key] = load_pool_map(path)
    return _SERVED[key]


def pool_map_for(embedder: str) -> PoolMap | None:
    """The served map when it reads `embedder`'s feature rows (the router artifact's; with no `$CASCADE_POOL_MAP`, the
    shipped map on those rows: `pool-map.json` on the transformer's, `pool-map-static.json` on the fast artifact's,
    which the shipped default's two-stage scorer hands out), else None (logged: a tiers policy then splits by score
    between its first and last tier)."""
    try:
        pool_map = served_pool_map()
        if pool_map.embedder != embedder and not os.environ.get("CASCADE_POOL_MAP") and STATIC_POOL_MAP.exists():
            static = load_pool_map(STATIC_POOL_MAP)
            pool_map = static if static.embedder == embedder else pool_map
    except ArtifactError as exc:
        _log.warning("no pool map (%s): tiers split by score", exc)
        return None
    if pool_map.embedder != embedder:
        _log.warning("the pool map %s reads %s feature rows, the router embeds with %s: tiers split by score",
                     pool_map.version, pool_map.embedder, embedder)
        return None
    return pool_map

