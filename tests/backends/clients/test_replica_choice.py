"""Which replica a new request goes to: the least weighted load, the weights from the pool's policy
(`replica_choice`). Two replicas alike but for what one engine reports; 100 requests held in flight as they are
placed, as a burst would be."""

from __future__ import annotations

from collections import Counter

import pytest

from backends.clients.pool import ChoiceWeights, EngineLoad, Pool
from gateway.control.fleet.pool_build import choice_weights
from policies.loader import parse_policy
from tests.conftest import policy_yaml


class _NoClient:
    async def get_text(self, *_: object, **__: object) -> str:
        raise AssertionError("not probed here")


def _placed(weights: ChoiceWeights, busy: EngineLoad, n: int = 100) -> Counter[str]:
    """Where `n` new requests go (each stays in flight) when replica `busy` reports `busy` and `idle` nothing."""
    pool = Pool("p", ["http://busy", "http://idle"], _NoClient(), weights=weights)  # type: ignore[arg-type]
    for replica in pool.replicas:
        replica.healthy = True
    pool.replicas[0].load = busy
    placed: Counter[str] = Counter()
    for _ in range(n):
        chosen = pool.choose()
        assert chosen is not None
        chosen.in_flight += 1
        placed[chosen.url.removeprefix("http://")] += 1
    return placed


@pytest.mark.parametrize("busy", [EngineLoad(kv_cache_usage=0.95), EngineLoad(waiting=6.0)],
                         ids=["fuller-kv-cache", "longer-queue"])
def test_a_replica_reporting_more_load_gets_fewer_new_requests(busy: EngineLoad) -> None:
    placed = _placed(ChoiceWeights(), busy)
    assert placed["busy"] < placed["idle"] and placed["busy"] + placed["idle"] == 100
    assert placed["idle"] - placed["busy"] >= 3  # the default weights: KV 4 per unit, queue 2 per request


def test_the_weights_are_the_pools_policy_and_a_zero_weight_ignores_its_signal() -> None:
    text = policy_yaml("http://127.0.0.1:1", "http://127.0.0.1:2").replace(
        "    model: micro-model\n", "    model: micro-model\n    replica_choice: {kv_cache: 40, queue: 0}\n")
    policy = parse_policy(text).policy
    weights = choice_weights(policy.pools["micro"])
    assert weights == ChoiceWeights(in_flight=1.0, running=0.5, queue=0.0, kv_cache=40.0)
    assert choice_weights(policy.pools["flagship"]) == ChoiceWeights()
    kv = _placed(weights, EngineLoad(kv_cache_usage=0.95))
    assert kv["idle"] - kv["busy"] >= 37  # a KV cache 95% full weighs 38 requests in flight
    queue = _placed(weights, EngineLoad(waiting=6.0))
    assert queue["busy"] == queue["idle"] == 50  # a queue weighted 0 is not looked at
    with pytest.raises(Exception, match="replica_choice"):
        parse_policy(text.replace("kv_cache: 40", "kv_cache: -1"))
