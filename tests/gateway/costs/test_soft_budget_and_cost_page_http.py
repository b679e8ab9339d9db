"""Through the gateway in-process (`tests.harness`) on the real Redis ledger: the soft budget limit shows in the logs
and the metrics, and the cost page served at GET /admin/costs renders in real headless Chromium (charts
checked by their pixels, not only by the markup)."""

from __future__ import annotations

import logging
import shutil
import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from PIL import Image

from gateway.api.auth import hash_key
from tests.conftest import GatewayFactory, Upstreams, policy_yaml
from tests.harness import Gateway

pytestmark = pytest.mark.redis
ADMIN = "audit-admin-key"
# soft at 1% of 0.01 USD (100 micro-USD): one flagship call (~132 micro-USD) crosses it, the limit is far
TENANTS = f"""tenants:
  careful: {{api_key_sha256: ['{hash_key("sk-careful")}'], budget: {{daily_usd: "0.01", soft_limit_pct: 1}}}}
  acme: {{api_key_sha256: ['{hash_key("sk-acme")}']}}
  globex: {{api_key_sha256: ['{hash_key("sk-globex")}']}}
"""
FLAGSHIP_RGB, MICRO_RGB = (0x4C, 0x78, 0xA8), (0xF5, 0x85, 0x18)  # the first two colours of the palette


def chromium() -> str:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium not installed (Debian package `chromium`)")
    return browser


def render_in_chromium(page: Path, shot: Path, width: int = 1200, height: int = 2000) -> str:
    """Screenshot `page` with headless Chromium into `shot`; return the DOM Chromium built from it."""
    args = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            f"--window-size={width},{height}"]
    subprocess.run([*args, f"--screenshot={shot}", page.as_uri()], check=True, timeout=120, capture_output=True)
    dom = subprocess.run([*args, "--dump-dom", page.as_uri()], check=True, timeout=120, capture_output=True)
    return dom.stdout.decode()


def pixels_of(shot: Path, rgb: tuple[int, int, int]) -> int:
    """How many pixels of the screenshot have exactly this colour."""
    with Image.open(shot) as image:
        colors = image.convert("RGB").getcolors(maxcolors=1 << 24) or []
    return sum(n for n, color in colors if color == rgb)


@pytest.fixture
def gateway(make_gateway: GatewayFactory, tmp_path: Path, fake_upstreams: Upstreams, prefix: str) -> Gateway:
    _, micro_url, _, flagship_url = fake_upstreams
    path = tmp_path / "policy.yaml"
    path.write_text(policy_yaml(micro_url, flagship_url) + TENANTS)
    return make_gateway(path, scorer="none", ledger="redis", redis_prefix=prefix, admin_key=ADMIN,
                        policy_watch_interval_s=0)


def _post(gateway: Gateway, key: str, model: str, tokens: int) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": tokens,
            "metadata": {"fake_tokens": str(tokens)}}
    r = gateway.client.post("/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"})
    assert r.status_code == 200, r.text
    return r


def _soft_events(metrics: str, tenant: str) -> float:
    """The `cascade_budget_events_total` sample of `tenant` in state "soft" (labels in any order)."""
    for line in metrics.splitlines():
        name, _, rest = line.partition("{")
        labels, _, value = rest.partition("} ")
        if name == "cascade_budget_events_total" and set(labels.split(",")) == {f'tenant="{tenant}"', 'state="soft"'}:
            return float(value)
    return 0.0


def test_soft_limit_warns_in_logs_and_metrics(gateway: Gateway, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="gateway.tenancy.budgets"):
        _post(gateway, "sk-careful", "flagship", 8)  # spent 0 before it: ok; ~132 micro-USD after
        assert _soft_events(gateway.client.get("/metrics").text, "careful") == 0
        deadline = time.monotonic() + 10  # the guard caches spend for 1 s
        while _soft_events(gateway.client.get("/metrics").text, "careful") == 0:
            assert time.monotonic() < deadline, "no soft-limit metric"
            time.sleep(0.2)
            _post(gateway, "sk-careful", "flagship", 8)  # still served: soft is a warning, not a limit
    warnings = [r.getMessage() for r in caplog.records if r.name == "gateway.tenancy.budgets"]
    assert len(warnings) == 1, warnings  # once per tenant and period, however many requests follow
    assert "'careful' passed the soft limit of its day budget" in warnings[0] and "of 0.010000 USD" in warnings[0]


def test_cost_page_served_at_admin_costs_renders_in_chromium(gateway: Gateway, tmp_path: Path) -> None:
    chromium()
    for key in ("sk-acme", "sk-globex"):
        for _ in range(3):
            _post(gateway, key, "micro", 1000)  # ~200 micro-USD each: the micro part of the bar is visible
            _post(gateway, key, "flagship", 8)
    today = datetime.now(UTC).date()
    query = {"from": str(today - timedelta(days=1)), "to": str(today + timedelta(days=1)), "by": "pool"}
    auth = {"authorization": f"Bearer {ADMIN}"}
    deadline = time.monotonic() + 10
    while True:  # records are written after the answers
        r = gateway.client.get("/admin/costs", params=query, headers=auth)
        if (r.status_code == 200 and "<b>12</b>" in r.text) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html"), r.text
    assert "<b>12</b>" in r.text, "the requests card counts the 12 requests"
    page, shot = tmp_path / "costs.html", tmp_path / "costs.png"
    page.write_text(r.text)
    dom = render_in_chromium(page, shot)
    assert dom.count("<svg") == 3 and "Spend per day, stacked by pool" in dom and "Top tenants by spend" in dom
    assert ">acme<" in dom and ">globex<" in dom, "top tenants chart names both tenants"
    with Image.open(shot) as image:
        assert image.size == (1200, 2000)
    # the stacked day bar has a micro part and a flagship part, each a solid block of its colour
    assert pixels_of(shot, MICRO_RGB) > 2_000
    assert pixels_of(shot, FLAGSHIP_RGB) > 2_000


def test_cost_page_states_the_running_policys_prices(gateway: Gateway, tmp_path: Path) -> None:
    _post(gateway, "sk-acme", "micro", 4)
    today = datetime.now(UTC).date()
    query = {"from": str(today - timedelta(days=1)), "to": str(today + timedelta(days=1)), "by": "pool"}
    deadline = time.monotonic() + 10
    while True:  # the record is written after the answer
        r = gateway.client.get("/admin/costs", params=query, headers={"authorization": f"Bearer {ADMIN}"})
        if "<b>1</b>" in r.text or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert r.status_code == 200 and "<h2>Prices</h2>" in r.text, r.text
    assert f"(policy {tmp_path / 'policy.yaml'};" in r.text
    assert "<p>micro: $0.20/M prompt tokens, $0.20/M completion tokens (per-token price)</p>" in r.text
    assert "<p>flagship: $3.00/M prompt tokens, $15.00/M completion tokens (per-token price) [flagship:" in r.text
