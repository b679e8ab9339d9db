"""Tenants by API key hash: open without tenants, 401 with an OpenAI body for a missing or wrong key."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.api.auth import OPEN_TENANT, hash_key, tenant_for
from gateway.errors import AuthenticationError
from policies.loader import parse_policy

ROOT = Path(__file__).resolve().parents[3]
BASE = (ROOT / "policies" / "default.yaml").read_text()


def test_open_policy_has_one_tenant() -> None:
    assert tenant_for(parse_policy(BASE).policy, None) == OPEN_TENANT


def test_keys_map_to_tenants_by_hash() -> None:
    policy = parse_policy(BASE + f"tenants:\n  acme: {{api_key_sha256: ['{hash_key('sk-acme')}']}}\n").policy
    assert tenant_for(policy, "Bearer sk-acme") == "acme"
    for header in (None, "", "Bearer ", "Basic sk-acme", "Bearer sk-other"):
        with pytest.raises(AuthenticationError) as err:
            tenant_for(policy, header)
        assert err.value.status == 401
        assert "sk-" not in err.value.message  # never echo a key
