"""Each tier's placement on the pool map, loaded beside the policy and swapped with it.

Contract:
- A pool's `placement:` is a placement file (a value ending in ``.json``: relative to the policy file's folder,
  `cascade router place` writes it) or the name of a shared source's model (``mistralai/mistral-7b-chat``), placed
  from that source's outcomes (`router_models.serving.pool_map`).
- `with_placements(loaded)` returns the policy with every tier's placement loaded (`LoadedPolicy.placements`), or
  raises `PolicyError` naming the policy file, the line and `pools.<name>.placement`, what failed and what to do.
  The gateway calls it where it loads a policy (start and every reload), so a placement that cannot be loaded
  keeps the running policy, with its placements, serving.
- A policy without `routing.tiers` loads no placement (a pool may still name one: it is checked then).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from policies.loader import LoadedPolicy, PolicyError
from router_models.serving.placement import Placement

__all__ = ["MapPlacements", "PlacementSource", "placement_path", "with_placements"]


class PlacementSource(Protocol):
    """Where placements come from: a file, or a shared source's model by name."""

    def load(self, path: Path) -> Any:
        """The placement in `path`. Raises OSError or ValueError (its message says what is wrong)."""
        ...

    def named(self, name: str) -> Any:
        """The placement of the shared sources' model `name`. Raises KeyError or ValueError for an unknown one."""
        ...


class MapPlacements:
    """Placements on the served pool map (`router_models.serving.placement.Placement`: checked against the map's
    version and embedder; a `PlacementError`, a ValueError, names what is wrong)."""

    def load(self, path: Path) -> Any:
        return Placement.load(path)

    def named(self, name: str) -> Any:
        return Placement.named(name)


def placement_path(loaded: LoadedPolicy, value: str) -> Path | None:
    """The file a `placement:` value names, relative to the policy file's folder; None for a model name."""
    if not value.endswith(".json"):
        return None
    path = Path(value)
    return path if path.is_absolute() else Path(loaded.source).parent / path


def with_placements(loaded: LoadedPolicy, source: PlacementSource | None = None) -> LoadedPolicy:
    """`loaded` with every tier's placement (see the module docstring). Raises `PolicyError`."""
    tiers = loaded.policy.routing.tiers
    if not tiers:
        return loaded
    source = source or MapPlacements()
    placements, problems = {}, []
    for pool in tiers:
        value = loaded.policy.pools[pool].placement
        assert value is not None  # a tier without one is refused when the policy loads (`policies.tiers`)
        try:
            placements[pool] = _load(loaded, source, value)
        except (OSError, ValueError, KeyError) as exc:
            problems.append(loaded.at(("pools", pool, "placement"), f"cannot load placement {value!r}: "
                                      f"{_said(exc)} ({_fix(loaded, value)})"))
    if problems:
        raise PolicyError(loaded.source, problems)
    return replace(loaded, placements=placements)


def _load(loaded: LoadedPolicy, source: PlacementSource, value: str) -> Any:
    path = placement_path(loaded, value)
    return source.named(value) if path is None else source.load(path)


def _said(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
    return str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)


def _fix(loaded: LoadedPolicy, value: str) -> str:
    if placement_path(loaded, value) is None:
        return "name a model of the shared sources, or a placement file ending in .json"
    return ("place the pool with `cascade router place --pool NAME --outcomes FILE --out FILE` and name that file, "
            "relative to the policy file")
