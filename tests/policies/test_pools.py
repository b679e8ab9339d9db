"""Pool fields whose defaults depend on the kind of pool."""

from __future__ import annotations

from typing import Any

import pytest

from policies.pools import LocalPool, RemotePool

_PRICE = {"input_per_mtok": "0.2", "output_per_mtok": "0.2"}
_ENGINE = {"model": "demo:micro", "served_name": "micro"}


def _local(**fields: Any) -> LocalPool:
    return LocalPool.model_validate({"type": "local", "price": _PRICE, "engine": _ENGINE, **fields})


def _remote(**fields: Any) -> RemotePool:
    return RemotePool.model_validate({"type": "remote", "price": _PRICE, "urls": ["https://x"], "model": "m",
                                      **fields})


@pytest.mark.parametrize(("pool", "required"), [
    (_local(), True),
    (_local(on_demand={"idle_stop_after_s": 60, "cold_start_timeout_s": 60}), False),  # asleep is its normal state
    (_remote(), False),  # a cloud outage must not take every gateway out of service
    (_local(required_for_ready=False), False),
    (_local(on_demand={"idle_stop_after_s": 60, "cold_start_timeout_s": 60}, required_for_ready=True), True),
    (_remote(required_for_ready=True), True),
], ids=["local", "on-demand", "remote", "local-optional", "on-demand-required", "remote-required"])
def test_which_pools_readiness_needs(pool: LocalPool | RemotePool, required: bool) -> None:
    assert pool.needed_for_ready is required
