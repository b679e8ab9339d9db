"""Leave-one-source-out harness of the pool map (issue 51, item 5): quality against realised cost.

For each held-out shared source with many models (`pool_map_costs.MODELS`: RouterBench, ZeroEval, MMLU-Pro,
LLMRouter): fit the map on every other source (every copy of a held-out prompt removed), place the source's 7B-class,
middle and frontier model from HALF of its prompts (their own graded outcomes, the prompt model fixed, exactly as
`cascade router place` does), and route the other half:
- `map N=3`: each prompt to argmax(predicted quality - tradeoff x cost) over the three, a sweep of tradeoffs;
- `map N=2`: the same between the cheapest and the frontier model only;
- `threshold`: the shipped two-pool router (`fit_router`, target irt-fail, refitted leave-one-source-out): the top
  share of P(micro falls short) to the frontier model, a sweep of shares;
- `hull`: the best mix of single models (random mixes of two models lie on the segment between them).
Each routed curve also allows random mixes of two of its own points (its upper hull), as the single models' hull
does. The tradeoff is chosen after the fact on the routed half (as any cost-quality curve is): the table says what
is reachable, not which tradeoff reaches it. Realised quality is the real graded outcome of the chosen model.

    python -m loadtest.bench.pool_map_eval [--sources routerbench,zeroeval] [--out .cascade/pool-map-eval.json]
        [--artifact router_models/artifacts/complexity-router-static.json]

`--artifact` reads every prompt's feature row with that router artifact's embedder instead of the shipped default's
(e.g. the fast static artifact, whose rows the two-stage scorer hands out): the map and the threshold router are
then refitted per held-out source on those rows, exactly as on the default's.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from loadtest.bench.pool_map_costs import MODELS, cost_matrix
from router_models.embedders.factory import make_embedder
from router_models.embedders.protocol import Embedder
from router_models.serving.artifact import load_artifact
from router_models.serving.placement import fit_ability, placement_prior
from router_models.serving.pool_map import PoolMap, load_pool_map, quality_logits, save_pool_map
from router_models.training.outcomes import DEFAULT_ROUTING_DIR, Example, data_hash, load_outcomes
from router_models.training.pool_map_fit import FitConfig, fit_pool_map
from router_models.training.trainer import TrainConfig, features, fit_router

__all__ = ["BUDGETS", "HeldOut", "each_source", "held_out", "hull_at", "main", "route_sweep", "source_options",
           "upper_hull"]

Floats = npt.NDArray[np.float64]
FEW_ROWS = 100  # the fewest rows a pool is placed from in the table's second map row
BUDGETS = (0.1, 0.2, 0.3, 0.5, 1.0)  # shares of the frontier model's cost
TRADEOFFS = np.concatenate([[0.0], np.logspace(-1, 7, 161)])  # quality per USD per call


def upper_hull(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """The upper-left concave frontier of (cost, quality) points: what mixing any two of them reaches."""
    pts = sorted(set(points))
    hull: list[tuple[float, float]] = []
    for p in pts:
        if hull and p[1] <= hull[-1][1]:
            continue  # costs more, no better
        while len(hull) >= 2 and (hull[-1][1] - hull[-2][1]) * (p[0] - hull[-2][0]) <= \
                (p[1] - hull[-2][1]) * (hull[-1][0] - hull[-2][0]):
            hull.pop()
        hull.append(p)
    return hull


def hull_at(hull: Sequence[tuple[float, float]], budget: float) -> float:
    """The best quality reachable at mean cost <= `budget` on `hull` (nan below its cheapest point)."""
    if budget < hull[0][0]:
        return float("nan")
    costs, qualities = [c for c, _ in hull], [q for _, q in hull]
    return float(np.interp(budget, costs, qualities))


def route_sweep(predicted: Floats, cost: Floats, outcome: Floats) -> list[tuple[float, float]]:
    """(mean cost, mean real quality) of argmax(predicted - t x cost) per prompt, for each tradeoff t (ties to the
    earlier, cheaper column)."""
    rows = np.arange(len(predicted))
    out = []
    for t in TRADEOFFS:
        pick = np.argmax(predicted - t * cost, axis=1)
        out.append((float(cost[rows, pick].mean()), float(outcome[rows, pick].mean())))
    return out


def threshold_sweep(score: Floats, cost: Floats, outcome: Floats) -> list[tuple[float, float]]:
    """(mean cost, mean quality) of sending the top share by `score` to the last column, the rest to the first."""
    order = np.argsort(-score, kind="stable")
    out = []
    for k in np.linspace(0, len(score), 41).round().astype(int):
        pick = np.zeros(len(score), dtype=int)
        pick[order[:k]] = cost.shape[1] - 1
        rows = np.arange(len(score))
        out.append((float(cost[rows, pick].mean()), float(outcome[rows, pick].mean())))
    return out


def _half(ex: Example) -> int:
    return int(hashlib.sha256(ex.key.encode()).hexdigest(), 16) % 2


def _fits(source: str, x: npt.NDArray[np.float32], examples: list[Example], embedder: str, cfg: FitConfig,
          cache: Path) -> tuple[PoolMap, Floats]:
    """The map fitted without `source` and the two-pool router's scores of its prompts, kept under `cache` (keyed by
    the training data's hash and the fit's settings): the fits are the slow part, the rest reruns in seconds."""
    test = [i for i, ex in enumerate(examples) if ex.source == source]
    keys = {examples[i].key for i in test}
    train = [i for i, ex in enumerate(examples) if ex.source != source and ex.key not in keys]
    tag = hashlib.sha256(f"{data_hash([examples[i] for i in train])}{asdict(cfg)}{embedder}".encode()).hexdigest()[:12]
    path = cache / f"{source}-{tag}.json"
    if path.exists():
        with np.load(path.with_suffix(".scores.npz")) as npz:
            return load_pool_map(path), np.asarray(npz["scores"], np.float64)
    pool_map = fit_pool_map(x[train], [examples[i] for i in train], embedder, cfg)
    threshold = fit_router(x[train], [examples[i] for i in train], replace(TrainConfig(), target="irt-fail"))
    scores = threshold.router.predict_proba(x[test])
    cache.mkdir(parents=True, exist_ok=True)
    np.savez(path.with_suffix(".scores.npz"), scores=scores)
    save_pool_map(pool_map, path)
    return load_pool_map(path), scores


@dataclass(frozen=True)
class HeldOut:
    """One held-out source as every bench of the map reads it: the map fitted without it and the two-pool router's
    scores of its prompts (`_fits`), their features and positions on that map, the real graded outcomes and USD per
    call of its three `MODELS` (n x 3) and how those costs were had, and each prompt's half (0: placement,
    1: routing; only rows with every outcome and cost known are `usable`)."""

    pool_map: PoolMap
    scores: Floats
    positions: Floats
    outcome: Floats
    cost: Floats
    cost_basis: str
    usable: npt.NDArray[np.bool_]
    half: npt.NDArray[np.int64]
    held: list[Example]
    features: npt.NDArray[np.float32]  # the held prompts' rows of the router's features


def held_out(source: str, x: npt.NDArray[np.float32], examples: list[Example], root: Path, embedder: str,
             cfg: FitConfig, cache: Path) -> HeldOut:
    test = [i for i, ex in enumerate(examples) if ex.source == source]
    pool_map, scores = _fits(source, x, examples, embedder, cfg, cache)
    held = [examples[i] for i in test]
    cols = [held[0].models.index(m) for m in MODELS[source]]
    outcome = np.asarray([[ex.outcomes[c] for c in cols] for ex in held])
    cost, how = cost_matrix(source, held, root)
    usable = ~np.isnan(outcome).any(axis=1) & ~np.isnan(cost).any(axis=1)
    half = np.asarray([_half(ex) for ex in held], np.int64)
    return HeldOut(pool_map, scores, pool_map.positions(x[test]), outcome, cost, how, usable, half, held, x[test])


def evaluate_source(source: str, x: npt.NDArray[np.float32], examples: list[Example], root: Path,
                    embedder: str, cfg: FitConfig, cache: Path) -> dict[str, Any]:
    """One held-out source's curves and table row (module docstring)."""
    h = held_out(source, x, examples, root, embedder, cfg, cache)
    pool_map, scores, positions, outcome, cost, how = h.pool_map, h.scores, h.positions, h.outcome, h.cost, h.cost_basis
    place, route = np.flatnonzero(h.usable & (h.half == 0)), np.flatnonzero(h.usable & (h.half == 1))
    few = np.random.default_rng(0).choice(place, size=min(FEW_ROWS, len(place)), replace=False)
    predicted = {}
    for name, rows in (("map N=3", place), (f"map N=3, {FEW_ROWS} rows", few)):
        prior = placement_prior(pool_map, len(rows))  # as `cascade router place` places a pool from these rows
        ability = np.stack([fit_ability(positions[rows], outcome[rows, j], *prior)[0] for j in range(3)])
        predicted[name] = 1.0 / (1.0 + np.exp(-quality_logits(positions[route], ability)))
    c, y = cost[route], outcome[route]
    two = [0, 2]
    curves = {**{name: route_sweep(p, c, y) for name, p in predicted.items()},
              "map N=2": route_sweep(predicted["map N=3"][:, two], c[:, two], y[:, two]),
              "threshold": threshold_sweep(scores[route], c[:, two], y[:, two])}
    singles = [(float(c[:, j].mean()), float(y[:, j].mean())) for j in range(3)]
    return {"source": source, "cost_basis": how, "placed_on": len(place), "routed": len(route),
            "models": list(MODELS[source]), "singles": singles, "curves": curves,
            "table": _table(curves, singles)}


def _table(curves: dict[str, list[tuple[float, float]]], singles: list[tuple[float, float]]) -> dict[str, Any]:
    frontier_cost, frontier_q = singles[2]
    hulls = {"hull": upper_hull(singles), **{k: upper_hull(v) for k, v in curves.items()}}
    lo, hi = singles[0][0], frontier_cost
    grid = np.linspace(lo, hi, 50)
    out: dict[str, Any] = {}
    for name, hull in hulls.items():
        at = {f"{b:.0%}": hull_at(hull, b * frontier_cost) for b in BUDGETS}
        reach = [cst for cst, q in hull if q >= 0.95 * frontier_q]
        margin = [hull_at(hull, g) - hull_at(hulls["hull"], g) for g in grid]
        out[name] = {"quality_at": at, "cost_for_95pct_frontier": (min(reach) / frontier_cost) if reach else None,
                     "mean_margin_over_hull": float(np.nanmean(margin)),
                     "min_margin_over_hull": float(np.nanmin(margin))}
    return out


def print_result(r: dict[str, Any]) -> None:
    s = r["singles"]
    print(f"\n{r['source']}: placed on {r['placed_on']}, routed {r['routed']}; cost: {r['cost_basis']}")
    for name, (cst, q) in zip(r["models"], s, strict=True):
        print(f"  {name:<36} quality {q:.3f}  ${cst * 1000:.4f} per 1k calls")
    head = "  ".join(f"q@{b:.0%}".rjust(7) for b in BUDGETS)
    print(f"  {'router':<18} {head}  cost for 95% of frontier q   margin over hull (mean / min)")
    for name, row in r["table"].items():
        cells = "  ".join(f"{v:7.3f}" for v in row["quality_at"].values())
        c95 = row["cost_for_95pct_frontier"]
        c95s = f"{c95:.0%} of frontier" if c95 is not None else "not reached"
        print(f"  {name:<18} {cells}  {c95s:<28} {row['mean_margin_over_hull']:+.4f} / "
              f"{row['min_margin_over_hull']:+.4f}")


def source_options(parser: argparse.ArgumentParser, out: str) -> None:
    """The options every leave-one-source-out bench of the map takes: held-out sources, data, output, fit cache."""
    parser.add_argument("--sources", default=",".join(MODELS))
    parser.add_argument("--routing-dir", type=Path, default=DEFAULT_ROUTING_DIR)
    parser.add_argument("--out", type=Path, default=Path(f".cascade/{out}.json"))
    parser.add_argument("--cache", type=Path, default=Path(".cascade/pool-map-loso"), help="fitted maps kept here")
    parser.add_argument("--artifact", type=Path, default=None,
                        help="the router artifact whose embedder reads the feature rows (default: the shipped one)")


Evaluate = Callable[[str, npt.NDArray[np.float32], list[Example], Embedder], dict[str, Any]]


def each_source(args: argparse.Namespace, evaluate: Evaluate, show: Callable[[dict[str, Any]], None]) -> int:
    """The benches' loop (`source_options`' arguments): embed the shared outcomes once with the embedder of
    `args.artifact` (None: the shipped router's), evaluate each held-out source and print it as it lands, then write
    every result, with the embedder it was read with, to `args.out`."""
    start = time.perf_counter()
    embedder = make_embedder(load_artifact(args.artifact).embedder)
    print(f"feature rows of {embedder.name}", flush=True)
    examples = load_outcomes(args.routing_dir)
    x = features(embedder, examples, "embedding+structure")
    results = []
    for source in args.sources.split(","):
        results.append({**evaluate(source, x, examples, embedder), "embedder": embedder.name})
        show(results[-1])
        print(f"  ({time.perf_counter() - start:.0f} s)", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="leave-one-source-out pool-map harness (issue 51)")
    source_options(parser, "pool-map-eval")
    parser.add_argument("--k", type=int, default=FitConfig().k)
    args = parser.parse_args(argv)
    return each_source(args, lambda source, x, examples, embedder: evaluate_source(
        source, x, examples, args.routing_dir, embedder.name, FitConfig(k=args.k), args.cache), print_result)


if __name__ == "__main__":
    raise SystemExit(main())
