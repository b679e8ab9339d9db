"""Speculative decoding on the gateway's /metrics: per-replica counters and a per-pool acceptance, read from the
pools at scrape time; pools without it left out."""

from __future__ import annotations

from backends.clients.pool import EngineLoad, Pool
from backends.clients.shared import Headers
from gateway.telemetry.metrics import GatewayMetrics


class _NoEngine:
    async def get_text(self, url: str, timeout_s: float = 2.0, headers: Headers | None = None) -> str:
        raise AssertionError("the scrape must read the pools, not call engines")


def _pool(name: str, *loads: EngineLoad) -> Pool:
    pool = Pool(name, [f"http://127.0.0.1:{8100 + i}" for i in range(len(loads))], _NoEngine())  # type: ignore[arg-type]
    for replica, load in zip(pool.replicas, loads, strict=True):
        replica.load = load
    return pool


def _lines(text: str, prefix: str) -> list[str]:
    return sorted(line for line in text.splitlines() if line.startswith(prefix))


def test_acceptance_per_pool_and_counters_per_replica() -> None:
    pools = {
        "micro": _pool("micro", EngineLoad(speculative=True, draft_tokens=300, accepted_tokens=90),
                       EngineLoad(speculative=True, draft_tokens=100, accepted_tokens=10)),
        "flagship": _pool("flagship", EngineLoad(running=2)),  # no speculative decoding
        "fresh": _pool("fresh", EngineLoad(speculative=True)),  # speculating, nothing drafted yet
    }
    text = GatewayMetrics(lambda: pools).render().decode()
    assert _lines(text, "cascade_pool_spec_decode_acceptance{") == [
        'cascade_pool_spec_decode_acceptance{pool="micro"} 0.25']
    assert _lines(text, "cascade_replica_spec_decode_draft_tokens_total{") == [
        'cascade_replica_spec_decode_draft_tokens_total{pool="fresh",replica="http://127.0.0.1:8100"} 0.0',
        'cascade_replica_spec_decode_draft_tokens_total{pool="micro",replica="http://127.0.0.1:8100"} 300.0',
        'cascade_replica_spec_decode_draft_tokens_total{pool="micro",replica="http://127.0.0.1:8101"} 100.0']
    assert 'cascade_replica_spec_decode_accepted_tokens_total{pool="micro",replica="http://127.0.0.1:8101"} 10.0' \
        in text
    assert 'pool="flagship"' not in "".join(_lines(text, "cascade_replica_spec_decode"))
