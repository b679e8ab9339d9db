"""What labels per pool buy a tiers trade, leave one source out on real outcomes (the pool-map harness's protocol).

For each held-out shared source with many models (`pool_map_costs.MODELS`): the map fitted without it and its
7B-class, middle and frontier model placed from half of its prompts, exactly as `loadtest.bench.pool_map_eval`
(same halves, same cached fits; `--place-rows N`: from N rows of that half, drawn seeded, as a pool placed from
few of its own judged answers). The other half is split in two by prompt key: one quarter plays a user's labelled
traffic, the other is routed. A label is a real graded outcome of one of the three models on a labelled prompt:
- `one pool per label`: each labelled prompt labels one of the three pools, drawn at random (seeded), as a judge
  sampling served answers would;
- `every pool`: each labelled prompt labels all three.
The labels go into a label memory (`label_memory.LabelMemory`, the served parameters) and move each tier's predicted
quality for the routed prompts exactly as the gateway moves them (`pool_labels.PoolLabels.on(...).moves`, residuals
against the placed pools' predictions). Each variant's curve (argmax(predicted - tradeoff x cost), a sweep of
tradeoffs) is compared with the same routed prompts without labels and with the hull of single models, as the
harness does (the tradeoff chosen after the fact; the realised quality the chosen model's real outcome).

    python -m loadtest.bench.pool_labels_eval [--sources routerbench,zeroeval] [--out .cascade/pool-labels-eval.json]
"""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from loadtest.bench.pool_map_costs import MODELS
from loadtest.bench.pool_map_eval import _table, each_source, held_out, route_sweep, source_options
from router_models.serving.label_memory import LabelMemory, MemoryParams
from router_models.serving.placement import fit_ability, placement_prior
from router_models.serving.pool_labels import PoolLabels
from router_models.serving.pool_map import quality_logits
from router_models.training.outcomes import Example
from router_models.training.pool_map_fit import FitConfig

__all__ = ["main"]

Floats = npt.NDArray[np.float64]
TIERS = ("small", "middle", "frontier")


def _quarter(ex: Example) -> int:
    """0: labelled, 1: routed (a second bit of the prompt key's hash, independent of `_half`'s)."""
    return int(hashlib.sha256(("labels:" + ex.key).encode()).hexdigest(), 16) % 2


def _moved(predicted: Floats, x: npt.NDArray[np.float32], labelled: npt.NDArray[np.intp],
           routed: npt.NDArray[np.intp], qualities: Floats, embedding_dim: int, params: MemoryParams) -> Floats:
    """Routed rows' predictions moved by labels `qualities` (labelled rows x tiers, NaN where unlabelled)."""
    memory = LabelMemory(x[labelled], np.full(len(labelled), np.nan), embedding_dim, params, (), TIERS, qualities)
    pools = PoolLabels.of(memory)
    assert pools is not None
    moves = pools.on(TIERS, predicted[labelled]).moves(x[routed])
    return np.asarray(np.clip(predicted[routed] + moves, 0.0, 1.0), np.float64)


def evaluate_source(source: str, x: npt.NDArray[np.float32], examples: list[Example], root: Path, embedder: str,
                    embedding_dim: int, cfg: FitConfig, cache: Path, place_rows: int | None = None,
                    params: MemoryParams | None = None) -> dict[str, Any]:
    params = params or MemoryParams()
    h = held_out(source, x, examples, root, embedder, cfg, cache)
    pool_map, outcome, cost, how, usable, half = h.pool_map, h.outcome, h.cost, h.cost_basis, h.usable, h.half
    quarter = np.asarray([_quarter(ex) for ex in h.held])
    place = np.flatnonzero(usable & (half == 0))
    if place_rows is not None:
        place = np.random.default_rng(0).choice(place, size=min(place_rows, len(place)), replace=False)
    labelled = np.flatnonzero(usable & (half == 1) & (quarter == 0))
    routed = np.flatnonzero(usable & (half == 1) & (quarter == 1))
    positions = h.positions
    prior = placement_prior(pool_map, len(place))  # as `cascade router place` places a pool from these rows
    ability = np.stack([fit_ability(positions[place], outcome[place, j], *prior)[0] for j in range(3)])
    predicted = 1.0 / (1.0 + np.exp(-quality_logits(positions, ability)))
    one = np.full((len(labelled), 3), np.nan)
    drawn = np.random.default_rng(0).integers(0, 3, size=len(labelled))
    one[np.arange(len(labelled)), drawn] = outcome[labelled, drawn]
    rows = h.features
    variants = {"no labels": predicted[routed],
                "one pool per label": _moved(predicted, rows, labelled, routed, one, embedding_dim, params),
                "every pool": _moved(predicted, rows, labelled, routed, outcome[labelled], embedding_dim, params)}
    c, y = cost[routed], outcome[routed]
    curves = {name: route_sweep(p, c, y) for name, p in variants.items()}
    singles = [(float(c[:, j].mean()), float(y[:, j].mean())) for j in range(3)]
    brier = {name: float(np.mean((p - y) ** 2)) for name, p in variants.items()}
    return {"source": source, "cost_basis": how, "placed_on": len(place), "labelled": len(labelled),
            "routed": len(routed), "models": list(MODELS[source]), "singles": singles, "brier": brier,
            "table": _table(curves, singles)}


def print_result(r: dict[str, Any]) -> None:
    print(f"\n{r['source']}: placed on {r['placed_on']}, {r['labelled']} labelled prompts, routed {r['routed']}")
    print(f"  {'variant':<20} {'q@30%':>7} {'q@50%':>7}  margin over hull (mean / min)  Brier of predicted quality")
    for name, row in r["table"].items():
        at = row["quality_at"]
        brier = f"{r['brier'][name]:.4f}" if name in r["brier"] else ""
        print(f"  {name:<20} {at['30%']:7.3f} {at['50%']:7.3f}  {row['mean_margin_over_hull']:+.4f} / "
              f"{row['min_margin_over_hull']:+.4f}         {brier}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="what labels per pool buy a tiers trade (leave one source out)")
    source_options(parser, "pool-labels-eval")
    parser.add_argument("--place-rows", type=int, default=None, help="place from this many rows (default: the half)")
    parser.add_argument("--prior", type=float, default=MemoryParams().prior, help="the memory's pseudo-count")
    args = parser.parse_args(argv)
    return each_source(args, lambda source, x, examples, embedder: evaluate_source(
        source, x, examples, args.routing_dir, embedder.name, embedder.dim, FitConfig(), args.cache,
        args.place_rows, MemoryParams(prior=args.prior)), print_result)


if __name__ == "__main__":
    raise SystemExit(main())
