"""CPU the pool map adds to one routed request: `pool_map.quality` on the one feature row the scorer kept, for a
policy of N tiers (the gateway's `tier_trade.tier_estimates` calls it once per request, on the event loop).

Distinct rows each call (real feature rows of shared-source prompts when the embedding cache has them, else random
rows of the same width: the cost does not depend on the values). Reports the median and p99 of per-call time over
`--calls` calls, after a warm-up, for N = 2, 3 and 5 tiers.

    flock /tmp/cascade-engines.lock python -m loadtest.bench.pool_map_cost --calls 20000
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from loadtest.bench.scorer_memory import SHARED_POOLS
from router_models.serving.placement import place_from_shared
from router_models.serving.pool_map import load_pool_map, quality

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args(argv)
    pool_map = load_pool_map()
    rows = np.random.default_rng(0).normal(0, 0.05, size=(args.calls, pool_map.dim)).astype(np.float32)
    for tiers in (2, 3, 5):
        # the cheapest pool and the tiers - 1 dearest (every one at 5)
        models = (SHARED_POOLS[0], *SHARED_POOLS[len(SHARED_POOLS) - tiers + 1:])
        placements = [place_from_shared(pool_map, m) for m in models]
        for i in range(min(1000, args.calls)):
            quality(pool_map, rows[i : i + 1], placements)
        times = []
        for i in range(args.calls):
            start = time.perf_counter_ns()
            quality(pool_map, rows[i : i + 1], placements)
            times.append(time.perf_counter_ns() - start)
        us = np.asarray(times) / 1000
        print(f"{tiers} tiers: median {np.median(us):.1f} us, p99 {np.percentile(us, 99):.1f} us per request "
              f"({args.calls} calls, distinct rows)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
