"""A three-pool policy served end to end by real vLLM engines: the demo micro engine as the general tier, the same
engine as a remote code tier under its own pool, and the demo flagship, behind an in-process gateway (uvicorn),
called with the official openai SDK. Each request goes to the tier with the best trade and is answered by that
tier's engine. The pool map's side is faked (`tests.gateway.serving.tier_fakes`); engines, gateway and SDK are
real. Slow: the shared demo engines (`tests/engines.py`)."""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest
import yaml

from backends.engines.registry import REGISTRY_ENV, publish
from gateway.api.app import create_app
from gateway.settings import Settings
from policies.loader import parse_policy
from policies.schema import LocalPool
from tests.engines import SharedEngines, demo_policy_text
from tests.gateway.serving.tier_fakes import fake_the_map
from tests.servers import serve

pytestmark = [pytest.mark.engines]


def _three_pools(shared: SharedEngines, folder: Path) -> Path:
    """The shared demo pair as the first and last tier, and the micro engine again as a remote code tier."""
    data = yaml.safe_load(demo_policy_text())
    local = parse_policy(demo_policy_text()).policy.pools
    specs = {name: spec.engine for name, spec in local.items() if isinstance(spec, LocalPool)}
    urls = dict(zip(specs, shared.urls(list(specs.values())), strict=True))
    registry = folder / "engines"
    for name, pool_urls in urls.items():
        publish(registry, name, pool_urls)
    data["pools"]["micro"]["placement"] = "general-7b"
    data["pools"]["flagship"]["placement"] = "frontier"
    data["pools"]["code"] = {"type": "remote", "urls": list(urls["micro"]), "model": "micro", "placement": "code.json",
                             "price": {"input_per_mtok": "0.80", "output_per_mtok": "0.80"},
                             "expected_completion_tokens": 400}
    data["routing"] = {"tiers": ["micro", "code", "flagship"], "tradeoff": 50}
    (folder / "code.json").write_text(json.dumps({"base": 0.70, "code": 0.15, "hard": -0.50}))
    policy = folder / "three.yaml"
    policy.write_text(yaml.safe_dump(data, sort_keys=False))
    return registry


def test_three_tiers_answer_from_their_own_engines(shared_engines: SharedEngines, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(REGISTRY_ENV, str(_three_pools(shared_engines, tmp_path)))
    fake = fake_the_map(monkeypatch)
    settings = Settings(policy_path=tmp_path / "three.yaml", scorer="length", start_engines=False, ledger="memory",
                        home=tmp_path, policy_watch_interval_s=0)
    with serve(create_app(settings)) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
        answered = {}
        for text in ("hi, how are you today?", "write a python function that sorts a list",
                     "prove that the square root of two is irrational"):
            raw = client.chat.completions.with_raw_response.create(
                model="auto", messages=[{"role": "user", "content": text}], max_tokens=8)
            completion = raw.parse()
            assert completion.usage is not None and completion.usage.completion_tokens > 0  # an engine answered
            answered[raw.headers["x-cascade-pool"]] = (completion.model, raw.headers["x-cascade-route"],
                                                       raw.headers["x-cascade-tiers"])
    assert {pool: (model, route) for pool, (model, route, _) in answered.items()} == {
        "micro": ("micro", "trade:micro"), "code": ("micro", "trade:code"), "flagship": ("flagship", "trade:flagship")}
    assert all(tiers.count("=") == 3 for _, _, tiers in answered.values())
    assert fake.rows == 3  # one prediction per routed request, on the row the scorer kept
