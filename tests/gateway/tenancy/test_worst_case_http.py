"""Budget holds are the true worst case, through the gateway in-process, the real Redis ledger and fake engines that
write until their context ends when no limit is sent (`fake_tokens` far above the context)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from gateway.api.auth import hash_key
from loadtest.scenarios.chaos_figures import ledger_records
from policies.loader import parse_policy
from tests.conftest import SHARED_URL, Upstreams, policy_yaml
from tests.gateway.tenancy.test_admission_http import redis_gateway
from tests.harness import FakeEngines, Gateway
from tests.servers import until

pytestmark = pytest.mark.redis
CONTEXT = 4096
FLAGSHIP_OUT = 15  # micro-USD a completion token on the flagship (15 USD per million)
WORST = CONTEXT * FLAGSHIP_OUT + 3 * 64  # one request's worst case: its prompt (under 64 tokens) and a full context
BUDGET = 4 * WORST  # four requests' worth


def _policy(micro_url: str, flagship_url: str, extra: str = "") -> str:
    text = policy_yaml(micro_url, flagship_url).replace(
        "    model: micro-model\n", f"    model: micro-model\n    context_tokens: {CONTEXT}\n").replace(
        "    model: flagship-model\n", f"    model: flagship-model\n    context_tokens: {CONTEXT}\n")
    tenants = f"""tenants:
  tight: {{api_key_sha256: ['{hash_key("sk-tight")}'], budget: {{daily_usd: "{BUDGET / 1e6:.6f}"}},
          on_redis_outage: fail_closed}}
  open: {{api_key_sha256: ['{hash_key("sk-open")}']}}
"""
    return text + extra + tenants


@pytest.fixture
def served(tmp_path: Path, fake_engines: FakeEngines, fake_upstreams: Upstreams,
           request: pytest.FixtureRequest) -> Iterator[tuple[Gateway, str]]:
    _, micro_url, _, flagship_url = fake_upstreams
    policy = _policy(micro_url, flagship_url, getattr(request, "param", ""))
    with redis_gateway(tmp_path, policy, fake_engines) as gateway:
        yield gateway


def _post(gateway: Gateway, key: str, limit: int | None = None) -> httpx.Response:
    body: dict[str, object] = {"model": "flagship", "messages": [{"role": "user", "content": "write at length"}],
                               "metadata": {"fake_tokens": str(CONTEXT)}}  # an engine left alone writes to its end
    if limit is not None:
        body["max_tokens"] = limit
    return gateway.client.post("/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"},
                               timeout=60)


def _records(prefix: str, count: int) -> list[dict[str, str]]:
    until(lambda: len(ledger_records(SHARED_URL, prefix)) >= count, 20)
    return ledger_records(SHARED_URL, prefix)


def test_thirty_parallel_requests_without_a_limit_end_at_most_one_worst_case_over(
        served: tuple[Gateway, str], fake_upstreams: Upstreams) -> None:
    gateway, prefix = served
    assert _post(gateway, "sk-open").status_code == 200  # warm: the scripts and connections are ready
    # 429: the budget is held; 503: a check slower than the guard's timeout on a loaded machine (fail_closed: a
    # request the gateway could not check is refused, so the bound holds whatever the machine's load). A burst
    # that met no 429 is sent again once a single request is checked again (at most three bursts)
    codes: list[int] = []

    def checked() -> bool:
        codes.append(_post(gateway, "sk-tight").status_code)
        return codes[-1] != 503

    with ThreadPoolExecutor(30) as pool:
        for _ in range(3):
            codes += pool.map(lambda _: _post(gateway, "sk-tight").status_code, range(30))
            if 429 in codes:
                break
            until(checked, 20)
    assert set(codes) <= {200, 429, 503} and 200 in codes and 429 in codes, codes
    served_n = codes.count(200)
    records = [r for r in _records(prefix, served_n + 1) if r["tenant"] == "tight"]
    spent = sum(int(r["cost_micro_usd"]) for r in records)
    print(f"{len(codes)} requests without max_tokens: {served_n} served, {spent} micro-USD spent of a {BUDGET} "
          f"budget (one worst case {WORST}), {codes.count(503)} unchecked (503)")
    assert spent <= BUDGET + WORST, (spent, BUDGET, WORST, served_n)
    sent = fake_upstreams[2].last_body or {}
    assert 0 < sent["max_completion_tokens"] < CONTEXT  # the engine was told where to stop


def test_the_record_says_which_limit_was_set(served: tuple[Gateway, str], fake_upstreams: Upstreams) -> None:
    gateway, prefix = served
    assert _post(gateway, "sk-open").status_code == 200
    assert _post(gateway, "sk-open", limit=7).status_code == 200
    assert fake_upstreams[2].last_body is not None and fake_upstreams[2].last_body["max_tokens"] == 7
    records = sorted(_records(prefix, 2), key=lambda r: r["completion_limit_by"])
    assert [r["completion_limit_by"] for r in records] == ["", "context"]
    assert records[0]["completion_limit_tokens"] == "0" and records[0]["completion_tokens"] == "7"
    room = int(records[1]["completion_limit_tokens"])
    assert 0 < room < CONTEXT and records[1]["completion_tokens"] == str(room)


@pytest.mark.parametrize("served", ["default_max_tokens: 300\n"], indirect=True)
def test_a_policy_default_is_sent_and_recorded(served: tuple[Gateway, str], fake_upstreams: Upstreams) -> None:
    gateway, prefix = served
    assert _post(gateway, "sk-open").status_code == 200
    assert fake_upstreams[2].last_body is not None and fake_upstreams[2].last_body["max_completion_tokens"] == 300
    (record,) = _records(prefix, 1)
    assert (record["completion_limit_by"], record["completion_limit_tokens"]) == ("default", "300")


def test_a_default_limit_larger_than_a_context_or_negative_is_refused_at_load() -> None:
    text = _policy("http://127.0.0.1:1", "http://127.0.0.1:2")
    parse_policy(text + "default_max_tokens: 1000\n")  # fits both contexts
    for bad, says in ((f"default_max_tokens: {CONTEXT}\n", "does not fit pool 'micro'"),
                      ("default_max_tokens: -5\n", "greater than or equal to 1")):
        with pytest.raises(Exception) as caught:
            parse_policy(text + bad)
        assert "default_max_tokens" in str(caught.value) and says in str(caught.value)
