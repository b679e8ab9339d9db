"""The degradation ladder under REAL load: the demo vLLM engines, the gateway as a separate process, and
long streaming requests sent straight to the flagship engine until its KV cache fills up.

The demo models are tiny (2 KiB of KV cache per token) and vLLM's CPU KV space is set in whole GiB, so with
defaults the cache never fills. The shared flagship engine (`tests/engines.py`) therefore has a cache of 64
usable blocks of 32 tokens (`--block-size 32 --num-gpu-blocks-override 65`, one kept back: 2048 tokens; the CPU
backend wants blocks of 32k):
ten concurrent requests of ~200 prompt + 600 generated tokens keep `vllm:kv_cache_usage_perc` between ~0.6 and 1.0
(vLLM preempts and recomputes when it is full) and it falls to 0 as soon as they are cancelled.

The ladder watches the flagship's `kv_cache_usage`: a `truncate_context` step (`scope: all`, so it also cuts the
requests the next step moves away from the flagship) and a `fallback_pool` step to micro. The fallback remaps
the flagship pool for every request, pinned ones included (`policies.decide`: the ladder's remap comes after the
pinned pool is chosen), so a request pinned to `flagship` shows it.

Slow (engine start-up is minutes on 2 CPU cores): one gateway on the shared demo engines, one test.
"""

from __future__ import annotations

import random
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import yaml

from tests.conftest import delete_prefix
from tests.engines import FLAGSHIP_KV_ARGS, Gateway, SharedEngines, demo_policy_text, gateway_on_shared_engines

pytestmark = [pytest.mark.engines, pytest.mark.redis]

ENGAGE_TIMEOUT_S = 120.0
RELEASE_TIMEOUT_S = 90.0

TRUNCATE, FALLBACK = "flagship-kv-truncate", "flagship-kv-fallback"
LADDER = {
    "steps": [
        {"name": TRUNCATE, "signal": "kv_cache_usage", "pool": "flagship", "enter_above": 0.6, "exit_below": 0.15,
         "hold_s": 2, "action": {"type": "truncate_context", "max_tokens": 64},
         "scope": "all"},  # also the traffic the fallback below moves to micro (scope: pool would spare it)
        {"name": FALLBACK, "signal": "kv_cache_usage", "pool": "flagship", "enter_above": 0.75,
         "exit_below": 0.15, "hold_s": 2, "action": {"type": "fallback_pool", "to_pool": "micro"}},
    ]
}
LOAD_WORKERS = 10
LOAD_PROMPT_WORDS = 50  # ~4 demo-tokenizer tokens per word: ~200 prompt tokens, + 600 generated < its 2,048
LOAD_MAX_TOKENS = 600
WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo",
         "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango", "uniform", "victor")


@pytest.fixture(scope="module")
def gateway(shared_engines: SharedEngines, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """The shared demo engines (the flagship's KV cache is the small one above) and a gateway with the ladder in
    front of them."""
    prefix = f"test:ladder:{uuid.uuid4().hex[:8]}:"
    policy = yaml.safe_load(demo_policy_text())
    assert policy["pools"]["flagship"]["engine"]["extra_args"] == ["--enforce-eager", *FLAGSHIP_KV_ARGS]
    policy["degradation"] = LADDER
    policy_path = tmp_path_factory.mktemp("ladder") / "policy.yaml"
    policy_path.write_text(yaml.safe_dump(policy, sort_keys=False))
    # Only pinned requests are sent: the length scorer spares loading the classifier.
    try:
        with gateway_on_shared_engines(shared_engines, policy_path, prefix, ["--scorer", "length"]) as gw:
            yield gw
    finally:
        delete_prefix(prefix)


_GAUGE = re.compile(r"^(cascade_replica_kv_cache_usage|cascade_degradation_active)\{([^}]*)\}\s+(\S+)$", re.MULTILINE)
_LABEL = re.compile(r'(\w+)="([^"]*)"')


@dataclass(frozen=True)
class Sample:
    t: float  # seconds since the load started
    kv: float  # the flagship's KV-cache use as the gateway scraped it
    active: frozenset[str]  # ladder steps whose cascade_degradation_active gauge is 1


def _scrape(url: str) -> tuple[dict[str, float], frozenset[str]]:
    """Flagship KV use per replica URL, and the active ladder steps, from the gateway's /metrics."""
    kv: dict[str, float] = {}
    active: set[str] = set()
    for name, labels, value in _GAUGE.findall(httpx.get(url + "/metrics", timeout=10).text):
        tags = dict(_LABEL.findall(labels))
        if name == "cascade_replica_kv_cache_usage" and tags.get("pool") == "flagship":
            kv[tags["replica"]] = float(value)
        elif name == "cascade_degradation_active" and float(value) == 1.0:
            active.add(tags["step"])
    return kv, frozenset(active)


@dataclass
class Load:
    """Workers streaming long completions straight at one engine, each starting a new one when its last
    ends, until `stop` (which drops the connections: vLLM aborts the requests and frees their blocks)."""

    engine_url: str
    workers: int = LOAD_WORKERS
    stop_event: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)
    started: int = 0
    failures: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> None:
        for i in range(self.workers):
            thread = threading.Thread(target=self._work, args=(i,), name=f"kv-load-{i}", daemon=True)
            thread.start()
            self.threads.append(thread)

    def stop(self) -> None:
        self.stop_event.set()
        for thread in self.threads:
            thread.join(timeout=30)

    def _work(self, worker: int) -> None:
        rnd = random.Random(worker)
        stale = 0  # keep-alive connections the engine closed just as this worker reused them, in a row
        with httpx.Client(timeout=httpx.Timeout(60, connect=10)) as client:
            while not self.stop_event.is_set():
                # distinct prompts: vLLM's prefix cache must not share their blocks
                prompt = f"{rnd.random()} " + " ".join(rnd.choice(WORDS) for _ in range(LOAD_PROMPT_WORDS))
                body = {"model": "flagship", "messages": [{"role": "user", "content": prompt}],
                        "max_tokens": LOAD_MAX_TOKENS, "ignore_eos": True, "stream": True}
                with self.lock:
                    self.started += 1
                try:
                    with client.stream("POST", self.engine_url + "/v1/chat/completions", json=body) as resp:
                        if resp.status_code != 200:
                            self._failed(f"HTTP {resp.status_code}: {resp.read()[:300]!r}")
                            continue
                        for _ in resp.iter_lines():
                            if self.stop_event.is_set():
                                break
                    stale = 0
                except httpx.RemoteProtocolError as exc:  # a reused connection the engine had closed: retry anew
                    stale += 1
                    if stale >= 3 and not self.stop_event.is_set():
                        self._failed(repr(exc))
                except httpx.HTTPError as exc:
                    if not self.stop_event.is_set():
                        self._failed(repr(exc))

    def _failed(self, what: str) -> None:
        with self.lock:
            self.failures.append(what)
        time.sleep(1)  # never spin on a refusing engine


class Watch:
    """Samples the gateway's view (flagship KV use, active steps) while waiting for a condition."""

    def __init__(self, gw: Gateway, replica: str) -> None:
        self.gw, self.replica = gw, replica
        self.t0 = time.monotonic()
        self.samples: list[Sample] = []

    def sample(self) -> Sample:
        kv, active = _scrape(self.gw.url)
        s = Sample(round(time.monotonic() - self.t0, 1), kv.get(self.replica, float("nan")), active)
        self.samples.append(s)
        return s

    def until(self, what: str, check: Callable[[Sample], bool], timeout: float, load: Load | None = None) -> Sample:
        deadline = time.monotonic() + timeout
        while True:
            s = self.sample()
            if check(s):
                return s
            if time.monotonic() > deadline:
                pytest.fail(self.report(f"{what}: not reached in {timeout:.0f} s", load))
            time.sleep(0.5)

    def curve(self) -> str:
        return " ".join(f"{s.t:.1f}s:{s.kv:.2f}{'*' * len(s.active)}" for s in self.samples)

    def report(self, headline: str, load: Load | None = None) -> str:
        load_info = "" if load is None else f"\nload: {load.started} requests, failures: {load.failures[-5:]}"
        return (f"{headline}\nKV curve (t: use, * per active step): {self.curve()}{load_info}\n"
                f"gateway log tail:\n{self.gw.log_tail()}")


def _chat(gw: Gateway, messages: list[dict[str, str]]) -> httpx.Response:
    body: dict[str, Any] = {"model": "flagship", "messages": messages, "max_tokens": 8}
    resp = httpx.post(gw.url + "/v1/chat/completions", json=body, timeout=120)
    assert resp.status_code == 200, f"{resp.status_code} {resp.text}\n{gw.log_tail()}"
    return resp


def _degraded_chat(gw: Gateway, messages: list[dict[str, str]], watch: Watch, load: Load) -> httpx.Response:
    """Send `messages` while both ladder steps are engaged. The load's KV use swings as its requests finish, so the
    steps can release between the scrape that saw them engaged and the request's routing (seen: engaged for 9 s,
    released 1 s into the request; and the fallback released while a conversation was sent, which was truncated
    but stayed on the flagship): a request answered without both steps is sent again once both are engaged again,
    three tries in all. The last answer is returned whatever it says."""
    for tries in range(1, 4):
        watch.until("both ladder steps engaged", lambda s: s.active >= {TRUNCATE, FALLBACK}, ENGAGE_TIMEOUT_S, load)
        r = _chat(gw, messages)
        if set(r.headers.get("x-cascade-degraded", "").split(",")) == {TRUNCATE, FALLBACK} or tries == 3:
            break
    return r


def _conversation(turns: int) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": "You are terse."}]
    for i in range(turns):
        messages.append({"role": "user", "content": f"Question {i}: " + "tell me more about lighthouses " * 4})
        messages.append({"role": "assistant", "content": f"Answer {i}: " + "they guide ships at night " * 4})
    messages.append({"role": "user", "content": "And the last one?"})
    return messages


def test_kv_pressure_engages_truncation_and_fallback_then_recedes(gateway: Gateway) -> None:
    hello = [{"role": "user", "content": "hello there"}]
    kv, active = _scrape(gateway.url)
    assert len(kv) == 1, f"expected one flagship replica in the gateway's /metrics, got {kv}"
    engine_url = next(iter(kv))
    assert not active, f"ladder steps active before any load: {active}"

    # (a) unloaded: a request pinned to the flagship is served there, undegraded
    r = _chat(gateway, hello)
    assert (r.headers["x-cascade-pool"], r.headers["x-cascade-rule"]) == ("flagship", "pinned")
    assert "x-cascade-degraded" not in r.headers and r.json()["model"] == "flagship"

    # (b) fill the flagship's KV cache with real requests straight at its engine
    watch = Watch(gateway, engine_url)
    load = Load(engine_url)
    try:
        load.start()
        engaged = watch.until("both ladder steps engaged", lambda s: s.active >= {TRUNCATE, FALLBACK},
                              ENGAGE_TIMEOUT_S, load)
        # (c) degraded: the pinned flagship request goes to micro, long conversations are cut
        r = _degraded_chat(gateway, hello, watch, load)
        steps = set(r.headers.get("x-cascade-degraded", "").split(","))
        assert steps == {TRUNCATE, FALLBACK}, watch.report(f"x-cascade-degraded: {steps}", load)
        assert (r.headers["x-cascade-pool"], r.headers["x-cascade-rule"]) == ("micro", f"ladder:{FALLBACK}")
        assert r.json()["model"] == "micro"
        r = _degraded_chat(gateway, _conversation(turns=3), watch, load)
        assert r.headers["x-cascade-pool"] == "micro", watch.report(f"not moved to micro: {r.headers}", load)
        assert int(r.headers.get("x-cascade-truncated", "0")) > 0, watch.report(f"not truncated: {r.headers}", load)
        cut_tokens = r.json()["usage"]["prompt_tokens"]
        peak_loaded = max(s.kv for s in watch.samples)
        assert not load.failures, f"load requests failed: {load.failures[:5]}"
    finally:
        stopped_at = round(time.monotonic() - watch.t0, 1)
        load.stop()

    # (d) the load is gone: the steps release, the flagship serves again
    released = watch.until("both ladder steps released", lambda s: not s.active, RELEASE_TIMEOUT_S)
    r = _chat(gateway, hello)
    assert (r.headers["x-cascade-pool"], r.headers["x-cascade-rule"]) == ("flagship", "pinned"), r.headers
    assert "x-cascade-degraded" not in r.headers
    r = _chat(gateway, _conversation(turns=3))
    assert "x-cascade-truncated" not in r.headers and r.headers["x-cascade-pool"] == "flagship"
    full_tokens = r.json()["usage"]["prompt_tokens"]
    assert cut_tokens < full_tokens / 2, f"truncated prompt {cut_tokens} tokens vs {full_tokens} in full"

    print(f"\nflagship KV under load: peak {peak_loaded:.2f}, both steps engaged {engaged.t:.1f} s after the load "
          f"started, load stopped at {stopped_at:.1f} s, released {released.t - stopped_at:.1f} s later "
          f"({load.started} load requests); prompt {full_tokens} tokens, {cut_tokens} truncated\n"
          f"KV curve (t: use, * per active step): {watch.curve()}")
