"""How often the semantic response cache would answer a prompt with another prompt's answer (false hits).

The prompts are real, public and written by others: every prompt of the routing data
(`/work/shared/data/routing`, each source's SOURCE.md names its origin) that the semantic cache would compare,
i.e. one the shipped embedder reads whole (`gateway.caching.keys.reads_whole`: about 186 characters), de-duplicated
by case-folded text. Two different prompts of these sets ask different things (another exam question, other
numbers, another user's request), so every pair is a pair that differs in meaning. Each is embedded by the
router's own model (the shipped artifact's embedder, `router_models.serving.classifier_scorer.load_model`),
normalised and quantised to int8 exactly as the cache stores it (`gateway.caching.vectors`).

Reported per threshold: the share of prompts whose nearest OTHER prompt reaches it (had that one been cached, the
prompt would have been served its answer: the false-hit rate of a cache holding the whole set, the worst case),
per source and overall, and the share of all pairs; the most similar pairs for inspection; how far int8 moves a
cosine; and what a lookup's scan and Redis read cost at 1,024 and 4,096 rows.

`python -m loadtest.studies.cache_similarity [--max-prompts N] [--out FILE]`
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from gateway.caching.keys import reads_whole
from gateway.caching.vectors import encode_row, nearest, quantise
from router_models.serving.classifier_scorer import load_model
from router_models.training.outcomes import load_outcomes

__all__ = ["false_hits", "main"]

RESULTS_DIR = Path(__file__).resolve().parents[1] / "results"
THRESHOLDS = (0.80, 0.85, 0.90, 0.92, 0.94, 0.95, 0.96, 0.97, 0.98, 0.99)
_SPACES = re.compile(r"\s+")


def _prompts(space: str, limit: int) -> tuple[list[str], list[str]]:
    texts, sources, seen = [], [], set()
    for ex in load_outcomes():
        key = _SPACES.sub(" ", ex.text.casefold()).strip()
        if key and key not in seen and reads_whole(space, ex.text):
            seen.add(key)
            texts.append(ex.text)
            sources.append(ex.source)
    if len(texts) > limit:  # evenly spaced: every source keeps its share
        keep = np.linspace(0, len(texts) - 1, limit).round().astype(int)
        texts, sources = [texts[i] for i in keep], [sources[i] for i in keep]
    return texts, sources


def false_hits(q: npt.NDArray[np.int8], sources: list[str]) -> dict[str, Any]:
    """Nearest-other similarities of int8 rows `q`, and the false-hit rates per threshold."""
    f = q.astype(np.float32) / 127.0
    sims = f @ f.T
    np.fill_diagonal(sims, -np.inf)
    best = sims.max(axis=1)
    upper = sims[np.triu_indices(len(q), k=1)]
    rates = []
    for t in THRESHOLDS:
        per_source: dict[str, list[bool]] = defaultdict(list)
        for s, b in zip(sources, best, strict=True):
            per_source[s].append(bool(b >= t))
        rates.append({"threshold": t, "prompts_with_a_false_hit": float(np.mean(best >= t)),
                      "pairs_over": float(np.mean(upper >= t)),
                      "per_source": {s: float(np.mean(v)) for s, v in sorted(per_source.items())}})
    return {"sims": sims, "best": best, "rates": rates}


def _top_pairs(sims: npt.NDArray[np.float32], texts: list[str], sources: list[str], k: int) -> list[dict[str, Any]]:
    flat = np.argsort(np.triu(sims, k=1), axis=None)[::-1][:k]
    out = []
    for idx in flat:
        i, j = divmod(int(idx), sims.shape[0])
        out.append({"similarity": round(float(sims[i, j]), 4), "a": texts[i][:120], "b": texts[j][:120],
                    "sources": [sources[i], sources[j]]})
    return out


def _scan_cost(q: npt.NDArray[np.int8], rows: int, redis_url: str | None) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    ctx = b"\x00" * 7 + b"\x01"
    table = {f"{i:016x}".encode(): encode_row(ctx, time.time(), q[int(rng.integers(len(q)))]) for i in range(rows)}
    query = q[0]
    times = []
    for _ in range(200):
        began = time.perf_counter()
        nearest(table, query, ctx, 0)
        times.append(time.perf_counter() - began)
    out: dict[str, Any] = {"rows": rows, "scan_ms_p50": 1000 * float(np.median(times))}
    if redis_url:
        import redis

        client = redis.Redis.from_url(redis_url)
        key = f"bench:cache-scan:{time.time_ns()}"
        try:
            client.hset(key, mapping=dict(table.items()))
            reads = []
            for _ in range(100):
                began = time.perf_counter()
                client.hgetall(key)
                reads.append(time.perf_counter() - began)
            out["hgetall_ms_p50"] = 1000 * float(np.median(reads))
            out["row_bytes"] = len(next(iter(table.values())))
        finally:
            client.delete(key)
            client.close()
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    model = load_model()
    space = model.embedder_name
    texts, sources = _prompts(space, args.max_prompts)
    print(f"{len(texts)} prompts the cache would compare (embedder {space}); embedding...", flush=True)
    began = time.perf_counter()
    vectors = np.vstack([model.score_and_embed(texts[i:i + 32])[1] for i in range(0, len(texts), 32)])
    print(f"embedded in {time.perf_counter() - began:.0f} s", flush=True)
    q = np.vstack([quantise(v) for v in vectors])
    found = false_hits(q, sources)
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    j = np.argmax(found["sims"], axis=1)
    exact = np.sum(unit * unit[j], axis=1)
    counts = {s: sources.count(s) for s in sorted(set(sources))}
    return {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "embedder": space, "prompts": len(texts),
        "prompts_per_source": counts, "rates": found["rates"],
        "nearest_similarity_quantiles": {str(p): float(np.quantile(found["best"], p / 100))
                                         for p in (50, 90, 95, 99, 99.9)},
        "int8_cosine_error": {"mean": float(np.mean(np.abs(found["best"] - exact))),
                              "max": float(np.max(np.abs(found["best"] - exact)))},
        "top_pairs": _top_pairs(found["sims"], texts, sources, args.top),
        "scan": [_scan_cost(q, rows, args.redis_url) for rows in (1024, 4096)],
    }


def _print(doc: dict[str, Any]) -> None:
    print(f"\n{doc['prompts']} prompts {doc['prompts_per_source']}")
    print("threshold  prompts with a false hit  pairs over")
    for r in doc["rates"]:
        per_source = json.dumps({k: round(100 * v, 2) for k, v in r["per_source"].items()})
        print(f"  {r['threshold']:.2f}     {100 * r['prompts_with_a_false_hit']:8.2f}%          "
              f"{100 * r['pairs_over']:.4f}%   {per_source}")
    print("nearest-other similarity quantiles:", doc["nearest_similarity_quantiles"])
    print("int8 vs float cosine error:", doc["int8_cosine_error"])
    for p in doc["top_pairs"]:
        print(f"  {p['similarity']:.4f} {p['sources']}\n      A: {p['a']!r}\n      B: {p['b']!r}")
    print("scan:", doc["scan"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.studies.cache_similarity", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--max-prompts", type=int, default=4000, help="prompts compared, evenly spaced (default 4000)")
    p.add_argument("--top", type=int, default=12, help="most similar pairs listed (default 12)")
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/0", help="Redis for the read cost ('' skips)")
    p.add_argument("--out", type=Path, help="JSON path (default loadtest/results/cache-similarity-<ts>.json)")
    args = p.parse_args(argv)
    doc = run(args)
    _print(doc)
    out = args.out or RESULTS_DIR / f"cache-similarity-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"results written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
