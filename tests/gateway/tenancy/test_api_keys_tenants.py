"""API keys and the policy's tenants: `cascade keys create` and `POST /admin/keys` refuse a tenant the policy does not
serve, saying what to do (or warn, when told to create the key anyway), and a key's own limits and budget apply under
a policy that names no tenants as under one that does (its budget held like a tenant's)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import redis

from gateway.api.app import create_app
from gateway.api.auth import hash_key
from gateway.cli.main import main
from gateway.ledger.keys import LedgerKeys
from gateway.settings import Settings
from policies.loader import default_policy_path
from tests.conftest import SHARED_URL, Upstreams, policy_yaml
from tests.servers import serve, until

pytestmark = pytest.mark.redis
ADMIN = "test-admin-key"
TENANTS = f"""tenants:
  acme: {{api_key_sha256: ['{hash_key("sk-policy")}']}}
"""


def _policies(tmp_path: Path, upstreams: Upstreams) -> tuple[Path, Path]:
    """(a policy naming tenant `acme`, one naming no tenants) on the fake upstreams."""
    _, micro_url, _, flagship_url = upstreams
    named, open_ = tmp_path / "tenants.yaml", tmp_path / "open.yaml"
    named.write_text(policy_yaml(micro_url, flagship_url) + TENANTS)
    open_.write_text(policy_yaml(micro_url, flagship_url))
    return named, open_


def _served(policy: Path, tmp_path: Path, prefix: str) -> Iterator[str]:
    with serve(create_app(Settings(policy_path=policy, scorer="none", start_engines=False, ledger="redis",
                                   redis_prefix=prefix, home=tmp_path / "gw", admin_key=ADMIN,
                                   access_log=None))) as url:
        yield url


@pytest.fixture
def open_gateway(tmp_path: Path, upstreams: Upstreams, prefix: str) -> Iterator[str]:
    """A gateway on a policy that names no tenants (every caller is `default`)."""
    yield from _served(_policies(tmp_path, upstreams)[1], tmp_path, prefix)


@pytest.fixture
def named_gateway(tmp_path: Path, upstreams: Upstreams, prefix: str) -> Iterator[str]:
    """A gateway on a policy that names tenant `acme` only."""
    yield from _served(_policies(tmp_path, upstreams)[0], tmp_path, prefix)


def _create(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["keys", "create", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def _post(url: str, key: str | None) -> httpx.Response:
    body = {"model": "micro", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=60)


def test_keys_create_refuses_a_tenant_the_policy_does_not_serve(
        tmp_path: Path, upstreams: Upstreams, prefix: str, capsys: pytest.CaptureFixture[str]) -> None:
    named, open_ = _policies(tmp_path, upstreams)
    code, out, err = _create(capsys, "--tenant", "ghost", "--policy", str(named), "--prefix", prefix)
    assert code == 2 and out == ""
    assert "tenant 'ghost' is not in the policy" in err and "acme" in err and "--allow-unknown" in err
    code, out, err = _create(capsys, "--tenant", "acme", "--daily-usd", "0.000001", "--policy", str(open_),
                             "--prefix", prefix)
    assert code == 2 and "names no tenants" in err and "tenant 'default'" in err
    assert main(["keys", "list", "--prefix", prefix]) == 0
    assert capsys.readouterr().out == ""  # nothing was created
    code, out, err = _create(capsys, "--tenant", "ghost", "--allow-unknown", "--policy", str(named), "--prefix", prefix)
    assert code == 0 and "warning: created anyway: tenant 'ghost' is not in the policy" in err and "tenant=ghost" in out
    assert "reload first" not in err  # the fix is for a key not yet made; this one is
    code, _, err = _create(capsys, "--tenant", "default", "--policy", str(open_), "--prefix", prefix)
    assert code == 0 and err == ""
    code, _, err = _create(capsys, "--tenant", "acme", "--policy", str(tmp_path / "missing.yaml"), "--prefix", prefix)
    assert code == 2 and "cannot read the file" in err and "--policy" in err


def test_keys_create_without_policy_says_it_checked_the_demo_policy(
        prefix: str, capsys: pytest.CaptureFixture[str]) -> None:
    demo = str(default_policy_path())
    code, out, err = _create(capsys, "--tenant", "acme", "--daily-usd", "0.000001", "--prefix", prefix)
    assert code == 2 and out == "" and "--allow-unknown" in err
    assert f"no --policy given, so the tenant was checked against the demo policy {demo}" in err
    assert "pass --policy with the file your gateways serve" in err
    code, out, err = _create(capsys, "--tenant", "default", "--prefix", prefix)
    assert code == 0 and out.splitlines()[-1].startswith("sk-cascade-")
    assert err.startswith("cascade keys: note: no --policy given") and len(err.splitlines()) == 1


def test_a_key_created_anyway_for_a_tenant_the_policy_does_not_name_is_refused_saying_what_to_do(
        named_gateway: str, tmp_path: Path, prefix: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _create(capsys, "--tenant", "ghost", "--allow-unknown", "--daily-usd", "5",
                           "--policy", str(tmp_path / "tenants.yaml"), "--prefix", prefix)
    ghost = out.splitlines()[-1]
    assert code == 0 and ghost.startswith("sk-cascade-")
    refused = _post(named_gateway, ghost)
    error = refused.json()["error"]
    assert refused.status_code == 401 and error["type"] == "authentication_error"
    assert f"API key {hash_key(ghost)[:12]} belongs to tenant 'ghost'" in error["message"]
    assert "add 'ghost' under `tenants:` and reload the policy" in error["message"]
    assert _post(named_gateway, "sk-policy").status_code == 200  # the tenants it names are served as before


def test_admin_keys_refuse_a_tenant_the_running_policy_does_not_serve(open_gateway: str) -> None:
    admin = {"authorization": f"Bearer {ADMIN}"}
    acme = {"tenant": "acme", "daily_usd": "0.000001"}
    refused = httpx.post(open_gateway + "/admin/keys", json=acme, headers=admin)
    error = refused.json()["error"]
    assert refused.status_code == 400 and error["param"] == "tenant"
    assert "names no tenants" in error["message"] and "allow_unknown" in error["message"]
    assert httpx.get(open_gateway + "/admin/keys", headers=admin).json() == {"data": []}  # nothing was created
    made = httpx.post(open_gateway + "/admin/keys", json={**acme, "allow_unknown": True}, headers=admin)
    assert made.status_code == 201 and "names no tenants" in made.json()["warning"]
    assert made.json()["warning"].startswith("created anyway") and "Create it with" not in made.json()["warning"]
    plain = httpx.post(open_gateway + "/admin/keys", json={"tenant": "default"}, headers=admin)
    assert plain.status_code == 201 and "warning" not in plain.json()
    # the key made anyway is served as `default`, and its own budget holds: the first request's worst case is over it
    answers = [_post(open_gateway, made.json()["key"]) for _ in range(2)]
    assert [a.status_code for a in answers] == [200, 429]
    message = answers[1].json()["error"]["message"]
    assert f"API key '{made.json()['id']}' of tenant 'default'" in message and "daily budget" in message


def test_a_keys_budget_and_rate_limit_apply_under_a_policy_without_tenants(
        open_gateway: str, tmp_path: Path, prefix: str, capsys: pytest.CaptureFixture[str]) -> None:
    policy = str(tmp_path / "open.yaml")
    _, out, _ = _create(capsys, "--tenant", "default", "--daily-usd", "0.000001", "--policy", policy,
                        "--prefix", prefix)
    budgeted = out.splitlines()[-1]
    with ThreadPoolExecutor(4) as pool:  # at once: no record has landed when the others ask
        codes = sorted(r.status_code for r in pool.map(lambda _: _post(open_gateway, budgeted), range(4)))
    assert codes == [200, 429, 429, 429]  # the first request's worst case holds the whole budget
    message = _post(open_gateway, budgeted).json()["error"]["message"]
    assert f"API key '{hash_key(budgeted)[:12]}' of tenant 'default'" in message and "daily budget" in message
    holds = LedgerKeys(prefix).key_holds("default", hash_key(budgeted)[:12])
    client = redis.Redis.from_url(SHARED_URL)
    until(lambda: client.hget(holds, " sum") == b"0")  # the ledger's record of the served request released its hold
    client.close()
    _, out, _ = _create(capsys, "--tenant", "default", "--rpm", "1", "--policy", policy, "--prefix", prefix)
    limited = out.splitlines()[-1]
    assert [_post(open_gateway, limited).status_code for _ in range(2)] == [200, 429]
    assert main(["keys", "revoke", limited, "--prefix", prefix]) == 0
    deadline = time.monotonic() + 1.0  # issued keys are looked up again at most every 0.5 s
    while (code := _post(open_gateway, limited).status_code) != 401 and time.monotonic() < deadline:
        pass
    assert code == 401  # a revoked key is told so, not served as anyone
    assert [_post(open_gateway, k).status_code for k in (None, "sk-anything")] == [200, 200]  # the policy is open
