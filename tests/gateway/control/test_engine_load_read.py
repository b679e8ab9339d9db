"""Which pools' engine load the policy reads (`gateway.control.fleet.pool_build.engine_load_read`): the probe scrapes an
engine's `/metrics` every second only for those."""

from __future__ import annotations

from typing import Any

from gateway.control.fleet.pool_build import engine_load_read
from policies.schema import Policy

PRICE = {"input_per_mtok": "1", "output_per_mtok": "1"}


def _policy(steps: list[dict[str, Any]] | None = None, autoscale: dict[str, Any] | None = None,
            **micro_engine: Any) -> Policy:
    def local(name: str, port: int, **engine: Any) -> dict[str, Any]:
        return {"type": "local", "price": PRICE, "engine": {"model": f"demo:{name}", "served_name": name,
                                                            "base_port": port, **engine}}

    micro = {**local("micro", 8101, **micro_engine), **({"autoscale": autoscale} if autoscale else {})}
    return Policy.model_validate({
        "pools": {"micro": micro, "flagship": local("flagship", 8201)},
        "routing": {"micro_pool": "micro", "flagship_pool": "flagship", "threshold": 0.5},
        "degradation": {"steps": steps or []}})


def _step(signal: str, pool: str) -> dict[str, Any]:
    return {"name": f"{signal}-{pool}", "signal": signal, "pool": pool, "enter_above": 0.9, "exit_below": 0.5,
            "action": {"type": "raise_threshold", "threshold": 0.9}}


def test_without_a_ladder_autoscaler_or_speculation_no_pool_needs_its_engines_load() -> None:
    policy = _policy()
    assert not engine_load_read(policy, "micro") and not engine_load_read(policy, "flagship")
    assert engine_load_read(policy, "gone")  # a pool being retired: as before


def test_a_ladder_step_on_a_scraped_signal_reads_its_pool_only() -> None:
    policy = _policy([_step("kv_cache_usage", "micro"), _step("error_rate", "flagship")])
    assert engine_load_read(policy, "micro") and not engine_load_read(policy, "flagship")  # error_rate: our own


def test_speculative_decoding_reads_its_counters() -> None:
    policy = _policy(speculative={"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4,
                                  "prompt_lookup_min": 2})
    assert engine_load_read(policy, "micro") and not engine_load_read(policy, "flagship")


def test_an_autoscaler_reads_its_pools_load_where_it_watches_a_scraped_signal() -> None:
    assert engine_load_read(_policy(autoscale={"max_replicas": 2, "scale_up": {"queue_depth": 4}}), "micro")
    assert not engine_load_read(_policy(autoscale={"max_replicas": 2, "scale_up": {"in_flight": 8}}), "micro")
