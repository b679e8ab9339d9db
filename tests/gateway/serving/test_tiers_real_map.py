"""A three-pool policy served with the real pool map: the trained classifier scorer (its feature row), the shipped
map and shared-model placements, three fake upstreams, the official openai SDK. Each tier's predicted quality in
`x-cascade-tiers` is the one `cascade router route` predicts offline for the same prompt, and the request goes to
the tier that route picks at the same tradeoff."""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest

from gateway.api.app import create_app
from gateway.cli.main import main
from gateway.settings import Settings
from loadtest.fake_upstream import FakeUpstream
from tests.servers import serve

PROMPTS = ("hi, how are you today?", "Write a Python function that merges overlapping intervals, with unit tests.",
           "Prove that there are infinitely many primes of the form 4k+3.")


def _policy(urls: dict[str, str]) -> str:
    pools = {"general": ("mistralai/mistral-7b-chat", "0.20"), "code": ("meta/code-llama-instruct-34b-chat", "0.78"),
             "flagship": ("routerbench/gpt-4-1106-preview", "10.00")}
    text = "version: 1\npools:\n"
    for name, (placement, price) in pools.items():
        text += (f"  {name}:\n    type: remote\n    urls: [\"{urls[name]}\"]\n    model: {name}-model\n"
                 f"    placement: {placement}\n"
                 f"    price: {{input_per_mtok: \"{price}\", output_per_mtok: \"{price}\"}}\n")
    return text + "routing:\n  tiers: [general, code, flagship]\n  tradeoff: 200\n"


def _tiers(header: str) -> dict[str, float]:
    return {item.split("=")[0]: float(item.split("=")[1].split("/")[0]) for item in header.split(", ")}


def test_the_gateway_routes_on_the_real_map_as_route_does(tmp_path: Path) -> None:
    upstreams = {name: FakeUpstream(f"{name}-model") for name in ("general", "code", "flagship")}
    with serve(upstreams["general"]) as g, serve(upstreams["code"]) as c, serve(upstreams["flagship"]) as f:
        policy = tmp_path / "three.yaml"
        policy.write_text(_policy({"general": g, "code": c, "flagship": f}))
        prompts = tmp_path / "prompts.jsonl"
        prompts.write_text("".join(json.dumps({"id": i, "prompt": p}) + "\n" for i, p in enumerate(PROMPTS)))
        assert main(["router", "route", "--policy", str(policy), "--in", str(prompts), "--out",
                     str(tmp_path / "routes.jsonl"), "--tradeoff", "200"]) == 0
        offline = [json.loads(line) for line in (tmp_path / "routes.jsonl").read_text().splitlines()]
        settings = Settings(policy_path=policy, scorer="classifier", start_engines=False, ledger="memory",
                            home=tmp_path, policy_watch_interval_s=0)
        with serve(create_app(settings)) as url:
            client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
            for text, row in zip(PROMPTS, offline, strict=True):
                raw = client.chat.completions.with_raw_response.create(
                    model="auto", messages=[{"role": "user", "content": text}], max_tokens=8)
                predicted = _tiers(raw.headers["x-cascade-tiers"])
                assert predicted == pytest.approx(row["predicted"], abs=6e-4)  # the header rounds to 3 places
                assert raw.headers["x-cascade-route"] == f"trade:{row['pool']}"
