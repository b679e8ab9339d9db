"""API keys ops issue and revoke at run time (`cascade keys`, `/admin/keys`), kept hashed in Redis beside the
policy's keys, which keep working.

A key is `sk-cascade-` and 43 random URL-safe characters, shown once when created and never stored: Redis holds
its SHA-256. Its id is the first 12 hex digits of that digest (`gateway.api.auth.key_id`), the name logs, cost
records and reports use for policy keys and issued keys alike. Layout, under the gateway's prefix:
`{prefix}apikeys:{sha256}` (hash: the `ApiKey` fields) and `{prefix}apikeys:ids` (hash: id → sha256, the index
`list` and `revoke` read). A revoked key stays, marked `revoked_at`, so `list` shows it; an expired one too.

Per-key limits and budget (`rpm`, `tpm`, `daily_usd`) apply inside the tenant's (`gateway.tenancy.admission`).
The store owns no connection: the client is borrowed; every method raises the client's errors.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from policies.schema import RateLimits

__all__ = ["KEY_PREFIX", "OPEN_TENANT", "ApiKey", "KeyStore", "TenantProblem", "digest_of", "id_of", "unknown_tenant"]

KEY_PREFIX = "sk-cascade-"
OPEN_TENANT = "default"  # every caller's tenant under a policy that names none


class TenantProblem(NamedTuple):
    """Why a key for a tenant would not be served as that tenant (`why`), and what to do before creating it (`fix`).
    A refusal says both; the warning of a key created anyway says only `why`: the fix is for the key not made."""

    why: str
    fix: str

    def __str__(self) -> str:
        return f"{self.why}. {self.fix}"


def unknown_tenant(tenant: str, tenants: Collection[str], source: str) -> TenantProblem | None:
    """Why a key for `tenant` would not be served as that tenant by a gateway on the policy `source` naming
    `tenants` (None: it would). The caller adds how to create the key anyway."""
    if tenant in tenants or (not tenants and tenant == OPEN_TENANT):
        return None
    if not tenants:
        return TenantProblem(
            f"the policy {source} names no tenants: every caller is served as tenant {OPEN_TENANT!r}, so a key for "
            f"{tenant!r} is served as {OPEN_TENANT!r} (its own limits and budget still apply)",
            f"Create it with tenant {OPEN_TENANT!r}, or name {tenant!r} under `tenants:` in the policy and reload "
            f"first")
    return TenantProblem(
        f"tenant {tenant!r} is not in the policy {source} (its tenants: {', '.join(sorted(tenants))}): a key for it "
        f"is refused (401) until the policy names it", f"Add {tenant!r} under `tenants:` and reload first")


def digest_of(key: str) -> str:
    """Hex SHA-256 of a key as sent (stripped)."""
    return hashlib.sha256(key.strip().encode()).hexdigest()


def id_of(digest: str) -> str:
    """A key's id: the first 12 hex digits of its digest."""
    return digest[:12]


@dataclass(frozen=True, slots=True)
class ApiKey:
    """Who a bearer key is. Times are UTC epoch seconds; money integer micro-USD. `source` "policy" for a key of
    the policy file (no limits of its own), "issued" for one from the store."""

    id: str
    tenant: str
    source: Literal["policy", "issued"] = "issued"
    name: str = ""
    created_at: float = 0.0
    expires_at: float | None = None
    revoked_at: float | None = None
    limits: RateLimits = field(default_factory=RateLimits)
    daily_usd: int | None = None

    def refusal(self, now: float) -> str | None:
        """Why the key may not be used at `now` ("revoked", "expired"), or None."""
        if self.revoked_at is not None and self.revoked_at <= now:
            return "revoked"
        if self.expires_at is not None and self.expires_at <= now:
            return "expired"
        return None

    def public(self) -> dict[str, Any]:
        """The key's description for `list` and `/admin/keys` (no secret: there is none to show)."""
        return {"id": self.id, "tenant": self.tenant, "name": self.name, "created_at": self.created_at,
                "expires_at": self.expires_at, "revoked_at": self.revoked_at,
                "rpm": self.limits.requests_per_minute, "tpm": self.limits.tokens_per_minute,
                "daily_usd_micro": self.daily_usd}


_FLOATS = ("created_at", "expires_at", "revoked_at")


def _to_hash(key: ApiKey) -> dict[str, str]:
    out = {"id": key.id, "tenant": key.tenant, "name": key.name}
    out |= {name: "" if getattr(key, name) is None else repr(float(getattr(key, name))) for name in _FLOATS}
    limits = key.limits
    for name, value in (("rpm", limits.requests_per_minute), ("tpm", limits.tokens_per_minute),
                        ("daily_usd", key.daily_usd)):
        out[name] = "" if value is None else str(value)
    return out


def _from_hash(raw: Mapping[bytes | str, bytes | str]) -> ApiKey:
    text = {(k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
            for k, v in raw.items()}

    def number(name: str) -> int | None:
        return int(text[name]) if text.get(name) else None

    times = {name: float(text[name]) if text.get(name) else None for name in _FLOATS}
    limits = RateLimits(requests_per_minute=number("rpm"), tokens_per_minute=number("tpm"))
    return ApiKey(id=text["id"], tenant=text["tenant"], name=text.get("name", ""),
                  created_at=times["created_at"] or 0.0, expires_at=times["expires_at"],
                  revoked_at=times["revoked_at"], limits=limits, daily_usd=number("daily_usd"))


class KeyStore:
    """Issued keys in Redis (see the module docstring). `clock`: UTC epoch seconds (tests move it)."""

    def __init__(self, client: Any, prefix: str = "cascade:", clock: Any = time.time) -> None:
        self._client = client
        self._prefix = prefix
        self._clock = clock

    def _key(self, digest: str) -> str:
        return f"{self._prefix}apikeys:{digest}"

    @property
    def _ids(self) -> str:
        return f"{self._prefix}apikeys:ids"

    async def create(self, tenant: str, name: str = "", *, limits: RateLimits | None = None,
                     daily_usd: int | None = None, expires_at: float | None = None) -> tuple[str, ApiKey]:
        """A new key for `tenant`: (the key itself, shown once; its stored description). Two writes: the key, then
        the index (a key whose index write failed authenticates, and `create` raised: it was never shown)."""
        secret = KEY_PREFIX + secrets.token_urlsafe(32)
        digest = digest_of(secret)
        key = ApiKey(id=id_of(digest), tenant=tenant, name=name, created_at=self._clock(), expires_at=expires_at,
                     limits=limits or RateLimits(), daily_usd=daily_usd)
        await self._client.hset(self._key(digest), mapping=_to_hash(key))
        await self._client.hset(self._ids, key.id, digest)
        return secret, key

    async def get(self, digest: str) -> ApiKey | None:
        """The key with this digest (revoked and expired ones included), or None. One round trip."""
        raw = await self._client.hgetall(self._key(digest))
        return _from_hash(raw) if raw else None

    async def by_id(self, key_id: str) -> ApiKey | None:
        """The issued key with this id (revoked and expired ones included), or None. Two round trips."""
        digest = await self._client.hget(self._ids, key_id)
        if digest is None:
            return None
        return await self.get(digest.decode() if isinstance(digest, bytes) else digest)

    async def list(self, tenant: str | None = None) -> list[ApiKey]:
        """Every issued key (of `tenant`), oldest first. Two round trips."""
        digests = await self._client.hvals(self._ids)
        async with self._client.pipeline(transaction=False) as pipe:
            for digest in digests:
                pipe.hgetall(self._key(digest.decode() if isinstance(digest, bytes) else digest))
            found = await pipe.execute() if digests else []
        keys = [_from_hash(raw) for raw in found if raw]
        return sorted((k for k in keys if tenant is None or k.tenant == tenant), key=lambda k: (k.created_at, k.id))

    async def revoke(self, key_or_id: str) -> ApiKey | None:
        """Revoke a key given itself or its id; returns it as revoked, or None when no issued key matches. A key
        revoked before keeps its first `revoked_at`."""
        text = key_or_id.strip()
        digest = digest_of(text) if text.startswith(KEY_PREFIX) else await self._client.hget(self._ids, text)
        if digest is None:
            return None
        digest = digest.decode() if isinstance(digest, bytes) else digest
        key = await self.get(digest)
        if key is None:
            return None
        if key.revoked_at is None:
            await self._client.hset(self._key(digest), "revoked_at", repr(float(self._clock())))
            key = await self.get(digest)
        return key

