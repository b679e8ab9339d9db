"""`cascade router route` and `cascade router pools`: a `routing.tiers` policy's pools on the pool map, offline.

    cascade router pools --policy P
    cascade router route --policy P --in prompts.jsonl --out routes.jsonl [--tradeoff X | --cost-per-1k Y]

`route` needs no engine: it embeds each prompt as the gateway's scorer does (the router artifact's embedder and
feature row; for the shipped default, the rows of the fast artifact in front of it, `refined_model`), predicts every
tier's quality from the pool map and the tiers' placements, prices each tier as the gateway does (`policies.tiers`:
prices x estimated prompt tokens and the tier's expected completion tokens) and picks the best trade
(`policies.tiers.choose`). The tradeoff: `--tradeoff` (the quality one USD of expected cost per request is worth; 0
= the best predicted quality whatever it costs), else `--cost-per-1k` (solved on the input itself,
`policies.tiers.solve_tradeoff`, so its mean expected cost per 1,000 requests is at most that), else the policy's.
Input lines: {"id", "prompt" | "messages"}; output per line: {"id", "pool", "predicted": {pool: quality},
"expected_cost_usd": {pool: usd}}. With `--memory NAME` ("shared" or a tenant's label memory) every tier's prediction
is moved by that memory exactly as the gateway's trade is: by the memory's labels per pool
(`router_models.serving.pool_labels`, `policies.tiers.moved`), or, for a memory without them, by the move of the
router's score (`router_models.serving.memory_apply`, `policies.tiers.remembered`); each line then also carries
"memory_move" ({pool: the move of its predicted quality}) and "gap_move" (the score's move on the memory's gap
scale). (Lives beside the gateway's CLI because it reads policies,
which `router_models` may not import.)
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from policies.context import estimate_tokens, prompt_text_of
from policies.loader import LoadedPolicy, PolicyError, default_policy_path, load_policy
from policies.tiers import (
    TierEstimate,
    choose,
    expected_completion,
    expected_cost_usd,
    moved,
    remembered,
    solve_tradeoff,
)

if TYPE_CHECKING:
    from router_models.serving.classifier import LinearRouter

__all__ = ["MemoryMoves", "memory_moves", "register", "route_rows"]

MemoryMoves = tuple[npt.NDArray[np.float64], "npt.NDArray[np.float64] | None"]
"""A label memory's moves of each input row: the score's on the gap scale (n,), and each tier's of its predicted
quality (n, tiers) when the memory has labels per pool (else None)."""


class RouteError(ValueError):
    """Input `route` refuses (file, line, field, and what to do)."""


def _load(args: argparse.Namespace) -> tuple[LoadedPolicy, Any]:
    """The policy with its tiers' placements, and the pool map they sit on."""
    import os

    from gateway.serving.routing.placements import with_placements
    from router_models.serving.pool_map import served_pool_map

    if args.map is not None:
        os.environ["CASCADE_POOL_MAP"] = str(args.map)
    loaded = load_policy(args.policy)
    if not loaded.policy.routing.tiers:
        raise RouteError(f"{args.policy}: routing.tiers is not set; list the pools cheapest first in routing.tiers, "
                         "each with a placement (docs/policies.md)")
    return with_placements(loaded), served_pool_map()


def _read(path: Path) -> list[tuple[Any, str, Any, int]]:
    """(id, text as the router reads it, shape, estimated prompt tokens) per line; `RouteError` at the first bad."""
    from router_models.serving.score_file import parse_line

    out = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row_id, text, shape = parse_line(line)
        except ValueError as exc:
            raise RouteError(f"{path}:{number}: {exc}") from exc
        raw = json.loads(line)
        full = raw["prompt"] if isinstance(raw.get("prompt"), str) else prompt_text_of(raw.get("messages"))
        out.append((row_id, text, shape, estimate_tokens(full)))
    if not out:
        raise RouteError(f"{path}: no rows; give one JSON object per line with \"id\" and \"prompt\" or \"messages\"")
    return out


def route_rows(loaded: LoadedPolicy, quality: npt.NDArray[np.float64], tokens: list[int],
               tradeoff: float | None, cost_per_1k: float | None,
               memory: MemoryMoves | None = None) -> tuple[list[tuple[TierEstimate, ...]], float]:
    """Every row's tier estimates (moved by its label memory's moves, `memory`, as the gateway's trade) and the
    tradeoff in force (module docstring). `RouteError` for a negative tradeoff or a cost target below what the
    cheapest tier of every row costs."""
    policy = loaded.policy
    tiers = policy.routing.tiers or ()
    rows = [tuple(TierEstimate(p, float(q), expected_cost_usd(policy.pools[p].price, n, expected_completion(policy, p)))
                  for p, q in zip(tiers, row, strict=True)) for row, n in zip(quality, tokens, strict=True)]
    if memory is not None:
        gaps, per_tier = memory
        rows = [remembered(row, float(gaps[i])) if per_tier is None else moved(row, per_tier[i])
                for i, row in enumerate(rows)]
    if tradeoff is not None:
        if not tradeoff >= 0:
            raise RouteError(f"--tradeoff {tradeoff} is negative: it is the quality one USD of expected cost per "
                             "request is worth, >= 0 (0 picks the best predicted quality whatever it costs)")
        return rows, tradeoff
    target = cost_per_1k if cost_per_1k is not None else (
        None if policy.routing.cost_per_1k is None else policy.routing.cost_per_1k / 1e6)
    if target is None:
        return rows, policy.routing.tradeoff or 0.0
    floor = 1000 * sum(min(e.cost_usd for e in row) for row in rows) / len(rows)
    if target < floor:
        raise RouteError(f"cost per 1,000 requests {target:g} USD is below what the cheapest tier of every request "
                         f"costs on this input ({floor:.6f} USD); give a target of at least that")
    return rows, solve_tradeoff(rows, target)


def _route(args: argparse.Namespace) -> int:
    from router_models.embedders.factory import make_embedder
    from router_models.serving.artifact import ArtifactError, load_artifact
    from router_models.serving.classifier import feature_matrix
    from router_models.serving.placement import PlacementError
    from router_models.serving.pool_map import pool_map_for, quality
    from router_models.serving.refined_model import refine_choice, refine_front

    try:
        loaded, pool_map = _load(args)
        rows = _read(args.input)
        router = load_artifact(refine_front(args.artifact, refine_choice()) or args.artifact)  # the gateway's rows
        if router.embedder != pool_map.embedder and args.map is None:
            pool_map = pool_map_for(router.embedder) or pool_map
        if router.embedder != pool_map.embedder:
            raise RouteError(f"the router artifact embeds with {router.embedder!r}, the pool map reads "
                             f"{pool_map.embedder!r} rows; give --artifact and --map of one embedder")
        texts = [r[1] for r in rows]
        embedder = make_embedder(router.embedder)
        x = feature_matrix(embedder.embed(texts), texts, [r[2] for r in rows])
        tiers = loaded.policy.routing.tiers or ()
        predicted = quality(pool_map, x, [loaded.placements[p] for p in tiers])
        placements = [loaded.placements[p] for p in tiers]
        memory = None if args.memory is None else memory_moves(router.router, embedder.name, x, args.store,
                                                               args.memory, tiers, lambda v: quality(pool_map, v,
                                                                                                     placements))
        estimates, tradeoff = route_rows(loaded, predicted, [r[3] for r in rows], args.tradeoff, args.cost_per_1k,
                                         memory)
    except (PolicyError, RouteError, PlacementError, ArtifactError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    _write(args.out, rows, estimates, tradeoff, None if memory is None else memory[0])
    return 0


def memory_moves(router: LinearRouter, embedder: str, x: npt.NDArray[np.float32], store: Path | None, name: str,
                 tiers: Sequence[str], predict: Callable[[npt.NDArray[np.float32]], npt.NDArray[np.float64]],
                 ) -> MemoryMoves:
    """Memory `name` of `store`'s (default: the served store; its vectors `embedder`'s) moves of feature rows `x`,
    as the gateway's (`MemoryMoves`): attached to `router`, it moves each score (`memory_apply`), and its labels per
    pool move each of `tiers` against `predict` (rows -> (rows, tiers) predicted quality: the map and the tiers'
    placements the rows are predicted with; `pool_labels`)."""
    from router_models.serving.artifact import default_store_dir
    from router_models.serving.memory_apply import attach_named, gap_moves, request_rows

    attached = attach_named(store or default_store_dir(), name, router, embedder)
    rows = request_rows(attached.score, x[:, :attached.memory.embedding_dim], x)
    assert rows is not None  # both given
    before = router.predict_proba(x)
    gaps = gap_moves(attached.score, before, attached.score.adjust(rows, before))
    pools = attached.pools
    return gaps, None if pools is None else pools.on(tiers, predict(pools.rows)).moves(x)


def _write(out: Path, rows: list[tuple[Any, str, Any, int]], estimates: list[tuple[TierEstimate, ...]],
           tradeoff: float, gaps: npt.NDArray[np.float64] | None) -> None:
    picks = [choose(row, tradeoff) for row in estimates]
    with out.open("w", encoding="utf-8") as fh:
        for i, ((row_id, *_), row, pick) in enumerate(zip(rows, estimates, picks, strict=True)):
            line: dict[str, Any] = {"id": row_id, "pool": pick.pool,
                                    "predicted": {e.pool: round(e.quality, 6) for e in row},
                                    "expected_cost_usd": {e.pool: round(e.cost_usd, 9) for e in row}}
            if gaps is not None:
                line["memory_move"] = {e.pool: round(e.memory, 6) for e in row}
                line["gap_move"] = round(float(gaps[i]), 6)
            fh.write(json.dumps(line) + "\n")
    n = len(picks)
    mean_cost = 1000 * sum(p.cost_usd for p in picks) / n
    shares = ", ".join(f"{e.pool} {sum(p.pool == e.pool for p in picks) / n:.1%}" for e in estimates[0])
    print(f"routed {n} rows at tradeoff {tradeoff:g} (quality per USD): {shares}; mean predicted quality "
          f"{sum(p.quality for p in picks) / n:.3f}, mean expected cost {mean_cost:.4f} USD per "
          f"1,000 requests; wrote {out}")


def _pools(args: argparse.Namespace) -> int:
    from router_models.place_cli import describe
    from router_models.serving.placement import PlacementError

    try:
        loaded, pool_map = _load(args)
    except (PolicyError, RouteError, PlacementError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"pool map {pool_map.version} ({pool_map.embedder}; axes: {', '.join(pool_map.axes)})")
    for pool in loaded.policy.routing.tiers or ():
        price = loaded.policy.pools[pool].price
        placement = replace(loaded.placements[pool], pool=pool)
        print(f"\n{describe(placement, pool_map)}\n  price        ${price.input_per_mtok / 1e6:g} in, "
              f"${price.output_per_mtok / 1e6:g} out per Mtok; {expected_completion(loaded.policy, pool)} completion "
              "tokens expected")
    return 0


def register(subparsers: Any) -> None:
    """Add `route` and `pools` to the already registered `router` command."""
    from gateway.cli.calibrate import _router_commands
    from router_models.cli import add_memory_flags

    router = _router_commands(subparsers)
    p = router.add_parser("route", help="route a JSONL file of prompts over a tiers policy's pools (no engines)",
                          description=__doc__.split("\n\n")[1])
    p.add_argument("--policy", default=str(default_policy_path()), help="a policy with routing.tiers")
    p.add_argument("--in", dest="input", type=Path, required=True, help='JSONL: {"id", "prompt" | "messages"}')
    p.add_argument("--out", type=Path, required=True, help="JSONL of routes to write")
    target = p.add_mutually_exclusive_group()
    target.add_argument("--tradeoff", type=float, help="quality one USD of expected cost per request is worth (>= 0)")
    target.add_argument("--cost-per-1k", type=float, metavar="USD", help="target mean cost per 1,000 requests")
    p.add_argument("--artifact", type=Path, default=None, help="router artifact (default: the served one)")
    p.add_argument("--map", type=Path, default=None, help="pool map .json (default: the served one)")
    add_memory_flags(p)
    p.set_defaults(func=_route)
    p = router.add_parser("pools", help="show where every tier of a policy sits on the pool map")
    p.add_argument("--policy", default=str(default_policy_path()), help="a policy with routing.tiers")
    p.add_argument("--map", type=Path, default=None, help="pool map .json (default: the served one)")
    p.set_defaults(func=_pools)
