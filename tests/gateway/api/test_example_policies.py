"""Each shipped example policy is served: a gateway starts on it (its engines not started here) and answers
`/v1/models` with its pools; the multi-tenant example turns on what a user would: a cached tenant, input guards,
output checks."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from gateway.api.app import create_app
from gateway.settings import Settings
from policies.loader import load_policy
from tests.servers import serve

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = sorted((ROOT / "policies").glob("*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_policy_is_served(path: Path, tmp_path: Path) -> None:
    loaded = load_policy(path)
    settings = Settings(policy_path=path, scorer="length", start_engines=False, ledger="memory", home=tmp_path,
                        policy_watch_interval_s=0)
    with serve(create_app(settings)) as url:
        models = httpx.get(url + "/v1/models", timeout=30)
    assert models.status_code == 200, models.text
    served = {m["id"] for m in models.json()["data"]}
    assert set(loaded.policy.pools) <= served and "auto" in served


def test_the_multi_tenant_example_turns_on_a_cache_guards_and_output_checks() -> None:
    policy = load_policy(ROOT / "policies" / "multi-tenant.yaml").policy
    assert any(t.cache is not None for t in policy.tenants.values())
    assert any(t.guards.model_dump(exclude_defaults=True) for t in policy.tenants.values())  # default: no guard
    assert policy.output_checks is not None
