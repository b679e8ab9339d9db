"""Placing a pool from few rows, leave one source out: how the prior on the ability fit carries 100 rows.

The pool-map harness (`loadtest.bench.pool_map_eval`) places the held-out source's three models from one draw of
`FEW_ROWS` rows of the placement half and routes the other half. One draw is one sample; this bench repeats the
draw (`--draws`, seeded) and, for each, places the three models under several priors on the ability fit
(`placement.fit_ability`: a normal prior from the spread of the shared models' abilities), then routes and scores
the curve as the harness does (mean margin over the hull of single models, quality at 30% of the frontier's cost):
- `map prior`: the prior `cascade router place` uses (the map's `prior_mean`, `prior_sd`);
- `domains x0.5`: the domain axes' prior spread halved (the overall ability as before): fewer rows say less about
  domains than about overall strength;
- `overall only`: the domain abilities held at the prior mean (spread ~0), only the overall ability fitted;
- `domains x0.25`: a quarter;
- `prior x2`: every spread doubled (a weaker prior);
- `by rows`: `placement.placement_prior`, what `cascade router place` uses (the domain axes' spread times
  min(1, sqrt(rows / 400))).
Each prior also places from the whole placement half (`all rows`, as the harness's first row): a prior that helps
few rows must not cost many.
Same maps, halves and costs as the harness (its cached fits).

    python -m loadtest.bench.pool_map_few [--sources mmlu-pro] [--draws 20] [--rows 100]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from loadtest.bench.pool_map_costs import MODELS, cost_matrix
from loadtest.bench.pool_map_eval import FEW_ROWS, _fits, _half, _table, route_sweep
from router_models.embedders.factory import make_embedder
from router_models.serving.artifact import load_artifact
from router_models.serving.placement import FULL_PRIOR_ROWS, fit_ability
from router_models.serving.pool_map import quality_logits
from router_models.training.outcomes import DEFAULT_ROUTING_DIR, Example, load_outcomes
from router_models.training.pool_map_fit import FitConfig
from router_models.training.trainer import features

__all__ = ["PRIORS", "main"]

Floats = npt.NDArray[np.float64]


def _domains(scale: float) -> Any:
    def prior(mean: Floats, sd: Floats, rows: int) -> tuple[Floats, Floats]:
        return mean, np.concatenate([sd[:1], np.maximum(sd[1:] * scale, 1e-3)])
    return prior


def _by_rows(mean: Floats, sd: Floats, rows: int) -> tuple[Floats, Floats]:
    return mean, np.concatenate([sd[:1], np.maximum(sd[1:] * min(1.0, np.sqrt(rows / FULL_PRIOR_ROWS)), 1e-3)])


PRIORS: dict[str, Any] = {
    "map prior": lambda mean, sd, rows: (mean, sd),
    "domains x0.5": _domains(0.5),
    "domains x0.25": _domains(0.25),
    "overall only": _domains(0.0),
    "prior x2": lambda mean, sd, rows: (mean, sd * 2.0),
    "by rows": _by_rows,
}


def evaluate_source(source: str, x: npt.NDArray[np.float32], examples: list[Example], root: Path, embedder: str,
                    cache: Path, draws: int, rows: int) -> dict[str, Any]:
    test = [i for i, ex in enumerate(examples) if ex.source == source]
    pool_map, _ = _fits(source, x, examples, embedder, FitConfig(), cache)
    held = [examples[i] for i in test]
    cols = [held[0].models.index(m) for m in MODELS[source]]
    outcome = np.asarray([[ex.outcomes[c] for c in cols] for ex in held])
    cost, _ = cost_matrix(source, held, root)
    usable = ~np.isnan(outcome).any(axis=1) & ~np.isnan(cost).any(axis=1)
    half = np.asarray([_half(ex) for ex in held])
    place, route = np.flatnonzero(usable & (half == 0)), np.flatnonzero(usable & (half == 1))
    positions = pool_map.positions(x[test])
    mean, sd = np.asarray(pool_map.prior_mean), np.asarray(pool_map.prior_sd)
    c, y = cost[route], outcome[route]
    singles = [(float(c[:, j].mean()), float(y[:, j].mean())) for j in range(3)]

    def row(sample: npt.NDArray[np.intp], prior: tuple[Floats, Floats]) -> dict[str, Any]:
        ability = np.stack([fit_ability(positions[sample], outcome[sample, j], *prior)[0] for j in range(3)])
        predicted = 1.0 / (1.0 + np.exp(-quality_logits(positions[route], ability)))
        table = _table({"map": route_sweep(predicted, c, y)}, singles)["map"]
        return {"margin": table["mean_margin_over_hull"], "min_margin": table["min_margin_over_hull"],
                "q30": table["quality_at"]["30%"]}

    out: dict[str, list[dict[str, Any]]] = {name: [] for name in PRIORS}
    rng = np.random.default_rng(0)
    for _ in range(draws):
        sample = rng.choice(place, size=min(rows, len(place)), replace=False)
        for name, prior in PRIORS.items():
            out[name].append(row(sample, prior(mean, sd, len(sample))))
    whole = {name: row(place, prior(mean, sd, len(place))) for name, prior in PRIORS.items()}
    summary = {name: {key: (float(np.mean([d[key] for d in got])), float(np.std([d[key] for d in got])))
                      for key in ("margin", "min_margin", "q30")} for name, got in out.items()}
    return {"source": source, "rows": rows, "draws": draws, "placed_on": len(place), "routed": len(route),
            "summary": summary, "all_rows": whole}


def print_result(r: dict[str, Any]) -> None:
    print(f"\n{r['source']}: {r['draws']} draws of {r['rows']} rows of {r['placed_on']}, routed {r['routed']}")
    print(f"  {'prior':<14} margin over hull mean (sd over draws)  lowest margin mean   q@30% mean (sd)   "
          "all rows: margin / lowest / q@30%")
    for name, s in r["summary"].items():
        a = r["all_rows"][name]
        print(f"  {name:<14} {s['margin'][0]:+.4f} ({s['margin'][1]:.4f})               {s['min_margin'][0]:+.4f}"
              f"             {s['q30'][0]:.3f} ({s['q30'][1]:.3f})     {a['margin']:+.4f} / {a['min_margin']:+.4f} / "
              f"{a['q30']:.3f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="few-row placements under several priors (leave one source out)")
    parser.add_argument("--sources", default=",".join(MODELS))
    parser.add_argument("--draws", type=int, default=20)
    parser.add_argument("--rows", type=int, default=FEW_ROWS)
    parser.add_argument("--routing-dir", type=Path, default=DEFAULT_ROUTING_DIR)
    parser.add_argument("--out", type=Path, default=Path(".cascade/pool-map-few.json"))
    parser.add_argument("--cache", type=Path, default=Path(".cascade/pool-map-loso"), help="fitted maps kept here")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    embedder = make_embedder(load_artifact(None).embedder)
    examples = load_outcomes(args.routing_dir)
    x = features(embedder, examples, "embedding+structure")
    results = []
    for source in args.sources.split(","):
        results.append(evaluate_source(source, x, examples, args.routing_dir, embedder.name, args.cache,
                                       args.draws, args.rows))
        print_result(results[-1])
        print(f"  ({time.perf_counter() - start:.0f} s)", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
