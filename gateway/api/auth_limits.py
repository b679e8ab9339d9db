"""What failed authentications may cost: a token bucket per client address, and a bounded cache of unknown keys.

A flood of distinct invalid bearer keys would otherwise cost a Redis round trip and a cache entry each, and (with
the cache cleared when full) push the valid keys out too. Two bounds, both in-process and used from one loop:
- `FailedAuths`: every failed authentication (missing, unknown, revoked or expired key) takes a token from its
  client address's bucket (`burst` tokens, refilled at `per_minute`); an address with none left is answered 429
  with `Retry-After` (the seconds until its next token) before its key is looked up, so it costs no Redis call and
  no cache entry. Valid keys from that address still authenticate (a policy key costs no I/O; an issued key this
  process has found valid is looked up as usual: a client behind the flooder's NAT keeps working). IPv6 addresses
  count per /64 (one host holds a whole /64). At most `max_addresses` buckets are kept, the least recently failed
  dropped first (a dropped address starts again with a full bucket).
- `UnknownKeys`: the digests recently looked up and not found, least recently used dropped first at `max_entries`;
  valid keys live in a cache of their own (`gateway.api.auth.KeyAuth`) that no invalid key can evict.
`AuthSeries` counts both in /metrics.
"""

from __future__ import annotations

import ipaddress
import math
import time
from collections import OrderedDict
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge

__all__ = ["AuthSeries", "FailedAuths", "UnknownKeys", "address_of"]


def address_of(client: str | None) -> str:
    """The bucket of a client address: the address itself, or its /64 for IPv6; "" when unknown (one bucket)."""
    if not client:
        return ""
    try:
        ip = ipaddress.ip_address(client)
    except ValueError:
        return client
    if ip.version == 6:
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


class AuthSeries:
    """`cascade_auth_failures_total{outcome}` (refused: 401; limited: 429 before any lookup),
    `cascade_auth_unknown_keys` (entries in the unknown-key cache) and `cascade_auth_unknown_keys_evicted_total`."""

    def __init__(self, registry: CollectorRegistry | None) -> None:
        self.failures = Counter("cascade_auth_failures", "failed authentications: refused (401) or limited (429, "
                                "the client address failed too often: not looked up)", ["outcome"], registry=registry)
        self.unknown = Gauge("cascade_auth_unknown_keys", "unknown bearer keys remembered (not looked up again for "
                             "a moment); valid keys are cached apart", registry=registry, multiprocess_mode="livesum")
        self.evicted = Counter("cascade_auth_unknown_keys_evicted", "unknown keys dropped from their cache when it "
                               "was full (least recently used first)", registry=registry)


class FailedAuths:
    """Per client address, a token bucket of failed authentications (see the module docstring). `monotonic`
    (seconds) is for tests."""

    def __init__(self, burst: int, per_minute: float, series: AuthSeries | None = None, max_addresses: int = 100_000,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        if burst < 1:
            raise ValueError(f"auth_failure_burst: must be >= 1, got {burst} (0 would refuse every client)")
        if not per_minute > 0:
            raise ValueError(f"auth_failures_per_minute: must be > 0, got {per_minute}")
        self._burst, self._rate = float(burst), per_minute / 60.0
        self._series = series
        self._max = max_addresses
        self._monotonic = monotonic
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # address -> (tokens, at)

    def retry_after(self, address: str) -> int | None:
        """Seconds until `address` may fail again (its 429's `Retry-After`), or None when it may now."""
        tokens = self._tokens(address)
        return None if tokens >= 1 else max(1, math.ceil((1 - tokens) / self._rate))

    def failed(self, address: str) -> None:
        """Take a token from `address`'s bucket (a failed authentication)."""
        self._buckets[address] = (max(0.0, self._tokens(address) - 1), self._monotonic())
        self._buckets.move_to_end(address)
        while len(self._buckets) > self._max:
            self._buckets.popitem(last=False)
        if self._series is not None:
            self._series.failures.labels("refused").inc()

    def limited(self) -> None:
        """Count a request refused by `retry_after`."""
        if self._series is not None:
            self._series.failures.labels("limited").inc()

    def _tokens(self, address: str) -> float:
        seen = self._buckets.get(address)
        if seen is None:
            return self._burst
        tokens, at = seen
        return min(self._burst, tokens + (self._monotonic() - at) * self._rate)


class UnknownKeys:
    """Digests looked up and not found, each for `ttl_s`, at most `max_entries` (least recently used dropped)."""

    def __init__(self, ttl_s: float, max_entries: int = 10_000, series: AuthSeries | None = None,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._ttl = ttl_s
        self._max = max_entries
        self._series = series
        self._monotonic = monotonic
        self._seen: OrderedDict[str, float] = OrderedDict()  # digest -> looked up at

    def __len__(self) -> int:
        return len(self._seen)

    def known_unknown(self, digest: str) -> bool:
        """Whether `digest` was looked up and not found less than `ttl_s` ago."""
        at = self._seen.get(digest)
        if at is None or self._monotonic() - at >= self._ttl:
            return False
        self._seen.move_to_end(digest)
        return True

    def add(self, digest: str) -> None:
        self._seen[digest] = self._monotonic()
        self._seen.move_to_end(digest)
        evicted = 0
        while len(self._seen) > self._max:
            self._seen.popitem(last=False)
            evicted += 1
        if self._series is not None:
            if evicted:
                self._series.evicted.inc(evicted)
            self._series.unknown.set(len(self._seen))

    def forget(self, digest: str) -> None:
        """`digest` was found after all (a key created since)."""
        self._seen.pop(digest, None)
