"""Admin endpoints with the real Redis ledger: the HTML cost report and the policy reload."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import httpx
import pytest

from gateway.api.app import create_app
from gateway.settings import Settings
from tests.conftest import GatewayFactory
from tests.harness import Gateway
from tests.servers import serve, until

pytestmark = pytest.mark.redis
ADMIN = "test-admin-key"


@pytest.fixture
def gateway(make_gateway: GatewayFactory, fake_policy_file: Path, prefix: str) -> Gateway:
    return make_gateway(fake_policy_file, ledger="redis", redis_prefix=prefix, admin_key=ADMIN)


def test_cost_page_needs_the_admin_key_and_shows_the_traffic(gateway: Gateway) -> None:
    for _ in range(3):
        r = gateway.client.post("/v1/chat/completions",
                       json={"model": "flagship", "messages": [{"role": "user", "content": "hello there"}]})
        assert r.status_code == 200
    assert gateway.client.get("/admin/costs").status_code == 401
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        page = gateway.client.get("/admin/costs?by=pool", headers={"authorization": f"Bearer {ADMIN}"})
        if "flagship" in page.text:
            break
        time.sleep(0.1)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "<svg" in page.text and "flagship" in page.text
    bad = gateway.client.get("/admin/costs?from=yesterday", headers={"authorization": f"Bearer {ADMIN}"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "from"


def test_cost_page_groups_by_endpoint_as_the_cli_report_does(gateway: Gateway) -> None:
    r = gateway.client.post("/v1/chat/completions",
                   json={"model": "flagship", "messages": [{"role": "user", "content": "hello there"}]})
    assert r.status_code == 200
    auth = {"authorization": f"Bearer {ADMIN}"}
    deadline, page = time.monotonic() + 5, gateway.client.get("/admin/costs?by=endpoint", headers=auth)
    while page.status_code == 200 and ">chat<" not in page.text and time.monotonic() < deadline:
        time.sleep(0.1)
        page = gateway.client.get("/admin/costs?by=endpoint", headers=auth)
    assert page.status_code == 200, page.text
    assert "By endpoint" in page.text and ">chat<" in page.text
    bad = gateway.client.get("/admin/costs?by=colour", headers=auth)
    assert bad.status_code == 400 and "by=tenant|pool|model|day|endpoint" in bad.json()["error"]["message"]


def test_reload_rejects_a_broken_file_and_keeps_serving(gateway: Gateway, fake_policy_file: Path) -> None:
    auth = {"authorization": f"Bearer {ADMIN}"}
    before = gateway.client.get("/readyz").json()["policy_version"]
    good = fake_policy_file.read_text()
    fake_policy_file.write_text(good.replace("threshold: 0.5", "threshold: 7"))
    r = gateway.client.post("/admin/policy/reload", headers=auth)
    assert r.status_code == 422
    assert any("routing.threshold" in p for p in r.json()["error"]["problems"])
    assert gateway.client.get("/readyz").json()["policy_version"] == before
    ok = gateway.client.post("/v1/chat/completions", json={"model": "auto", "messages": [{"role": "user",
                                                                                           "content": "x"}]})
    assert ok.status_code == 200 and ok.headers["x-cascade-policy-version"] == before
    fake_policy_file.write_text(good.replace("threshold: 0.5", "threshold: 0.7"))
    r = gateway.client.post("/admin/policy/reload", headers=auth)
    assert r.status_code == 200 and r.json()["policy_version"] != before
    assert gateway.client.post("/admin/policy/reload").status_code == 401


def test_file_change_adds_a_pool_live_and_a_broken_edit_is_ignored(policy_file: Path, tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    settings = Settings(policy_path=policy_file, scorer="length", start_engines=False, ledger="memory",
                        home=tmp_path, policy_watch_interval_s=0.2)
    good = policy_file.read_text()
    flagship_url = good.split('urls: ["')[2].split('"')[0]
    with serve(create_app(settings)) as url, caplog.at_level(logging.ERROR, logger="cascade.policy"):
        before = httpx.get(url + "/readyz").json()["policy_version"]
        policy_file.write_text(good + "\n# oops\nrouting: [\n")
        until(lambda: any("was rejected" in r.getMessage() for r in caplog.records), timeout=10)  # the watcher saw it
        assert httpx.get(url + "/readyz").json()["policy_version"] == before
        extra = f"""
  spare:
    type: remote
    urls: ["{flagship_url}"]
    model: flagship-model
    price: {{input_per_mtok: "1.00", output_per_mtok: "2.00"}}
"""
        policy_file.write_text(good.replace("pools:\n", "pools:" + extra, 1))
        deadline = time.monotonic() + 10
        while "spare" not in httpx.get(url + "/readyz").json()["pools"] and time.monotonic() < deadline:
            time.sleep(0.1)
        r = httpx.post(url + "/v1/chat/completions", json={"model": "spare", "messages": [{"role": "user",
                                                                                            "content": "x"}]})
        assert r.status_code == 200 and r.headers["x-cascade-pool"] == "spare"
        assert r.headers["x-cascade-policy-version"] != before


async def test_reloads_under_load_lose_no_request(policy_file: Path, tmp_path: Path) -> None:
    import asyncio

    settings = Settings(policy_path=policy_file, scorer="length", start_engines=False, ledger="memory",
                        admin_key=ADMIN, home=tmp_path, policy_watch_interval_s=0.05)
    good = policy_file.read_text()
    auth = {"authorization": f"Bearer {ADMIN}"}
    with serve(create_app(settings)) as url:
        async with httpx.AsyncClient(timeout=30) as client:
            async def request(i: int) -> int:
                body = {"model": "auto", "stream": i % 2 == 0,
                        "messages": [{"role": "user", "content": "w " * (i % 300)}]}
                return (await client.post(url + "/v1/chat/completions", json=body)).status_code

            async def churn() -> list[int]:
                codes = []
                for i in range(20):
                    text = good + "\nrouting: [broken\n" if i % 2 == 0 else good.replace("0.5", f"0.{i + 10}")
                    await asyncio.to_thread(policy_file.write_text, text)
                    codes.append((await client.post(url + "/admin/policy/reload", headers=auth)).status_code)
                    await asyncio.sleep(0.02)
                return codes

            results, codes = await asyncio.gather(asyncio.gather(*(request(i) for i in range(300))), churn())
        assert set(results) == {200}, f"lost requests: {[c for c in results if c != 200]}"
        assert set(codes) == {200, 422}
