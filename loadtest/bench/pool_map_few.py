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
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from loadtest.bench.pool_map_eval import FEW_ROWS, _table, each_source, held_out, route_sweep, source_options
from router_models.serving.placement import FULL_PRIOR_ROWS, fit_ability
from router_models.serving.pool_map import quality_logits
from router_models.training.outcomes import Example
from router_models.training.pool_map_fit import FitConfig

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
    h = held_out(source, x, examples, root, embedder, FitConfig(), cache)
    pool_map, positions, outcome, cost = h.pool_map, h.positions, h.outcome, h.cost
    place, route = np.flatnonzero(h.usable & (h.half == 0)), np.flatnonzero(h.usable & (h.half == 1))
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
    source_options(parser, "pool-map-few")
    parser.add_argument("--draws", type=int, default=20)
    parser.add_argument("--rows", type=int, default=FEW_ROWS)
    args = parser.parse_args(argv)
    return each_source(args, lambda source, x, examples, embedder: evaluate_source(
        source, x, examples, args.routing_dir, embedder.name, args.cache, args.draws, args.rows), print_result)


if __name__ == "__main__":
    raise SystemExit(main())
