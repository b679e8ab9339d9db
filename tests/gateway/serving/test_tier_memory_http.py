"""Labels per pool served end to end: a real gateway (uvicorn) with the shipped classifier and pool map, three fake
upstreams and a shared label memory written by `cascade router memory add`'s code, whose one label says the code
pool answered a prompt badly. Asked that prompt, the gateway lowers the code tier's predicted quality alone, and
`x-cascade-tiers`, the router version and the cost record carry the move.

The label is written here: it shows that a label reaches its pool's prediction, never which pool is better."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from gateway.api.app import create_app
from gateway.ledger.store import MemoryLedger
from gateway.settings import Settings
from loadtest.fake_upstream import FakeUpstream
from policies.tiers import parse_estimates
from router_models.serving.artifact import DEFAULT_ARTIFACT
from router_models.training.labels import label_rows
from router_models.training.memory_build import add_label_rows
from tests.conftest import cascade_home
from tests.gateway.serving.test_tiers_http import _ask, _policy, _record
from tests.servers import serve, until

PROMPT = "Write a Python function that merges two sorted lists."


def test_a_label_of_the_code_pool_moves_the_code_tier_alone_and_every_record_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CASCADE_HOME", str(cascade_home(tmp_path)))
    monkeypatch.setenv("CASCADE_ROUTER_ARTIFACT", str(DEFAULT_ARTIFACT))
    rows = label_rows([{"prompt": PROMPT, "pools": {"code": 0}}])
    add_label_rows(rows, tmp_path / "router" / "memory" / "shared.json", DEFAULT_ARTIFACT)
    upstreams = {name: FakeUpstream(f"{name}-model") for name in ("general", "code", "flagship")}
    with serve(upstreams["general"]) as g, serve(upstreams["code"]) as c, serve(upstreams["flagship"]) as f:
        policy = tmp_path / "three.yaml"
        policy.write_text(_policy({"general": g, "code": c, "flagship": f}, "routerbench/meta/code-llama-instruct-34b-"
                                  "chat").replace("general-7b", "routerbench/mistralai/mistral-7b-chat").replace(
            "placement: frontier", "placement: routerbench/gpt-4-1106-preview")
            + "learning:\n  label_memory:\n    scope: shared\n")
        settings = Settings(policy_path=policy, scorer="classifier", start_engines=False, ledger="memory",
                            home=tmp_path, policy_watch_interval_s=0)
        app = create_app(settings)
        with serve(app) as url:
            client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
            until(lambda: app.state.runtime.memories.labels("shared") == 1, timeout=30)
            headers, _ = _ask(client, PROMPT)
            ledger = app.state.runtime.ledger
            assert isinstance(ledger, MemoryLedger)
            record = _record(ledger, headers["x-request-id"])
    estimates = {e.pool: e for e in parse_estimates(headers["x-cascade-tiers"])}
    assert estimates["code"].memory < -0.05  # the label's own prompt: the code tier falls
    assert estimates["general"].memory == 0.0 and estimates["flagship"].memory == 0.0  # no label of theirs
    assert headers["x-cascade-router-version"].endswith("+memory/shared@1")
    assert record.tiers == headers["x-cascade-tiers"]
