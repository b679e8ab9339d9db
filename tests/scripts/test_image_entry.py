"""The image's entry point (scripts/image_entry.py): `--engine POOL=URL` turns a local pool into a remote
pool on the engine container, and the gateway's /readyz still waits for it, as it waits for a local pool
(remote pools are optional for readiness by default, so without this the stack is "ready" before its engines
and answers 503)."""

from __future__ import annotations

import pytest
import yaml

from policies.loader import parse_policy
from policies.pools import LocalPool, RemotePool, as_remote_pool
from tests.scripts import ROOT, load_script

entry = load_script("image_entry")


@pytest.mark.parametrize("name", ["default.yaml", "gpu.yaml"])
def test_engine_pools_keep_what_readiness_needs_of_them(name: str) -> None:
    raw = yaml.safe_load((ROOT / "policies" / name).read_text(encoding="utf-8"))
    original = parse_policy(yaml.safe_dump(raw), source=name).policy
    local = {n: p for n, p in original.pools.items() if isinstance(p, LocalPool)}
    rendered = entry.remote_policy(raw, {n: f"http://engine-{n}:8000" for n in local})
    served = parse_policy(yaml.safe_dump(rendered), source="rendered").policy
    for pool, spec in local.items():
        remote = served.pools[pool]
        assert isinstance(remote, RemotePool) and remote.urls == (f"http://engine-{pool}:8000",)
        assert remote.needed_for_ready == spec.needed_for_ready, pool
    assert any(spec.needed_for_ready for spec in local.values())
    if name == "gpu.yaml":  # its on-demand pool may sleep: still optional
        assert not all(spec.needed_for_ready for spec in local.values())


def test_a_pool_that_is_not_local_is_refused() -> None:
    raw = yaml.safe_load((ROOT / "policies" / "default.yaml").read_text(encoding="utf-8"))
    with pytest.raises(ValueError, match="no local pool 'nope'"):
        entry.remote_policy(raw, {"nope": "http://x:8000"})


def test_a_pool_moved_to_its_own_engine_keeps_its_breaker_and_readiness() -> None:
    """The one conversion both the image and `cascade deploy render` use."""
    raw = yaml.safe_load((ROOT / "policies" / "default.yaml").read_text(encoding="utf-8"))
    micro = dict(raw["pools"]["micro"], breaker={"failure_threshold": 2, "cooldown_s": 30},
                 required_for_ready=False)
    remote = RemotePool.model_validate(as_remote_pool(micro, ["http://a:8000", "http://b:8000"]))
    local = LocalPool.model_validate(micro)
    assert remote.urls == ("http://a:8000", "http://b:8000") and remote.model == local.engine.served_name
    assert (remote.price, remote.breaker, remote.needed_for_ready) == (local.price, local.breaker, False)
    assert remote.breaker.failure_threshold == 2


def test_a_pool_moved_to_its_own_engine_keeps_what_the_gateway_does_with_it() -> None:
    """Output checks, replica choice, its place on the pool map, expected completion tokens and the context window
    are the gateway's side of a pool: an engine moved to pods of its own must not lose them (they were dropped)."""
    raw = yaml.safe_load((ROOT / "policies" / "default.yaml").read_text(encoding="utf-8"))
    micro = dict(raw["pools"]["micro"], output_checks={"json": "escalate"}, replica_choice={"queue": 3.0},
                 placement="routerbench/mistralai/mistral-7b-chat", expected_completion_tokens=400)
    local = LocalPool.model_validate(micro)
    remote = RemotePool.model_validate(as_remote_pool(micro, ["http://a:8000"]))
    assert (remote.output_checks, remote.replica_choice) == (local.output_checks, local.replica_choice)
    assert (remote.placement, remote.expected_completion_tokens) == (local.placement, 400)
    assert remote.context_tokens == local.engine.max_model_len  # context-fit still checks what the engine holds
