"""Two gateway processes sharing one Redis enforce one rate limit and one budget, and their ledgers add
up exactly."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from gateway.api.auth import hash_key
from loadtest.fake_upstream import FakeUpstream
from loadtest.scenarios.chaos_figures import ledger_records
from tests.conftest import SHARED_URL, delete_prefix, policy_yaml
from tests.servers import free_port, serve, start_gateway

# one xdist group: under pytest-xdist the module's two gateway processes (`two`) start once, not once per worker
pytestmark = [pytest.mark.redis, pytest.mark.xdist_group("two-gateways")]
TENANTS = f"""tenants:
  capped: {{api_key_sha256: ['{hash_key("sk-capped")}'], rate_limits: {{requests_per_minute: 10}}}}
  broke: {{api_key_sha256: ['{hash_key("sk-broke")}'], budget: {{daily_usd: "0.0002"}}}}
"""


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[str], str]]:
    """Two gateway processes on one Redis prefix, shared by the module's tests (each test uses its own tenant);
    yields their URLs and the prefix."""
    tmp_path = tmp_path_factory.mktemp("two-gateways")
    prefix = f"test:{uuid.uuid4().hex}:"
    micro, flagship = FakeUpstream("micro-model"), FakeUpstream("flagship-model")
    with serve(micro) as micro_url, serve(flagship) as flagship_url:
        policy = tmp_path / "policy.yaml"
        policy.write_text(policy_yaml(micro_url, flagship_url) + TENANTS)
        ports = [free_port() for _ in range(2)]
        with ThreadPoolExecutor(2) as pool:  # both start at once
            started = [pool.submit(start_gateway, policy, port, prefix, tmp_path / f"gw{i}")
                       for i, port in enumerate(ports)]
        procs = [f.result() for f in started if f.exception() is None]
        try:
            for f in started:
                f.result()  # raises the first start's failure (the started one is stopped below)
            yield [f"http://127.0.0.1:{port}" for port in ports], prefix
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait(timeout=60)
            delete_prefix(prefix)


def _post(url: str, key: str) -> int:
    # the timeout is generous: CI runs this beside real engines on two cores, where one answer of a fake upstream
    # has taken over 10 s; a request cut off by the client would still be served and recorded after the test
    body = {"model": "flagship", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}
    return httpx.post(url + "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"},
                      timeout=120).status_code


def _unchecked(url: str) -> float:
    """Requests this gateway admitted without checking their rate limit (a Redis call over its budget on a
    loaded machine: fail_open by design, counted in `cascade_admission_unchecked_total`)."""
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("cascade_admission_unchecked_total{") and 'check="rate' in line)


def test_a_served_gateway_freezes_its_long_lived_heap(two: tuple[list[str], str]) -> None:
    # `cascade serve` owns its process: start-up ends with the heap frozen out of the cyclic collector
    text = httpx.get(two[0][0] + "/metrics", timeout=30).text
    frozen = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith("cascade_gc_frozen_objects")]
    assert frozen and frozen[0] > 10_000
    assert "cascade_gc_pause_seconds_count" in text


def test_one_rate_limit_across_two_processes(two: tuple[list[str], str]) -> None:
    urls, _ = two
    codes = [_post(urls[i % 2], "sk-capped") for i in range(30)]
    unchecked = int(sum(_unchecked(url) for url in urls))
    assert unchecked <= 3, f"{unchecked} of 30 requests were admitted unchecked"
    assert codes.count(200) == 10 + unchecked and codes.count(429) == 20 - unchecked  # one limit, not one each


def test_one_budget_and_one_ledger_across_two_processes(two: tuple[list[str], str]) -> None:
    # each request costs ~132 micro-USD on the flagship; the budget is 200: the third one is refused (with a
    # budget per process each would have served two, the third going to the first again)
    urls, prefix = two
    def broke_records() -> int:  # this tenant's only: the module's other test shares the prefix
        return sum(record["tenant"] == "broke" for record in ledger_records(SHARED_URL, prefix))

    before = broke_records()
    codes: list[int] = []
    while 429 not in codes and len(codes) < 12:
        codes.append(_post(urls[len(codes) % 2], "sk-broke"))
        time.sleep(1.1)  # past the guard's 1 s cache, so the shared spend is read again
    assert codes == [200, 200, 429]
    assert broke_records() - before == codes.count(200)
