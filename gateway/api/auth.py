"""Who is calling: bearer API key → tenant name, by the key's SHA-256 (keys are never stored)."""

from __future__ import annotations

import hashlib

from gateway.errors import AuthenticationError
from policies.schema import Policy

__all__ = ["OPEN_TENANT", "hash_key", "key_id", "tenant_for"]

OPEN_TENANT = "default"


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def key_id(authorization: str | None) -> str:
    """A name for the bearer key that logs and records may carry: the first 12 hex digits of its SHA-256 (48 bits
    of a digest: names a key among a tenant's, says nothing about it); "" without a bearer key."""
    scheme, _, key = (authorization or "").partition(" ")
    return hash_key(key.strip())[:12] if scheme.lower() == "bearer" and key.strip() else ""


def tenant_for(policy: Policy, authorization: str | None) -> str:
    """The tenant owning the bearer key. A policy without tenants is open: everyone is `default`."""
    if not policy.tenants:
        return OPEN_TENANT
    scheme, _, key = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise AuthenticationError("missing API key: send `Authorization: Bearer <key>`")
    digest = hash_key(key.strip())
    for name, tenant in policy.tenants.items():
        if digest in tenant.api_key_sha256:
            return name
    raise AuthenticationError("invalid API key")
