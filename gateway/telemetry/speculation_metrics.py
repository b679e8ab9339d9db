"""Speculative decoding as the gateway sees it, read from the pools at scrape time.

Each replica's engine counts the tokens its proposer drafted and the tokens the model accepted (vLLM's
`vllm:spec_decode_num_draft_tokens_total` / `..._accepted_tokens_total`, scraped with its load every probe
interval, `backends.clients.pool.parse_vllm_metrics`). They are re-exported per replica as counters (they restart
from 0 with the engine, which Prometheus's `rate` handles), and per pool as one acceptance figure: accepted over
drafted, summed over the replicas, since they started. `rate(accepted) / rate(drafted)` over the counters gives it
over a window. Pools whose engines report no speculative decoding are left out; so is a pool's acceptance until
its engines have drafted a token.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from backends.clients.pool import Pool

__all__ = ["SpeculationCollector"]


class SpeculationCollector(Collector):
    """`cascade_replica_spec_decode_{draft,accepted}_tokens_total{pool,replica}` and
    `cascade_pool_spec_decode_acceptance{pool}` (0..1). Reads `pools()` at every scrape; owns nothing."""

    def __init__(self, pools: Callable[[], Mapping[str, Pool]]) -> None:
        self._pools = pools

    def collect(self) -> Iterable[Metric]:
        drafted = CounterMetricFamily("cascade_replica_spec_decode_draft_tokens", "speculative decoding: tokens "
                                      "the engine's proposer drafted since it started, as scraped",
                                      labels=["pool", "replica"])
        accepted = CounterMetricFamily("cascade_replica_spec_decode_accepted_tokens", "speculative decoding: "
                                       "drafted tokens the model accepted since the engine started, as scraped",
                                       labels=["pool", "replica"])
        acceptance = GaugeMetricFamily("cascade_pool_spec_decode_acceptance", "share of drafted tokens the model "
                                       "accepted (0..1), over the pool's replicas since they started",
                                       labels=["pool"])
        for name, pool in self._pools().items():
            loads = [(r.url, r.load) for r in pool.replicas if r.load.speculative]
            for url, load in loads:
                drafted.add_metric([name, url], load.draft_tokens)
                accepted.add_metric([name, url], load.accepted_tokens)
            total = sum(load.draft_tokens for _, load in loads)
            if total > 0:
                acceptance.add_metric([name], sum(load.accepted_tokens for _, load in loads) / total)
        return [drafted, accepted, acceptance]
