"""API keys ops issue at run time: `cascade keys create` gives a key two gateways on one Redis serve at once, and
`cascade keys revoke` makes both refuse it within a second; per-key limits apply inside the tenant's and name the
key; cost records carry the key id; `/admin/keys` does the same over HTTP; a Redis outage leaves policy keys
working and issued keys to their tenant's `on_redis_outage`."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import orjson
import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from gateway.api.auth import KeyAuth, hash_key
from gateway.cli.main import main
from gateway.errors import AdmissionUnavailable, AuthenticationError
from gateway.tenancy.api_keys import ApiKey
from loadtest.scenarios.chaos_figures import ledger_records
from policies.loader import load_policy
from tests.conftest import SHARED_URL, GatewayFactory, Upstreams, policy_yaml
from tests.harness import Gateway

pytestmark = pytest.mark.redis
ADMIN = "test-admin-key"
TENANTS = f"""tenants:
  acme: {{api_key_sha256: ['{hash_key("sk-policy")}'], rate_limits: {{requests_per_minute: 50}}}}
  strict: {{api_key_sha256: ['{hash_key("sk-strict")}'], on_redis_outage: fail_closed}}
"""


@pytest.fixture
def gateways(make_gateway: GatewayFactory, tmp_path: Path, fake_upstreams: Upstreams, prefix: str) -> list[Gateway]:
    """Two gateways on one Redis prefix (as two processes of a deployment would be), in-process."""
    _, micro_url, _, flagship_url = fake_upstreams
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_yaml(micro_url, flagship_url) + TENANTS)
    return [make_gateway(policy, scorer="none", ledger="redis", redis_prefix=prefix, admin_key=ADMIN,
                         access_log=None) for _ in range(2)]


def _post(gateway: Gateway, key: str) -> httpx.Response:
    body = {"model": "micro", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}
    return gateway.client.post("/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"},
                               timeout=60)


def test_created_key_is_served_at_once_and_refused_within_a_second_of_revoke(
        gateways: list[Gateway], prefix: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    policy = str(tmp_path / "policy.yaml")
    assert main(["keys", "create", "--tenant", "acme", "--name", "ci", "--rpm", "2", "--prefix", prefix,
                 "--policy", policy]) == 0
    out = capsys.readouterr().out.splitlines()
    key = out[-1]
    key_id = hash_key(key)[:12]
    assert key.startswith("sk-cascade-") and key_id in out[0] and "rpm=2" in out[0]
    assert [_post(gateway, key).status_code for gateway in gateways] == [200, 200]  # served at once, by both
    limited = _post(gateways[0], key)  # its own 2 a minute, inside the tenant's 50
    assert limited.status_code == 429 and f"API key '{key_id}' of tenant 'acme'" in limited.json()["error"]["message"]
    assert _post(gateways[1], "sk-policy").status_code == 200  # the tenant's own limit is not spent
    assert main(["keys", "list", "--tenant", "acme", "--prefix", prefix]) == 0
    listed = capsys.readouterr().out
    assert key_id in listed and "state=active" in listed and key not in listed
    assert main(["keys", "revoke", key_id, "--prefix", prefix]) == 0
    revoked_at = time.monotonic()
    codes = {i: 0 for i in range(len(gateways))}
    while time.monotonic() - revoked_at < 1.0 and set(codes.values()) != {401}:
        codes = {i: _post(gateway, key).status_code for i, gateway in enumerate(gateways)}
    assert set(codes.values()) == {401} and time.monotonic() - revoked_at < 1.0, codes
    assert "is revoked" in _post(gateways[0], key).json()["error"]["message"]
    assert main(["keys", "revoke", "nosuchkeyid0", "--prefix", prefix]) == 1
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        records = [r for r in ledger_records(SHARED_URL, prefix) if r["tenant"] == "acme"]
        if len(records) == 3:
            break
        time.sleep(0.1)
    assert sorted(r["key_id"] for r in records) == sorted([key_id] * 2 + [hash_key("sk-policy")[:12]])


def test_admin_keys_create_list_and_revoke(gateways: list[Gateway]) -> None:
    admin = {"authorization": f"Bearer {ADMIN}"}
    client, url = gateways[0].client, "/admin/keys"
    assert client.post(url, json={"tenant": "acme"}).status_code == 401
    assert client.post(url, json={"tenant": "nobody"}, headers=admin).status_code == 400
    made = client.post(url, json={"tenant": "acme", "name": "etl", "expires_at": time.time() + 3600}, headers=admin)
    assert made.status_code == 201
    key, key_id = made.json()["key"], made.json()["id"]
    assert _post(gateways[1], key).status_code == 200
    listed = client.get(url + "?tenant=acme", headers=admin).json()["data"]
    assert [k["id"] for k in listed] == [key_id] and "key" not in listed[0]
    assert client.delete(f"{url}/{key_id}", headers=admin).json()["revoked_at"] is not None
    assert client.delete(f"{url}/nosuchkeyid0", headers=admin).status_code == 404
    expired = client.post(url, json={"tenant": "acme", "expires_at": time.time() - 1}, headers=admin).json()["key"]
    assert _post(gateways[0], expired).status_code == 401 and _post(gateways[0], "sk-unknown").status_code == 401


class FlakyStore:
    """A key store that answers until `down` is set, then fails like an unreachable Redis."""

    def __init__(self, keys: dict[str, ApiKey]) -> None:
        self.keys = keys
        self.down = False

    async def get(self, digest: str) -> ApiKey | None:
        if self.down:
            raise RedisConnectionError("down")
        return self.keys.get(digest)


async def test_redis_outage_policy_keys_work_issued_keys_follow_the_tenant(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(policy_yaml("http://127.0.0.1:1", "http://127.0.0.1:2") + TENANTS)
    policy = load_policy(path).policy
    store = FlakyStore({hash_key("sk-open"): ApiKey(id="a", tenant="acme"),
                        hash_key("sk-closed"): ApiKey(id="b", tenant="strict")})
    clock = [0.0]
    auth = KeyAuth(store, cache_s=0.5, monotonic=lambda: clock[0])  # type: ignore[arg-type]
    for key in ("sk-open", "sk-closed"):
        await auth.identify(policy, f"Bearer {key}")
    store.down, clock[0] = True, 10.0
    assert (await auth.identify(policy, "Bearer sk-policy")).tenant == "acme"  # the policy's: no Redis needed
    assert (await auth.identify(policy, "Bearer sk-open")).tenant == "acme"  # fail_open: served as last seen
    with pytest.raises(AdmissionUnavailable):
        await auth.identify(policy, "Bearer sk-closed")  # fail_closed
    with pytest.raises(AdmissionUnavailable):
        await auth.identify(policy, "Bearer sk-never-seen")  # cannot tell who it is
    store.down, clock[0] = False, 20.0  # back, and past the interval in which an outage is not asked again
    with pytest.raises(AuthenticationError):
        await auth.identify(policy, "Bearer sk-never-seen")


def test_a_keys_daily_budget_and_its_spend_in_the_report(gateways: list[Gateway], prefix: str,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    admin = {"authorization": f"Bearer {ADMIN}"}
    made = gateways[0].client.post("/admin/keys", json={"tenant": "acme", "daily_usd": "0.000001"},
                      headers=admin).json()
    key, key_id = made["key"], made["id"]
    deadline = time.monotonic() + 10
    with ThreadPoolExecutor(4) as pool:  # at once, on both gateways: none has a record to see yet
        served = sum(r.status_code == 200 for r in pool.map(lambda i: _post(gateways[i % 2], key), range(4)))
    reply = _post(gateways[0], key)
    message = reply.json()["error"]["message"]
    assert reply.status_code == 429 and f"API key '{key_id}' of tenant 'acme'" in message and "daily budget" in message
    # held like a tenant's budget: the first request's worst case holds the whole budget until its record lands
    assert served == 1 and _post(gateways[0], "sk-policy").status_code == 200  # the tenant itself goes on
    while len(mine := [r for r in ledger_records(SHARED_URL, prefix) if r["key_id"] == key_id]) < served:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert main(["costs", "report", "--by", "key", "--format", "json", "--prefix", prefix]) == 0
    rows = {row["key_id"]: row for row in orjson.loads(capsys.readouterr().out)["rows"]}
    assert rows[key_id]["tenant"] == "acme" and rows[key_id]["requests"] == served
    assert rows[key_id]["cost_micro_usd"] == sum(int(r["cost_micro_usd"]) for r in mine) > 0
    assert rows[hash_key("sk-policy")[:12]]["requests"] == 1
