"""/readyz through the real gateway (uvicorn): only pools required for readiness (and Redis) make it fail;
an optional pool that is down is reported as degraded. Remote pools are optional unless the policy says."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from gateway.api.app import create_app
from gateway.settings import Settings
from tests.conftest import Upstreams, policy_yaml
from tests.servers import PrivateRedis, free_port, serve


def _dead() -> str:
    return f"http://127.0.0.1:{free_port()}"


@contextmanager
def _gateway(tmp_path: Path, micro_url: str, flagship_url: str, micro_required: bool | None = None,
             **settings: Any) -> Iterator[str]:
    text = policy_yaml(micro_url, flagship_url)
    if micro_required is not None:
        text = text.replace(f'urls: ["{micro_url}"]',
                            f'urls: ["{micro_url}"]\n    required_for_ready: {str(micro_required).lower()}')
    path = tmp_path / "p.yaml"
    path.write_text(text)
    options = {"ledger": "memory", **settings}
    with serve(create_app(Settings(policy_path=path, scorer="none", start_engines=False, home=tmp_path,
                                   **options))) as url:
        yield url


def test_an_optional_pool_that_is_down_is_degraded_not_unready(tmp_path: Path, upstreams: Upstreams) -> None:
    _, micro_url, _, _ = upstreams
    with _gateway(tmp_path, micro_url, _dead(), micro_required=True) as url:
        ready = httpx.get(url + "/readyz")
        assert ready.status_code == 200, ready.text
        body = ready.json()
        assert body["ready"] is True and body["pools"] == {"micro": True, "flagship": False}
        assert body["required"] == ["micro"] and body["degraded"] == ["flagship"]
        assert body["status"] == "degraded" and body["reasons"] == [
            "optional pool 'flagship' has no ready replica; the other pools serve meanwhile (its progress: engines)"]
        assert body["router_overflow"] == "none"  # no trained router here: nothing loads after start


def test_a_required_pool_that_is_down_makes_the_gateway_unready(tmp_path: Path, upstreams: Upstreams) -> None:
    _, _, _, flagship_url = upstreams
    with _gateway(tmp_path, _dead(), flagship_url, micro_required=True) as url:
        ready = httpx.get(url + "/readyz")
        assert ready.status_code == 503
        assert ready.json()["ready"] is False and ready.json()["degraded"] == []
        assert ready.json()["reasons"] == ["pool 'micro' is required for readiness and has no ready replica (its "
                                          "progress: engines)"]


def test_with_every_pool_down_the_gateway_is_unready_though_all_are_optional(tmp_path: Path) -> None:
    with _gateway(tmp_path, _dead(), _dead()) as url:
        ready = httpx.get(url + "/readyz")
        assert ready.status_code == 503
        assert ready.json()["required"] == [] and ready.json()["degraded"] == ["flagship", "micro"]
        assert ready.json()["reasons"][0] == "no pool can take requests (their progress: engines)"


def test_redis_down_makes_the_gateway_unready(tmp_path: Path, upstreams: Upstreams) -> None:
    _, micro_url, _, flagship_url = upstreams
    dead_redis = f"redis://127.0.0.1:{free_port()}/0"
    with _gateway(tmp_path, micro_url, flagship_url, ledger="redis", redis_url=dead_redis) as url:
        ready = httpx.get(url + "/readyz", timeout=10)
        assert ready.status_code == 503
        assert ready.json()["redis"] is False and ready.json()["degraded"] == []
        (reason,) = ready.json()["reasons"]
        assert reason.startswith("Redis does not answer") and "fix CASCADE_REDIS_URL" in reason


def test_redis_restarted_is_ready_at_once_despite_connections_opened_before(
    tmp_path: Path, upstreams: Upstreams, private_redis: PrivateRedis
) -> None:
    """Every pooled connection opened before a Redis restart fails once on its next use; /readyz must not say
    Redis is down because its ping drew one (the chaos run saw a lone `redis: false` 30 s after the restart)."""
    _, micro_url, _, flagship_url = upstreams
    with _gateway(tmp_path, micro_url, flagship_url, ledger="redis", redis_url=private_redis.url,
                  redis_prefix="readyz:") as url:
        with ThreadPoolExecutor(8) as pool:  # several /readyz at once: several pooled connections
            assert {r.status_code for r in pool.map(lambda _: httpx.get(url + "/readyz"), range(16))} == {200}
        private_redis.restart()
        answers = [httpx.get(url + "/readyz") for _ in range(8)]
        assert [(r.status_code, r.json()["redis"]) for r in answers] == [(200, True)] * 8
