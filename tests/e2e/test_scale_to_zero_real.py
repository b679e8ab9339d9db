"""Scale to zero with a real vLLM engine (demo micro model): the gateway starts with the on-demand pool
asleep and ready, the first request cold-starts the engine and waits for it, and the engine stops after the
idle period while the pool stays ready. Prints the cold-start time.

The engine speculates (n-gram prompt lookup, the policy's `speculative` block): while it is awake, requests the
proposer has something to find in go through the gateway with the official openai SDK, and the gateway's own
/metrics shows the engine's drafted and accepted tokens and the pool's acceptance, as its probe scraped them. (This
was `test_speculative_real.py`, an engine start of its own with the probe called by hand.)

That the next request wakes the pool again is the gate's (`tests/backends/clients/test_scale_to_zero.py`,
`test_idle_pool_sleeps_after_idle_stop_after_s_but_not_while_busy`): a wake after a sleep runs the same start as
the first one, exercised here on the real engine; a real engine started again on its port after its group
stopped is the chaos run's kill and restart (`tests/chaos/test_faults_together.py`)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.cli.demo import stop_process_group
from loadtest.fake_upstream import FakeUpstream
from tests.engines import own_micro_engine_policy
from tests.servers import free_port, serve

pytestmark = [pytest.mark.engines, pytest.mark.redis]
ROOT = Path(__file__).resolve().parents[2]
IDLE_S = 6
# input-echoing work, where prompt lookup has something to find
PROMPTS = (
    "Copy this list exactly: alpha beta gamma delta, alpha beta gamma delta, alpha beta gamma delta.",
    "Rewrite without changing a word: the quick brown fox jumps over the lazy dog near the river bank.",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\nRename add to plus in this code.",
)


def _policy(engine_port: int, flagship_url: str) -> str:
    """The micro pool's engine speculates (n-gram) and sleeps after `IDLE_S` idle seconds."""
    return own_micro_engine_policy(
        engine_port, flagship_url, engine=", speculative: {method: ngram, num_speculative_tokens: 4}",
        pool=f"    on_demand: {{idle_stop_after_s: {IDLE_S}, cold_start_timeout_s: 600, on_cold: wait}}\n")


@pytest.fixture
def gateway(tmp_path: Path, prefix: str) -> Iterator[tuple[str, int]]:
    engine_port, port = free_port(), free_port()
    with serve(FakeUpstream("flagship-model")) as flagship_url:
        policy = tmp_path / "policy.yaml"
        policy.write_text(_policy(engine_port, flagship_url))
        cmd = [sys.executable, "-m", "gateway", "serve", "--policy", str(policy), "--port", str(port),
               "--scorer", "none", "--redis-prefix", prefix, "--log-format", "plain"]
        log_path = tmp_path / "gateway.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True,
                                    env={**os.environ, "HF_HUB_OFFLINE": "1"})
        try:
            yield f"http://127.0.0.1:{port}", engine_port
        finally:
            stop_process_group(proc)
            print(log_path.read_text()[-3000:])


def _readyz(base: str, timeout_s: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            r = httpx.get(base + "/readyz", timeout=2)
            if r.status_code == 200:
                body: dict[str, Any] = r.json()
                return body
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise AssertionError("gateway never became ready")


def _engine_up(port: int, timeout_s: float = 2.0) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=timeout_s).status_code == 200
    except httpx.HTTPError:
        return False


def _cold_request(base: str) -> float:
    body = {"model": "micro", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}
    started = time.monotonic()
    r = httpx.post(base + "/v1/chat/completions", json=body, timeout=700)
    took = time.monotonic() - started
    assert r.status_code == 200, r.text
    assert r.headers["x-cascade-pool"] == "micro" and r.json()["usage"]["completion_tokens"] > 0
    return took


def _wait_asleep(base: str, engine_port: int) -> float:
    started = time.monotonic()
    while time.monotonic() - started < IDLE_S + 60:
        status = _readyz(base)["engines"]["micro"]
        if status.startswith("sleeping (stopped after") and not _engine_up(engine_port):
            return time.monotonic() - started
        time.sleep(0.5)
    raise AssertionError(f"engine not stopped after idle: {_readyz(base)}")


def _speculation(text: str, replica: str | None = None) -> dict[str, float]:
    """Drafted and accepted token totals (and the pool's acceptance, from a gateway) in an exposition, read with
    prometheus_client's own parser (not ours); `replica`: only the gateway's samples of that replica."""
    names = {"vllm:spec_decode_num_draft_tokens": "drafted", "vllm:spec_decode_num_accepted_tokens": "accepted",
             "cascade_replica_spec_decode_draft_tokens": "drafted",
             "cascade_replica_spec_decode_accepted_tokens": "accepted",
             "cascade_pool_spec_decode_acceptance": "acceptance"}
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples if family.name in names else ():
            counted = sample.name.endswith("_total") or family.type == "gauge"
            if counted and sample.labels.get("replica", replica) == replica:
                found[names[family.name]] = found.get(names[family.name], 0.0) + sample.value
    return found


def _speculates_and_the_gateway_shows_it(base: str, engine_port: int) -> None:
    """Requests the proposer can draft for, through the gateway; then the engine's counters, as the gateway's probe
    scraped them (polled: a probe a second, and the engine sleeps IDLE_S after the last request)."""
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
    for prompt in PROMPTS:
        answer = client.chat.completions.create(
            model="micro", messages=[{"role": "user", "content": prompt}], max_tokens=48, temperature=0)
        assert answer.choices[0].message.content and answer.usage and answer.usage.completion_tokens > 0
    client.close()
    engine_url = f"http://127.0.0.1:{engine_port}"
    engine = _speculation(httpx.get(engine_url + "/metrics", timeout=5).text)
    assert engine["drafted"] > 0, engine  # three answers of up to 48 tokens: the proposer ran
    deadline = time.monotonic() + IDLE_S - 1
    while (seen := _speculation(httpx.get(base + "/metrics", timeout=5).text, engine_url)) != {
            **engine, "acceptance": engine["accepted"] / engine["drafted"]}:
        assert time.monotonic() < deadline, f"gateway: {seen}, engine: {engine}"
        time.sleep(0.2)
    print(f"\nspeculation: drafted {engine['drafted']:.0f}, accepted {engine['accepted']:.0f} tokens")


def test_on_demand_pool_sleeps_when_idle_and_cold_starts_on_the_next_request(gateway: tuple[str, int]) -> None:
    base, engine_port = gateway
    first = _readyz(base, 120)
    assert first["ready"] and first["pools"]["micro"] and first["engines"]["micro"].startswith("sleeping")
    assert not _engine_up(engine_port)

    cold1 = _cold_request(base)
    # it has just answered, so the supervisor holds it awake; its own /health is not asked here: a busy host kept it
    # from answering within 2 s (fc of 2026-12-06) and within 5 s (a 2-core Xeon, 2026-12-07), and past IDLE_S the
    # gateway may stop it. The warm request right after is the engine serving.
    assert _readyz(base)["engines"]["micro"].startswith("awake"), _readyz(base)
    warm_started = time.monotonic()
    _cold_request(base)
    warm = time.monotonic() - warm_started
    awake = _readyz(base)["engines"]["micro"]
    _speculates_and_the_gateway_shows_it(base, engine_port)
    asleep_after = _wait_asleep(base, engine_port)
    assert _readyz(base)["pools"]["micro"]  # asleep and still ready
    print(f"\nCOLD START: {cold1:.1f} s (request latency, demo micro engine); warm request {warm * 1000:.0f} ms; "
          f"stopped {asleep_after:.1f} s after the last request (idle_stop_after_s {IDLE_S}); status: {awake}")
    assert awake.startswith("awake (cold start took")
    assert 2 * warm < cold1 and cold1 > 5  # a warm request is far quicker than a start, whatever the host's speed
    assert asleep_after <= IDLE_S + 30
