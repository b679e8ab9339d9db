"""A cascade escalation goes through the same forwarding as every other request: a flagship canary that fails it
before any byte hands it to the flagship's own version (`canary-fallback`), as for a request routed there.

The flagship is a local pool run by the real supervisor (fake engines as processes, as in `control/test_canary.py`),
its canary an engine that answers every chat request with a 500; the micro pool a fake engine whose logprobs make
its answers unsure."""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path
from typing import Any

import httpx
import pytest

from backends.engines.supervisor import EngineSupervisor
from gateway.api.app import create_app
from gateway.control.fleet.canaries import takes_canary
from gateway.settings import Settings
from tests.conftest import Upstreams, policy_yaml
from tests.gateway.control.test_canary import _canary, _engine
from tests.gateway.serving.test_cascade import CASCADE, _body
from tests.servers import free_port, serve, until

BIG = """  big:
    type: local
    price: {{input_per_mtok: "3.00", output_per_mtok: "15.00"}}
    engine: {{model: fake-weights, served_name: big-model, base_port: {port}, startup_timeout_s: 30}}
{canary}"""


def _canary_ready(app: Any) -> bool:
    canary, pool = app.state.runtime.pool_set.canaries.get("big"), app.state.runtime.pool_set.pools.get("big")
    return canary is not None and canary.pool.ready and pool is not None and pool.ready


@pytest.mark.parametrize("stream", [False, True])
async def test_an_escalation_whose_flagship_canary_fails_is_served_by_the_flagships_own_version(
    tmp_path: Path, upstreams: Upstreams, monkeypatch: pytest.MonkeyPatch, stream: bool,
) -> None:
    supervisor = functools.partial(EngineSupervisor, command=_engine, check_interval_s=0.2, stop_grace_s=5)
    monkeypatch.setattr("gateway.control.fleet.pool_set.EngineSupervisor", supervisor)
    _, micro_url, _, flagship_url = upstreams
    big = BIG.format(port=free_port(), canary=_canary("broken-canary", 0.5, free_port()))
    policy = policy_yaml(micro_url, flagship_url, CASCADE).replace("pools:\n", "pools:\n" + big, 1)
    path = tmp_path / "policy.yaml"
    path.write_text(policy.replace("flagship_pool: flagship", "flagship_pool: big"))
    app = create_app(Settings(policy_path=path, scorer="length", start_engines=True, ledger="memory",
                              home=tmp_path, policy_watch_interval_s=0))
    users = [u for u in (f"user-{i}" for i in range(40)) if takes_canary("big", "u:" + u, 0.5)][:4]
    assert len(users) == 4  # the sticky split sends these users' requests to the canary
    with serve(app) as url:
        await asyncio.to_thread(until, lambda: _canary_ready(app))
        own = app.state.runtime.pool_set.pools["big"].version
        async with httpx.AsyncClient(timeout=30) as client:
            replies = [await client.post(url + "/v1/chat/completions", json={**_body(-3.0, stream), "user": user})
                       for user in users]
    assert [r.status_code for r in replies] == [200] * 4, replies[0].text
    for r in replies:
        assert (r.headers["x-cascade-pool"], r.headers["x-cascade-escalated"]) == ("big", "true")
        assert r.headers["x-cascade-route"] == "score:micro, cascade:big, canary:big, canary-fallback:big"
        assert r.headers["x-cascade-pool-version"] == own
        assert "big-model" in r.text
