"""A flagship_share policy through two real gateways (uvicorn, fake engines, one Redis): the realised share
stays near the target after warm-up and after the traffic drifts, and /metrics shows the gauges."""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from gateway.api.app import create_app
from gateway.settings import Settings
from tests.conftest import policy_yaml
from tests.servers import serve, until

SHARE = "{flagship_share: 0.3, window: 200, min_samples: 50, initial: 0.95}"


@pytest.fixture
def gateways(tmp_path: Path, upstreams: tuple[object, str, object, str], prefix: str) -> Iterator[list[str]]:
    _, micro_url, _, flagship_url = upstreams
    path = tmp_path / "policy.yaml"
    path.write_text(policy_yaml(micro_url, flagship_url).replace("  threshold: 0.5\n", f"  threshold: {SHARE}\n"))
    with ExitStack() as stack:
        urls = []
        for i in range(2):  # two workers: one shared window
            settings = Settings(policy_path=path, scorer="length", start_engines=False, ledger="redis",
                                redis_prefix=prefix, home=tmp_path / f"w{i}", policy_watch_interval_s=0)
            urls.append(stack.enter_context(serve(create_app(settings))))
        yield urls


def _send(urls: list[str], words: list[int]) -> float:
    """Send one auto request per word count (the length scorer scores words / 200), alternating workers;
    the share that went to the flagship."""
    flagship = 0
    with httpx.Client(timeout=30) as client:
        for i, n in enumerate(words):
            body = {"model": "auto", "messages": [{"role": "user", "content": "w " * n}], "max_tokens": 4}
            r = client.post(f"{urls[i % 2]}/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text
            flagship += r.headers["x-cascade-pool"] == "flagship"
    return flagship / len(words)


def _gauges(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics").text
    return {m[1]: float(m[2]) for m in re.finditer(r"^(cascade_routing_\w+) ([0-9.e+-]+)$", text, re.M)}


def _until(urls: list[str], ok: Callable[[dict[str, float]], bool], what: str) -> None:
    """Wait until `ok` holds for every worker's gauges: each refreshes from the shared window once a second,
    later on a loaded machine (a fixed 1.5 s wait once read a worker that had not refreshed yet)."""
    until(lambda: all(ok(_gauges(url)) for url in urls), timeout=30,
          describe=lambda: f"timed out waiting for {what}: {[_gauges(url) for url in urls]}")


@pytest.mark.slow
def test_realised_share_tracks_the_target_through_drift(gateways: list[str]) -> None:
    rng = random.Random(7)
    assert _send(gateways, [rng.randint(1, 199) for _ in range(60)]) < 0.1  # initial 0.95 while warming up
    _until(gateways, lambda g: g.get("cascade_routing_threshold", 0.95) < 0.95, "a refresh after the warm-up")
    measured = _send(gateways, [rng.randint(1, 199) for _ in range(200)])
    # 200 requests against a quantile of 200 scores: the share's standard deviation is ~0.045, so +-0.15
    # is over 3 sigma (a +-0.1 band failed 1 run in a few)
    assert 0.15 <= measured <= 0.45, measured
    _until(gateways, lambda g: g["cascade_routing_window_scores"] == 200, "a full window")  # not the warm-up's 60
    live = _gauges(gateways[0])
    assert 0.6 < live["cascade_routing_threshold"] < 0.8  # ~ the 70th percentile of words/200
    # drift: prompts get longer; a fixed threshold of ~0.7 would now send ~60% to the flagship
    _send(gateways, [rng.randint(100, 199) for _ in range(200)])
    _until(gateways, lambda g: g["cascade_routing_threshold"] > 0.75, "the threshold following the longer prompts")
    drifted = _send(gateways, [rng.randint(100, 199) for _ in range(200)])
    assert 0.15 <= drifted <= 0.45, drifted
    # once both have refreshed with the last 200 (the window's size), its share is theirs
    _until(gateways, lambda g: 0.15 <= g["cascade_routing_flagship_share"] <= 0.45, "the window's share")
    for url in gateways:  # both workers read the one window
        gauges = _gauges(url)
        assert gauges["cascade_routing_flagship_share_target"] == 0.3
        assert 0.15 <= gauges["cascade_routing_flagship_share"] <= 0.45
        assert 0.75 < gauges["cascade_routing_threshold"] < 0.9  # moved up from ~0.7 with the traffic
        assert gauges["cascade_routing_window_scores"] == 200
