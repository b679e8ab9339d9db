"""The example policies cover what ops configure (pools, rules, tenants, a ladder), and the exported JSON
Schema (what editors check against) accepts each of them and rejects a misspelt key, as the loader does."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from gateway.cli import policy as cli
from policies.loader import load_policy
from policies.schema import FallbackPool, LocalPool, Overflow, RemotePool

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "policies").glob("*.yaml"))


def _exported_schema(capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """The schema exactly as `cascade policy schema` prints it."""
    assert cli._schema(argparse.Namespace()) == 0
    schema: dict[str, Any] = json.loads(capsys.readouterr().out)
    return schema


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_passes_the_exported_json_schema(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    validator = jsonschema.Draft202012Validator(_exported_schema(capsys))
    policy = yaml.safe_load(path.read_text())
    errors = [f"{list(e.absolute_path)}: {e.message[:200]}" for e in validator.iter_errors(policy)]
    assert errors == []


def test_the_json_schema_rejects_an_unknown_key_and_a_bad_action(capsys: pytest.CaptureFixture[str]) -> None:
    validator = jsonschema.Draft202012Validator(_exported_schema(capsys))
    policy = yaml.safe_load((ROOT / "policies" / "default.yaml").read_text())
    policy["routing"]["treshold"] = 0.4
    assert not validator.is_valid(policy)
    policy = yaml.safe_load((ROOT / "policies" / "multi-tenant.yaml").read_text())
    policy["degradation"]["steps"][0]["action"] = {"type": "panic"}
    assert not validator.is_valid(policy)


def test_the_gpu_example_has_the_pools_the_issue_names() -> None:
    policy = load_policy(ROOT / "policies" / "gpu.yaml").policy
    local = {name: p for name, p in policy.pools.items() if isinstance(p, LocalPool)}
    assert "7B-Instruct" in local["micro"].engine.model
    flagship = local["flagship"].engine
    assert flagship.moe and flagship.speculative is not None
    assert any(p.engine.quantization in ("awq", "fp8") for p in local.values())
    remaps = [s.action for s in policy.degradation.steps if isinstance(s.action, FallbackPool | Overflow)]
    fallback = next(a for a in remaps if isinstance(a, FallbackPool))
    assert local[fallback.to_pool].engine.quantization in ("awq", "fp8")
    overflow = next(a for a in remaps if isinstance(a, Overflow))
    cloud = policy.pools[overflow.to_pool]
    assert isinstance(cloud, RemotePool) and cloud.api_key_env


def test_the_multi_tenant_example_has_tenants_with_their_own_terms() -> None:
    policy = load_policy(ROOT / "policies" / "multi-tenant.yaml").policy
    tenants = policy.tenants.values()
    assert len(policy.tenants) >= 3 and all(t.api_key_sha256 for t in tenants)
    assert any(t.allowed_pools for t in tenants) and len({t.priority for t in tenants}) > 1
    assert any(t.budget.daily_usd or t.budget.monthly_usd for t in tenants)
    assert any(t.rate_limits.requests_per_minute or t.rate_limits.tokens_per_minute for t in tenants)
