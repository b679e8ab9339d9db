"""`cascade router place`: put a pool on the pool map, from its own judged answers or from a shared source model.

    cascade router place --pool NAME --outcomes FILE --out PLACEMENT.json
    cascade router place --pool NAME --shared-model MODEL --out PLACEMENT.json

FILE is JSON Lines, one judged answer of the pool per line: {"prompt": str} or {"messages": [...]}, and
{"quality": number in [0, 1]} (1 good, 0 bad; a judge's score scaled to [0, 1] is fine). Any bad line is refused
with its line number before anything is fitted. Prints where the pool sits, overall and per axis, and how sure.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from router_models.serving.artifact import ArtifactError
from router_models.serving.placement import Placement, PlacementError, PlaceRow
from router_models.serving.pool_map import PoolMap
from router_models.serving.scorer import ConversationShape, prompt_shape, read_conversation

__all__ = ["add_place", "describe", "read_place_rows"]


def read_place_rows(path: Path) -> list[PlaceRow]:
    """The judged rows of `path`; `PlacementError` naming `path:line` and the field for the first bad one."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise PlacementError(f"outcomes file {path} cannot be read ({exc})") from exc
    rows = []
    for number, line in enumerate(lines, start=1):
        if line.strip():
            rows.append(_row(line, f"{path}:{number}"))
    return rows


def _row(line: str, where: str) -> PlaceRow:
    try:
        data: Any = json.loads(line)
    except json.JSONDecodeError as exc:
        raise PlacementError(f"{where}: not valid JSON ({exc.msg})") from exc
    if not isinstance(data, Mapping):
        raise PlacementError(f'{where}: expected an object with "prompt" or "messages" and "quality"')
    quality = data.get("quality")
    if isinstance(quality, bool) or not isinstance(quality, int | float) or not math.isfinite(quality) \
            or not 0.0 <= float(quality) <= 1.0:
        raise PlacementError(f"{where}: field 'quality' is {quality!r}; give a number in [0, 1] (1 good, 0 bad)")
    if isinstance(data.get("prompt"), str) and data["prompt"].strip():
        return PlaceRow(data["prompt"], float(quality), prompt_shape(data["prompt"]), where)
    messages = data.get("messages")
    if isinstance(messages, list) and all(isinstance(m, Mapping) for m in messages):
        text, shape = read_conversation(messages)
        if text:
            return PlaceRow(text, float(quality), shape, where)
    raise PlacementError(f"{where}: field 'prompt' (a non-empty string) or 'messages' (a list of {{role, content}}) "
                         "is needed")


def describe(placement: Placement, pool_map: PoolMap) -> str:
    """Where the pool sits: overall ability (and P(good) on a request of average difficulty), each domain axis, with
    +- two standard errors, and where among the shared models it ranks overall."""
    overall, se = placement.ability[0], placement.se[0]
    mean_position = pool_map.metadata.get("mean_position") or [float(pool_map.bias[0])]  # over the fit's prompts
    typical = 1.0 / (1.0 + math.exp(-(overall - float(mean_position[0]))))
    others = sorted(s.ability[0] for s in pool_map.shared.values())
    rank = sum(v <= overall for v in others) / max(len(others), 1)
    lines = [f"pool {placement.pool!r} on {placement.map_version} ({placement.rows} rows, mean quality "
             f"{placement.mean_quality:.3f}; from {placement.origin})",
             f"  overall      {overall:+.3f} +- {2 * se:.3f}  (P(good) on a request of average difficulty "
             f"{typical:.3f}; above {rank:.0%} of the {len(others)} shared source models)"]
    for name, value, err in zip(pool_map.axes[1:], placement.ability[1:], placement.se[1:], strict=True):
        lines.append(f"  {name:<12} {value:+.3f} +- {2 * err:.3f}")
    return "\n".join(lines)


def _router_features(embedder_name: str) -> Any:
    from router_models.embedders.factory import make_embedder
    from router_models.serving.classifier import feature_matrix

    embedder = make_embedder(embedder_name)

    def embed(texts: Sequence[str], shapes: Sequence[ConversationShape | None]) -> npt.NDArray[np.float32]:
        return feature_matrix(embedder.embed(list(texts)), texts, shapes)
    return embed


def _place(args: argparse.Namespace) -> int:
    from router_models.serving.artifact import load_artifact
    from router_models.serving.placement import place_from_outcomes, place_from_shared
    from router_models.serving.pool_map import load_pool_map, pool_map_for
    from router_models.serving.refined_model import rows_artifact

    try:
        router = load_artifact(rows_artifact(args.artifact))  # the rows the gateway's scorer hands out
        pool_map = (load_pool_map(args.map, embedder=router.embedder) if args.map is not None
                    else pool_map_for(router.embedder))
        if pool_map is None:
            raise ArtifactError(f"no shipped pool map reads {router.embedder} feature rows; name one with --map")
        if args.shared_model:
            placement = place_from_shared(pool_map, args.shared_model, args.pool)
        else:
            rows = read_place_rows(args.outcomes)
            placement = place_from_outcomes(pool_map, rows, _router_features(router.embedder), args.pool,
                                            str(args.outcomes))
    except (ArtifactError, PlacementError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(describe(placement, pool_map))
    print(f"wrote {placement.save(args.out)}")
    return 0


def add_place(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("place", help="put a pool on the pool map from its judged answers or a shared model",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--pool", required=True, help="the pool's name in the policy")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--outcomes", type=Path, help="JSONL of the pool's judged answers (prompt|messages, quality)")
    source.add_argument("--shared-model", help="a model of the shared routing data, 'source/model' or a unique name")
    p.add_argument("--out", type=Path, required=True, help="the placement file to write")
    p.add_argument("--map", type=Path, default=None,
                   help="pool map .json (default: the shipped one on the rows the gateway's scorer hands out)")
    p.add_argument("--artifact", type=Path, default=None,
                   help="router artifact the gateway serves (default: the served one); its scorer's rows name the map")
    p.set_defaults(func=_place)
