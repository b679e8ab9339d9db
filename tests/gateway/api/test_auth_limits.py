"""Failed authentications cost bounded work: a client address that keeps failing gets 429 with Retry-After before
its keys are looked up, unknown keys are remembered in a bounded cache of their own, and no flood of them evicts
a valid key. `KeyAuth` over a fake key store that counts its lookups; one gateway over HTTP for the 429 and the
metrics."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import httpx
import pytest

from gateway.api.app import create_app
from gateway.api.auth import KeyAuth, hash_key
from gateway.api.auth_limits import FailedAuths, address_of
from gateway.errors import AuthenticationError, TooManyRequests
from gateway.settings import OPTIONS, Settings, _env_default
from gateway.tenancy.api_keys import ApiKey
from policies.loader import parse_policy
from tests.conftest import policy_yaml
from tests.servers import serve

POLICY = parse_policy(policy_yaml("http://127.0.0.1:1", "http://127.0.0.1:2")
                      + f"tenants:\n  acme: {{api_key_sha256: ['{hash_key('sk-policy')}']}}\n").policy


class CountingStore:
    """Issued keys by digest; counts every lookup (a Redis round trip in the real store)."""

    def __init__(self, keys: dict[str, ApiKey]) -> None:
        self.keys = keys
        self.lookups: Counter[str] = Counter()

    async def get(self, digest: str) -> ApiKey | None:
        self.lookups[digest] += 1
        return self.keys.get(digest)


def _auth(failures: FailedAuths | None = None) -> tuple[KeyAuth, CountingStore, list[float]]:
    store = CountingStore({hash_key("sk-issued"): ApiKey(id="a1", tenant="acme")})
    clock = [0.0]
    auth = KeyAuth(store, cache_s=0.5, failures=failures, monotonic=lambda: clock[0])  # type: ignore[arg-type]
    return auth, store, clock


async def test_a_flood_of_unknown_keys_evicts_no_valid_key_and_stays_bounded() -> None:
    auth, store, _ = _auth()
    assert (await auth.identify(POLICY, "Bearer sk-issued")).tenant == "acme"
    for i in range(100_001):  # more distinct invalid keys than the old cache held before it cleared itself
        with pytest.raises(AuthenticationError):
            await auth.identify(POLICY, f"Bearer sk-bad-{i}")
    assert (await auth.identify(POLICY, "Bearer sk-issued")).tenant == "acme"
    assert store.lookups[hash_key("sk-issued")] == 1  # still cached: not looked up again
    assert len(auth._unknown) == 10_000  # the unknown keys: the most recent, no more


async def test_an_unknown_key_is_remembered_for_the_cache_interval() -> None:
    auth, store, clock = _auth()
    for _ in range(3):
        with pytest.raises(AuthenticationError):
            await auth.identify(POLICY, "Bearer sk-bad")
    assert store.lookups[hash_key("sk-bad")] == 1
    clock[0] = 1.0
    store.keys[hash_key("sk-bad")] = ApiKey(id="b2", tenant="acme")  # created since
    assert (await auth.identify(POLICY, "Bearer sk-bad")).id == "b2"


async def test_an_address_that_keeps_failing_gets_429_before_any_lookup() -> None:
    failures = FailedAuths(burst=3, per_minute=60)
    auth, store, clock = _auth(failures)
    failures._monotonic = lambda: clock[0]
    await auth.identify(POLICY, "Bearer sk-issued", "10.0.0.1")  # seen valid: cached
    for i in range(3):
        with pytest.raises(AuthenticationError):
            await auth.identify(POLICY, f"Bearer sk-bad-{i}", "10.0.0.1")
    looked_up = sum(store.lookups.values())
    for i in range(5):
        with pytest.raises(TooManyRequests) as caught:
            await auth.identify(POLICY, f"Bearer sk-worse-{i}", "10.0.0.1")
        assert caught.value.headers() == {"retry-after": "1"} and caught.value.code == "auth_rate_limited"
    with pytest.raises(TooManyRequests):
        await auth.identify(POLICY, None, "10.0.0.1")  # no key at all: limited alike
    assert sum(store.lookups.values()) == looked_up  # nothing asked of the store while limited
    assert (await auth.identify(POLICY, "Bearer sk-policy", "10.0.0.1")).tenant == "acme"  # valid keys still work
    assert (await auth.identify(POLICY, "Bearer sk-issued", "10.0.0.1")).tenant == "acme"
    clock[0] = 0.9  # its cache entry is stale: looked up again, not refused (the flooder's NAT neighbour)
    assert (await auth.identify(POLICY, "Bearer sk-issued", "10.0.0.1")).tenant == "acme"
    assert store.lookups[hash_key("sk-issued")] == 2
    clock[0] = 0.0
    with pytest.raises(AuthenticationError):
        await auth.identify(POLICY, "Bearer sk-bad-x", "10.0.0.2")  # another address: its own allowance
    clock[0] = 1.0  # one token back (60 a minute)
    with pytest.raises(AuthenticationError):
        await auth.identify(POLICY, "Bearer sk-bad-y", "10.0.0.1")
    with pytest.raises(TooManyRequests):
        await auth.identify(POLICY, "Bearer sk-bad-z", "10.0.0.1")


def test_ipv6_addresses_count_per_64_and_the_address_table_is_bounded() -> None:
    assert address_of("2001:db8::1") == address_of("2001:db8::ffff:1") == "2001:db8::/64"
    assert address_of("192.0.2.7") == "192.0.2.7" and address_of(None) == ""
    failures = FailedAuths(burst=1, per_minute=1, max_addresses=100)
    for i in range(1_000):
        failures.failed(f"198.51.{i // 256}.{i % 256}")
    assert len(failures._buckets) == 100 and failures.retry_after("198.51.3.231") == 60


def test_an_auth_burst_of_zero_is_refused_at_load(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="auth_failure_burst: must be >= 1"):
        FailedAuths(burst=0, per_minute=30)
    option = next(o for o in OPTIONS if o.name == "auth_failure_burst")
    with pytest.raises(SystemExit, match="CASCADE_AUTH_FAILURE_BURST='0': must be >= 1"):
        _env_default(option, {"CASCADE_AUTH_FAILURE_BURST": "0"})
    with pytest.raises(ValueError, match="auth_failure_burst: must be >= 1, got 0"):
        Settings(policy_path=tmp_path / "policy.yaml", auth_failure_burst=0)


def test_a_client_flooding_bad_keys_gets_429_with_retry_after_never_a_5xx(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(policy_yaml("http://127.0.0.1:1", "http://127.0.0.1:2")
                    + f"tenants:\n  acme: {{api_key_sha256: ['{hash_key('sk-policy')}']}}\n")
    settings = Settings(policy_path=path, scorer="none", start_engines=False, ledger="memory", home=tmp_path,
                        auth_failure_burst=5, auth_failures_per_minute=6)
    with serve(create_app(settings)) as url:
        replies = [httpx.post(url + "/v1/chat/completions", json={"model": "auto", "messages": []},
                              headers={"authorization": f"Bearer sk-flood-{i}"}) for i in range(20)]
        assert [r.status_code for r in replies] == [401] * 5 + [429] * 15
        limited = replies[-1]
        assert 1 <= int(limited.headers["retry-after"]) <= 10
        assert limited.json()["error"]["code"] == "auth_rate_limited"
        metrics = httpx.get(url + "/metrics").text
    assert 'cascade_auth_failures_total{outcome="refused"} 5.0' in metrics
    assert 'cascade_auth_failures_total{outcome="limited"} 15.0' in metrics
    assert "cascade_auth_unknown_keys " in metrics and "cascade_auth_unknown_keys_evicted_total 0.0" in metrics
