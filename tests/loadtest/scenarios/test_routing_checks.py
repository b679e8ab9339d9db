"""The load scenarios route as the shipped policies do, and a routed run that did not route fails.

The scenarios' policies carry the shipped `routing:` block (a share-based threshold); each phase of a run with
model `auto` is checked for a realised flagship share strictly between 0 and 1, and a pinned run is not. Run
for real: fake engines, an in-process gateway scoring with the shipped fast classifier, two seconds of load
through `run_scenario`. With the fixed `threshold: 0.5` the scenarios used to write, the same run sends every
request to micro (the calibrated scores stay below it) and its check fails with the reason."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.api.app import create_app
from gateway.settings import Settings
from loadtest.fake_upstream import FakeUpstream
from loadtest.load.generator import LoadConfig, TenantKey
from loadtest.load.phases import Phase
from loadtest.load.prompt_mix import DEFAULT_MIX, parse_mix
from loadtest.scenarios.checks import ROUTED_MODEL, routing_checks
from loadtest.scenarios.cli import run_scenario
from loadtest.scenarios.fake_engines import GOLD_KEY, SHIPPED_POLICY, ShedStep, fake_policy, shipped_routing
from policies.loader import parse_policy
from router_models.serving.artifact import DEFAULT_ARTIFACT
from tests.servers import serve

FAST_ARTIFACT = DEFAULT_ARTIFACT.with_name("complexity-router-static.json")
STEPS = [ShedStep("micro-queue", "queue_depth", "micro", enter=50, exit=10)]


def _phase(ok: int, shares: dict[str, float]) -> dict[str, Any]:
    return {"ok": ok, "pool_share": shares}


def test_a_phase_that_sent_everything_to_one_pool_fails_unless_the_run_pinned_a_pool() -> None:
    summary = {"phases": {"steady": _phase(40, {"flagship": 0.3, "micro": 0.7}), "surge": _phase(90, {"micro": 1.0}),
                          "recover": _phase(30, {"flagship": 1.0}), "after": _phase(0, {})}}
    checks = {c.name: c for c in routing_checks(summary, ROUTED_MODEL)}
    assert [checks[p].ok for p in ("steady routed", "surge routed", "recover routed", "after routed")] == [
        True, False, False, None]
    assert checks["steady routed"].detail == "flagship share 30% of 40 answered requests"
    assert "sent every request of this phase to micro" in checks["surge routed"].detail
    assert "sent every request of this phase to the flagship" in checks["recover routed"].detail
    assert routing_checks(summary, "micro") == []  # pinned on purpose: nothing to check


def test_the_scenario_policies_carry_the_shipped_routing_block() -> None:
    shipped = parse_policy(SHIPPED_POLICY.read_text()).policy.routing
    fake = parse_policy(fake_policy(["http://127.0.0.1:1"], ["http://127.0.0.1:2"], STEPS)).policy.routing
    assert fake == shipped and yaml.safe_load(shipped_routing())["routing"]["threshold"] != 0.5


def test_a_block_naming_other_pools_is_refused(tmp_path: Path) -> None:
    other = tmp_path / "p.yaml"
    other.write_text("version: 1\nrouting:\n  micro_pool: small\n  flagship_pool: big\n  threshold: 0.4\n")
    with pytest.raises(ValueError, match="routing block names small and big"):
        shipped_routing(other)


def _routed_run(tmp_path: Path, policy_text: str) -> dict[str, Any]:
    micro, flagship = FakeUpstream("micro-model"), FakeUpstream("flagship-model")
    with serve(micro) as micro_url, serve(flagship) as flagship_url:
        policy = tmp_path / "policy.yaml"
        policy.write_text(policy_text.replace("MICRO", micro_url).replace("FLAGSHIP", flagship_url))
        settings = Settings(policy_path=policy, scorer="classifier", router_artifact=FAST_ARTIFACT,
                            start_engines=False, ledger="memory", probe_interval_s=0.1)
        with serve(create_app(settings)) as url:
            config = LoadConfig(base_url=url, model=ROUTED_MODEL, phases=[Phase("steady", 2.0, 30, 30)],
                                mix=parse_mix(DEFAULT_MIX), tenants=[TenantKey("gold", GOLD_KEY)], max_tokens=4,
                                seed=0, progress=False)
            return run_scenario("steady", config, tmp_path / "results")


def test_a_routed_scenario_routes_with_the_shipped_block_and_fails_with_a_fixed_cut_above_the_scores(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    text = fake_policy(["MICRO"], ["FLAGSHIP"], STEPS)
    (check,) = _routed_run(tmp_path, text)["checks"]
    assert check["ok"] is True, check

    old = text.replace(shipped_routing(), "routing:\n  micro_pool: micro\n  flagship_pool: flagship\n"
                       "  threshold: 0.5\n")
    assert old != text
    (check,) = _routed_run(tmp_path, old)["checks"]
    assert check["ok"] is False and "sent every request of this phase to micro" in check["detail"], check
