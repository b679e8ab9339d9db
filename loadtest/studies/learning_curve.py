"""The router's learning curve: with N labels of a user's traffic, how well does it rank the rest of it?

Each public source of `../shared/data/routing` (real outcomes of real models) plays a user's traffic in turn:
the router is fitted leave-that-source-out plus N of its rows as own labels (N in 0, 100, 300, 1000, 3000,
capped so at least `--min-rest` rows stay for testing), in every compared way of using own labels, and scored
by APGR on the rest of that source (`loadtest.studies.learning_curve_fits`). Several seeded draws per N;
the table gives their mean per source and the mean over sources (over those that have that N).

Embeddings come from the training embedder's on-disk cache (`trainer.features`): the first run embeds
~40,000 prompts (minutes of CPU), later runs reuse them and the whole grid is closed-form ridge fits.

    python -m loadtest.studies.learning_curve                       # the full curve, every method
    python -m loadtest.studies.learning_curve --max-per-source 400 --sizes 0,100 --draws 1   # a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from loadtest.studies.learning_curve_fits import SIZES, learning_curve, methods, summary
from router_models.embedders.factory import make_embedder
from router_models.serving.label_memory import MemoryParams
from router_models.training.outcomes import DEFAULT_ROUTING_DIR, load_outcomes
from router_models.training.pipeline import DEFAULT_FEATURES, DEFAULT_TARGET, DEFAULT_TRAIN_EMBEDDER
from router_models.training.trainer import TrainConfig, features

__all__ = ["main", "print_tables", "run"]


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(v) for v in text.split(",") if v.strip())


def _memories(text: str) -> tuple[MemoryParams, ...]:
    """`neighbours:bandwidth:prior[:structure[:slope|level[:slope_scale[:shrink[:sources[:early]]]]]],...` -> the
    label memories compared (an omitted field takes `MemoryParams`' default; `early` is
    `labels/shrink/bandwidth`, or 0 for none)."""
    grammar = "neighbours:bandwidth:prior[:structure[:slope|level[:slope_scale[:shrink[:sources[:early]]]]]]"
    out = []
    for item in (v for v in text.split(",") if v.strip()):
        k, bandwidth, prior, *rest = item.split(":")
        if len(rest) > 6 or (len(rest) >= 2 and rest[1] not in ("slope", "level")):
            raise ValueError(f"a memory is {grammar}, got {item!r}")
        default = MemoryParams()
        early = rest[5].split("/") if len(rest) >= 6 else None
        if early is not None and early != ["0"] and len(early) != 3:
            raise ValueError(f"a memory's early field is labels/shrink/bandwidth or 0, got {rest[5]!r}")
        out.append(MemoryParams(int(k), float(bandwidth), float(prior),
                                float(rest[0]) if rest else default.structure,
                                rest[1] == "slope" if len(rest) >= 2 else default.slope,
                                float(rest[2]) if len(rest) >= 3 else default.slope_scale,
                                float(rest[3]) if len(rest) >= 4 else default.shrink,
                                float(rest[4]) if len(rest) >= 5 else default.sources,
                                (0 if early == ["0"] else int(early[0])) if early else default.early_labels,
                                float(early[1]) if early and len(early) == 3 else default.early_shrink,
                                float(early[2]) if early and len(early) == 3 else default.early_bandwidth))
    return tuple(out)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The curve as a JSON-ready document (arguments, machine, every point, the summary)."""
    began = time.perf_counter()
    sources = tuple(args.sources.split(",")) if args.sources else None
    examples = load_outcomes(args.routing_dir, sources=sources, max_per_source=args.max_per_source)
    embedder = make_embedder(args.embedder)
    print(f"{len(examples)} prompts with real outcomes; features from {embedder.name} (cached on disk)", flush=True)
    x = features(embedder, examples, DEFAULT_FEATURES)
    cfg = TrainConfig(routing_dir=args.routing_dir, target=DEFAULT_TARGET, feature_set=DEFAULT_FEATURES)
    compared = methods(cfg, _floats(args.ks), _floats(args.penalties), own_only=not args.no_own_only,
                       memories=_memories(args.memories))
    print(f"features ready after {time.perf_counter() - began:.0f} s; methods: {', '.join(compared)}", flush=True)
    points = learning_curve(x, examples, cfg, compared, sizes=tuple(int(v) for v in args.sizes.split(",")),
                            draws=args.draws, seed=args.seed, min_rest=args.min_rest,
                            progress=lambda line: print(f"  [{time.perf_counter() - began:5.0f} s] {line}",
                                                        flush=True))
    return {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "embedder": embedder.name, "target": cfg.target,
            "feature_set": cfg.feature_set, "draws": args.draws, "seed": args.seed, "min_rest": args.min_rest,
            "max_per_source": args.max_per_source, "features": int(x.shape[1]),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
            "seconds": round(time.perf_counter() - began, 1), "points": [asdict(p) for p in points],
            "summary": {m: {s: {str(n): round(v, 4) for n, v in row.items()} for s, row in per.items()}
                        for m, per in summary(points).items()}}


def print_tables(doc: dict[str, Any]) -> None:
    """The mean over sources per method and N, then every source's curve per method."""
    table: dict[str, dict[str, dict[str, float]]] = doc["summary"]
    ns = sorted({int(n) for per in table.values() for n in per["mean"]})
    head = "".join(f"{'N=' + str(n):>9}" for n in ns)
    print(f"\nAPGR on the rest of a source's traffic, mean over sources ({doc['draws']} draws each):")
    print(f"{'method':<26}{head}")
    for method, per in table.items():
        print(f"{method:<26}" + "".join(f"{per['mean'].get(str(n), float('nan')):>9.3f}" for n in ns))
    for source in (s for s in next(iter(table.values())) if s != "mean"):
        print(f"\n{source}:")
        print(f"{'method':<26}{head}")
        for method, per in table.items():
            row = per[source]
            print(f"{method:<26}" + "".join(f"{row[str(n)]:>9.3f}" if str(n) in row else f"{'':>9}" for n in ns))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.studies.learning_curve", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--routing-dir", type=Path, default=DEFAULT_ROUTING_DIR, help="the shared routing data")
    p.add_argument("--embedder", default=DEFAULT_TRAIN_EMBEDDER, help=f"default {DEFAULT_TRAIN_EMBEDDER}")
    p.add_argument("--sources", default=None, help="comma-separated public sources (default: all)")
    p.add_argument("--sizes", default=",".join(map(str, SIZES)), help="own-label counts N (default %(default)s)")
    p.add_argument("--draws", type=int, default=3, help="seeded random draws per N (default 3)")
    p.add_argument("--seed", type=int, default=0, help="seed of the draws (default 0)")
    p.add_argument("--min-rest", type=int, default=300, help="rows a source keeps for testing (default 300)")
    p.add_argument("--ks", default="100,300,1000,3000", help="k of the share mode, own share N/(N+k)")
    p.add_argument("--penalties", default="10,30,100,300,1000", help="penalties of the correction mode")
    p.add_argument("--memories", default="", help="label memories beside the public model, as neighbours:"
                   "bandwidth:prior[:structure[:slope|level[:slope_scale[:shrink[:sources[:early]]]]]],... (the served "
                   "default: 100:0.1:0.3:0.3:slope:0.5:0.3:300:300/0.9/0.125)")
    p.add_argument("--no-own-only", action="store_true", help="skip the own-labels-alone reference")
    p.add_argument("--max-per-source", type=int, default=None, help="evenly spaced rows per source (smoke runs)")
    p.add_argument("--json", type=Path, default=None, help="also write every point and the summary here")
    args = p.parse_args(argv)
    doc = run(args)
    print_tables(doc)
    print(f"\n{doc['seconds']:.0f} s on {doc['machine']}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
