"""Who is calling: bearer API key → tenant, by the key's SHA-256 (keys are never stored).

Two sources: the policy's keys (`tenants.<name>.api_key_sha256`, no I/O) and the keys ops issue at run time
(`gateway.tenancy.api_keys`, in Redis). `KeyAuth` asks the policy first, then Redis, each issued key at most once
per `cache_s` (0.5 s), so a key created is served at once and a key revoked is refused within a second by every
worker and gateway. Redis unreachable: policy keys still authenticate; an issued key seen before follows its
tenant's `on_redis_outage` (fail_open: served as last seen; fail_closed: 503), one never seen is a 503.

A policy that names no tenants is open: every caller is tenant `default`, with or without a key. An issued key sent
to it is still looked up, so that its own limits and budget apply (it is served as `default`, whatever tenant it was
created for); a revoked or expired one is refused (401); any other key, or one that cannot be looked up (Redis
unreachable), is served as an anonymous caller.

Failed authentications are bounded per client address and unknown keys cached apart from valid ones
(`gateway.api.auth_limits`): an address that failed `burst` times answers 429 with `Retry-After` before its key is
looked up, and no flood of invalid keys evicts a valid one.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Callable
from dataclasses import replace
from functools import lru_cache

from gateway.api.auth_limits import FailedAuths, UnknownKeys, address_of
from gateway.errors import AdmissionUnavailable, AuthenticationError, TooManyRequests
from gateway.tenancy.api_keys import OPEN_TENANT, ApiKey, KeyStore, id_of
from gateway.tenancy.limits import FailOpen
from policies.schema import Policy

__all__ = ["OPEN_TENANT", "KeyAuth", "bearer_matches", "hash_key", "key_id", "require_admin", "tenant_for"]

_MAX_CACHED = 100_000  # valid issued keys remembered (the oldest dropped first); unknown ones: `UnknownKeys`


@lru_cache(maxsize=4096)
def _policy_key(key_id: str, tenant: str) -> ApiKey:
    """The `ApiKey` of a policy key (frozen, so one object serves every request with that key: building it, with
    its default limits, was a measurable share of a request's CPU)."""
    return ApiKey(id=key_id, tenant=tenant, source="policy")


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _bearer(authorization: str | None) -> str:
    scheme, _, key = (authorization or "").partition(" ")
    return key.strip() if scheme.lower() == "bearer" else ""


def bearer_matches(authorization: str | None, expected: str | None) -> bool:
    """Whether the bearer token is `expected` (compared in constant time); never when `expected` is unset."""
    given = (authorization or "").removeprefix("Bearer ").strip()
    return bool(expected) and hmac.compare_digest(given.encode(), (expected or "").encode())


def require_admin(authorization: str | None, admin_key: str | None) -> None:
    """Raise `AuthenticationError` (401) unless the bearer token is the admin key, saying what to do: a gateway
    started without `CASCADE_ADMIN_KEY` has no admin key, and only a restart with it set gives it one."""
    if not admin_key:
        raise AuthenticationError("this gateway was started without an admin key: set CASCADE_ADMIN_KEY in its "
                                  "environment and restart it to use the admin endpoints (the policy file watcher "
                                  "reloads edits without it)")
    if not bearer_matches(authorization, admin_key):
        raise AuthenticationError("admin endpoints need the admin key (CASCADE_ADMIN_KEY) as a bearer token")


def key_id(authorization: str | None) -> str:
    """A name for the bearer key that logs and records may carry: the first 12 hex digits of its SHA-256 (48 bits
    of a digest: names a key among a tenant's, says nothing about it); "" without a bearer key."""
    key = _bearer(authorization)
    return id_of(hash_key(key)) if key else ""


def tenant_for(policy: Policy, authorization: str | None) -> str:
    """The tenant owning the bearer key. A policy without tenants is open: everyone is `default`."""
    if not policy.tenants:
        return OPEN_TENANT
    key = _bearer(authorization)
    if not key:
        raise AuthenticationError("missing API key: send `Authorization: Bearer <key>`")
    digest = hash_key(key)
    for name, tenant in policy.tenants.items():
        if digest in tenant.api_key_sha256:
            return name
    raise AuthenticationError("invalid API key")


class KeyAuth:
    """`identify` a caller from the policy's keys and the issued ones (`store`; None: the policy's only). See the
    module docstring. `failures` bounds failed authentications per client address (None: unbounded); `unknown`
    remembers unknown keys (default: 10,000 for `cache_s`). `monotonic` and `clock` (UTC epoch s) are for tests.
    Used from one event loop."""

    def __init__(self, store: KeyStore | None, cache_s: float = 0.5, *, op_timeout_s: float = 0.5,
                 failures: FailedAuths | None = None, unknown: UnknownKeys | None = None,
                 monotonic: Callable[[], float] = time.monotonic, clock: Callable[[], float] = time.time) -> None:
        self._store = store
        self._cache_s = cache_s
        self._monotonic = monotonic
        self._clock = clock
        self._cache: dict[str, tuple[float, ApiKey]] = {}  # digest -> (looked up at, key found)
        self._unknown = unknown or UnknownKeys(cache_s, monotonic=monotonic)
        self._failures = failures
        self._guard = FailOpen("API keys", op_timeout_s=op_timeout_s, monotonic=monotonic)

    @property
    def store(self) -> KeyStore | None:
        """Where issued keys live (None: this gateway has no Redis, so only the policy's keys)."""
        return self._store

    async def identify(self, policy: Policy, authorization: str | None, client: str | None = None) -> ApiKey:
        """The caller's key. Raises `AuthenticationError` (401: missing, unknown, revoked or expired key, or a
        tenant the policy no longer names), `TooManyRequests` (429: `client`, its address, failed too often) or
        `AdmissionUnavailable` (503: see the module docstring)."""
        key = _bearer(authorization)
        if not policy.tenants:
            return await self._open(key, policy)
        digest = hash_key(key) if key else ""
        for name, tenant in policy.tenants.items() if key else ():
            if digest in tenant.api_key_sha256:
                return _policy_key(id_of(digest), name)
        address = address_of(client)
        self._refuse_if_limited(address, digest)
        if not key:
            raise self._failed(address, "missing API key: send `Authorization: Bearer <key>`")
        issued = await self._issued(digest, policy) if self._store is not None else None
        if issued is None:
            raise self._failed(address, "invalid API key")
        if (why := issued.refusal(self._clock())) is not None:
            raise self._failed(address, f"API key {issued.id} is {why}")
        if issued.tenant not in policy.tenants:
            raise self._failed(address, f"API key {issued.id} belongs to tenant {issued.tenant!r}, which the "
                               f"policy this gateway serves does not name: its operator must add {issued.tenant!r} "
                               "under `tenants:` and reload the policy, or issue a key for a tenant it names")
        return issued

    def _refuse_if_limited(self, address: str, digest: str) -> None:
        """429 for an address out of failures, unless its key is an issued one this process has found valid (a
        client sharing an address with a flood keeps working; its key is looked up again as usual)."""
        if self._failures is None or (retry := self._failures.retry_after(address)) is None:
            return
        if digest in self._cache:
            return
        self._failures.limited()
        raise TooManyRequests(f"too many failed authentications from this address; retry after {retry} s with a "
                              "valid API key", retry, code="auth_rate_limited")

    def _failed(self, address: str, message: str) -> AuthenticationError:
        if self._failures is not None:
            self._failures.failed(address)
        return AuthenticationError(message)

    async def _open(self, key: str, policy: Policy) -> ApiKey:
        """The caller of an open policy (see the module docstring)."""
        digest = hash_key(key) if key else ""
        anonymous = _policy_key(id_of(digest), OPEN_TENANT)
        if not key or self._store is None:
            return anonymous
        try:
            issued = await self._issued(digest, policy)
        except AdmissionUnavailable:
            return anonymous
        if issued is None:
            return anonymous
        if (why := issued.refusal(self._clock())) is not None:
            raise AuthenticationError(f"API key {issued.id} is {why}")
        return issued if issued.tenant == OPEN_TENANT else replace(issued, tenant=OPEN_TENANT)

    async def _issued(self, digest: str, policy: Policy) -> ApiKey | None:
        assert self._store is not None
        store, now = self._store, self._monotonic()
        seen = self._cache.get(digest)
        if seen is not None and now - seen[0] < self._cache_s:
            return seen[1]
        if seen is None and self._unknown.known_unknown(digest):
            return None
        found = await self._guard.call(lambda: _found(store, digest))
        if found is None:  # Redis unreachable
            last = seen[1] if seen is not None else None
            spec = policy.tenants.get(last.tenant) if last is not None else None
            if last is None or spec is None or spec.on_redis_outage == "fail_closed":
                raise AdmissionUnavailable("API keys cannot be checked right now (the gateway's store is "
                                           "unreachable); retry shortly")
            return last
        if found[0] is None:
            self._cache.pop(digest, None)
            self._unknown.add(digest)
            return None
        self._unknown.forget(digest)
        self._cache.pop(digest, None)  # re-inserted last: the dict's order is the age order
        self._cache[digest] = (now, found[0])
        if len(self._cache) > _MAX_CACHED:
            self._cache.pop(next(iter(self._cache)))
        return found[0]


async def _found(store: KeyStore, digest: str) -> tuple[ApiKey | None]:
    """`store.get` in a tuple, so that "not found" (None inside) differs from "not asked" (`FailOpen`'s None)."""
    return (await store.get(digest),)
