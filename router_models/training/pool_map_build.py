"""Build the shipped pool map: `python -m router_models.training.pool_map_build [--out PATH] [--k K]`.

Fits `pool_map_fit.fit_pool_map` on every model of every shared source (`outcomes.load_outcomes`, all seven, with
the all-models files), on the feature rows of the router artifact's embedder (cached on disk after the first run,
`embedders.disk_cache`), and writes `router_models/artifacts/pool-map.{json,npz}`. Deterministic (seeded, one thread).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from router_models.embedders.factory import make_embedder
from router_models.serving.artifact import DEFAULT_ARTIFACT, load_artifact
from router_models.serving.pool_map import DEFAULT_POOL_MAP, save_pool_map
from router_models.training.outcomes import DEFAULT_ROUTING_DIR, data_hash, load_outcomes
from router_models.training.pool_map_fit import FitConfig, fit_pool_map
from router_models.training.trainer import features

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_POOL_MAP)
    parser.add_argument("--routing-dir", type=Path, default=DEFAULT_ROUTING_DIR)
    parser.add_argument("--artifact", type=Path, default=DEFAULT_ARTIFACT, help="the router whose embedder to read")
    parser.add_argument("--k", type=int, default=FitConfig().k, help="domain axes")
    parser.add_argument("--max-per-source", type=int, default=None)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    embedder = make_embedder(load_artifact(args.artifact).embedder)
    examples = load_outcomes(args.routing_dir, max_per_source=args.max_per_source)
    x = features(embedder, examples, "embedding+structure")
    print(f"[pool-map] {len(examples)} prompts, feature rows {x.shape} ({time.perf_counter() - start:.0f} s)")
    pool_map = fit_pool_map(x, examples, embedder.name, FitConfig(k=args.k))
    pool_map.metadata.update(data_sha256=data_hash(examples),
                             sources=sorted({ex.source for ex in examples}), prompts=len(examples))
    path = save_pool_map(pool_map, args.out)
    print(f"[pool-map] {pool_map.metadata['fit']} in {time.perf_counter() - start:.0f} s; wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
