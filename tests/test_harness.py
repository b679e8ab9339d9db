"""The in-process harness (`tests.harness`): the fake engine client keeps the `EngineClient` contract, the lifespan
runner runs and fails as a server would, and a gateway answers in-process as it does served."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest
from starlette.applications import Starlette

from backends.clients.protocol import EngineHTTPError, EngineUnavailable
from loadtest.fake_upstream import FakeUpstream
from tests.conftest import GatewayFactory, Upstreams, policy_yaml
from tests.harness import BASE_URL, FakeEngines, in_process, lifespan

CHAT = {"model": "auto", "messages": [{"role": "user", "content": "hi there"}], "max_tokens": 8}


async def test_the_fake_engine_client_keeps_the_engine_client_contract() -> None:
    engines = FakeEngines()
    engine = FakeUpstream("micro-model")
    url = engines.add("micro", engine)
    client = engines.client()
    try:
        body = orjson.dumps({**CHAT, "model": "micro-model"})
        answer = orjson.loads(await client.post_json(url, "/v1/chat/completions", body))
        assert answer["usage"]["completion_tokens"] == 8 and engine.requests == 1
        async with client.stream(url, "/v1/chat/completions", orjson.dumps({**orjson.loads(body), "stream": True})) \
                as chunks:
            events = [chunk async for chunk in chunks]
        assert len(events) == 2 and events[0].count(b"\n\n") == 1 and events[1].count(b"\n\n") > 2  # first, rest
        assert all(e.startswith(b"data: ") for e in events) and events[1].endswith(b"data: [DONE]\n\n")
        assert await client.get_text(url + "/health") == ""
        with pytest.raises(EngineUnavailable):  # a host with no fake engine refuses the connection
            await client.post_json("http://nobody.engine.test", "/v1/chat/completions", body)
        engine.fail_status = 503
        with pytest.raises(EngineHTTPError) as failed:
            await client.post_json(url, "/v1/chat/completions", body)
        assert failed.value.status == 503
    finally:
        await client.aclose()


async def test_the_lifespan_runs_startup_before_and_shutdown_after_and_raises_a_failed_startup() -> None:
    seen: list[str] = []

    @asynccontextmanager
    async def ok(app: Starlette) -> AsyncIterator[None]:
        seen.append("up")
        yield
        seen.append("down")

    async with lifespan(Starlette(lifespan=ok)):
        assert seen == ["up"]
    assert seen == ["up", "down"]

    @asynccontextmanager
    async def broken(app: Starlette) -> AsyncIterator[None]:
        raise ValueError("no policy")
        yield

    with pytest.raises((RuntimeError, ValueError), match="no policy"):
        async with lifespan(Starlette(lifespan=broken)):
            pass


def _answer(response: Any) -> tuple[int, str, str]:
    return response.status_code, response.headers["x-cascade-pool"], response.headers["x-cascade-rule"]


def test_a_gateway_answers_in_process_as_it_does_served(make_gateway: GatewayFactory, fake_policy_file: Path,
                                                        fake_upstreams: Upstreams, tmp_path: Path) -> None:
    """The same policy and request give the same route and record whether the gateway is in-process (over the fake
    engines) or on a uvicorn server (over the same engines on ports): the harness changes the wiring, not the
    gateway. In-process, the request takes milliseconds."""
    micro, _, _, _ = fake_upstreams
    inside = make_gateway(fake_policy_file)
    assert inside.url == BASE_URL
    started = time.perf_counter()
    answer = inside.client.post("/v1/chat/completions", json=CHAT)
    assert time.perf_counter() - started < 2.0  # a few ms idle; generous for a loaded machine
    stream = inside.client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert micro.requests == 2 and stream.text.rstrip().endswith("data: [DONE]")

    served_micro, served_flagship = FakeUpstream("micro-model"), FakeUpstream("flagship-model")
    from tests.servers import serve

    with serve(served_micro) as micro_url, serve(served_flagship) as flagship_url:
        policy = tmp_path / "served.yaml"
        policy.write_text(policy_yaml(micro_url, flagship_url))
        served = make_gateway(policy, served=True)
        assert served.url.startswith("http://127.0.0.1:")
        assert _answer(served.client.post("/v1/chat/completions", json=CHAT)) == _answer(answer) == (
            200, "micro", "threshold")
    for gateway in (inside, served):
        records = list(gateway.ledger.records.values())
        assert records and records[0].pool == "micro"


def test_the_openai_sdk_talks_to_an_in_process_gateway(make_gateway: GatewayFactory, fake_policy_file: Path) -> None:
    client = make_gateway(fake_policy_file).openai()
    raw = client.chat.completions.with_raw_response.create(model="flagship", messages=[
        {"role": "user", "content": "hello"}], max_tokens=4)
    assert raw.headers["x-cascade-pool"] == "flagship" and raw.parse().usage is not None
    chunks = list(client.chat.completions.create(model="micro", messages=[{"role": "user", "content": "hello"}],
                                                 max_tokens=4, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


async def test_an_async_test_builds_the_gateway_in_its_own_loop(tmp_path: Path) -> None:
    from gateway.settings import Settings

    engines = FakeEngines()
    micro, flagship = FakeUpstream("micro-model"), FakeUpstream("flagship-model")
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_yaml(engines.add("micro", micro), engines.add("flagship", flagship)))
    settings = Settings(policy_path=policy, scorer="length", start_engines=False, ledger="memory", home=tmp_path)
    async with in_process(settings, engines) as gateway:
        answer = await gateway.client.post("/v1/chat/completions", json={**CHAT, "model": "flagship"})
        assert answer.status_code == 200 and flagship.requests == 1
        assert (await gateway.client.get("/readyz")).json()["ready"] is True
