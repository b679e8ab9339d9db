"""Two gateway processes sharing one Redis enforce one rate limit and one budget, and their ledgers add
up exactly."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.api.auth import hash_key
from loadtest.fake_upstream import FakeUpstream
from loadtest.scenarios.chaos_figures import ledger_records
from tests.conftest import SHARED_URL, policy_yaml
from tests.servers import free_port, start_gateway

pytestmark = pytest.mark.redis
Upstreams = tuple[FakeUpstream, str, FakeUpstream, str]
TENANTS = f"""tenants:
  capped: {{api_key_sha256: ['{hash_key("sk-capped")}'], rate_limits: {{requests_per_minute: 10}}}}
  broke: {{api_key_sha256: ['{hash_key("sk-broke")}'], budget: {{daily_usd: "0.0005"}}}}
"""


@pytest.fixture
def two(tmp_path: Path, upstreams: Upstreams, prefix: str) -> Iterator[list[str]]:
    _, micro_url, _, flagship_url = upstreams
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_yaml(micro_url, flagship_url) + TENANTS)
    procs, urls = [], []
    try:
        for i in range(2):
            port = free_port()
            procs.append(start_gateway(policy, port, prefix, tmp_path / f"gw{i}"))
            urls.append(f"http://127.0.0.1:{port}")
        yield urls
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=60)


def _post(url: str, key: str) -> int:
    body = {"model": "flagship", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}
    return httpx.post(url + "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"},
                      timeout=10).status_code


def _unchecked(url: str) -> float:
    """Requests this gateway admitted without checking their rate limit (a Redis call over its budget on a
    loaded machine: fail_open by design, counted in `cascade_admission_unchecked_total`)."""
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("cascade_admission_unchecked_total{") and 'check="rate' in line)


def test_one_rate_limit_across_two_processes(two: list[str]) -> None:
    codes = [_post(two[i % 2], "sk-capped") for i in range(30)]
    unchecked = int(sum(_unchecked(url) for url in two))
    assert unchecked <= 3, f"{unchecked} of 30 requests were admitted unchecked"
    assert codes.count(200) == 10 + unchecked and codes.count(429) == 20 - unchecked  # one limit, not one each


def test_one_budget_and_one_ledger_across_two_processes(two: list[str], prefix: str) -> None:
    # each request costs ~132 micro-USD on the flagship; the budget is 500: the fifth one is refused
    codes: list[int] = []
    while 429 not in codes and len(codes) < 12:
        codes.append(_post(two[len(codes) % 2], "sk-broke"))
        time.sleep(1.1)  # past the guard's 1 s cache, so the shared spend is read again
    assert codes == [200, 200, 200, 200, 429]
    records = ledger_records(SHARED_URL, prefix)
    assert len(records) == codes.count(200)
