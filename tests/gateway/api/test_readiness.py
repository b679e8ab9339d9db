"""/readyz through the real gateway (uvicorn): only pools required for readiness (and Redis) make it fail;
an optional pool that is down is reported as degraded. Remote pools are optional unless the policy says."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from gateway.api.app import create_app
from gateway.settings import Settings
from loadtest.fake_upstream import FakeUpstream
from tests.conftest import policy_yaml
from tests.servers import free_port, serve

Upstreams = tuple[FakeUpstream, str, FakeUpstream, str]


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


def test_a_required_pool_that_is_down_makes_the_gateway_unready(tmp_path: Path, upstreams: Upstreams) -> None:
    _, _, _, flagship_url = upstreams
    with _gateway(tmp_path, _dead(), flagship_url, micro_required=True) as url:
        ready = httpx.get(url + "/readyz")
        assert ready.status_code == 503
        assert ready.json()["ready"] is False and ready.json()["degraded"] == []


def test_with_every_pool_down_the_gateway_is_unready_though_all_are_optional(tmp_path: Path) -> None:
    with _gateway(tmp_path, _dead(), _dead()) as url:
        ready = httpx.get(url + "/readyz")
        assert ready.status_code == 503
        assert ready.json()["required"] == [] and ready.json()["degraded"] == ["flagship", "micro"]


def test_redis_down_makes_the_gateway_unready(tmp_path: Path, upstreams: Upstreams) -> None:
    _, micro_url, _, flagship_url = upstreams
    dead_redis = f"redis://127.0.0.1:{free_port()}/0"
    with _gateway(tmp_path, micro_url, flagship_url, ledger="redis", redis_url=dead_redis) as url:
        ready = httpx.get(url + "/readyz", timeout=10)
        assert ready.status_code == 503
        assert ready.json()["redis"] is False and ready.json()["degraded"] == []
