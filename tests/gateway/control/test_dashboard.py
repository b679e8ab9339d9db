"""The shipped Grafana dashboard references only metrics the gateway really exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

from backends.clients.pool import Pool
from gateway.control.adaptation.live_threshold import start_live_threshold
from gateway.control.policy.policy_file import PolicyFile
from gateway.ledger.store import CostRecord
from gateway.telemetry.metrics import GatewayMetrics
from policies.context import AUTO_MODEL, RouteContext
from policies.decide import RouteDecision
from policies.loader import load_policy

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = ROOT / "deploy" / "grafana" / "cascade-dashboard.json"


async def _exported() -> set[str]:
    """Sample names of a metrics registry after one of everything has been observed."""
    metrics = GatewayMetrics(lambda: {"micro": Pool("micro", ["http://127.0.0.1:1"], None)})  # type: ignore[arg-type]
    loaded = load_policy(ROOT / "policies" / "default.yaml")
    policy = loaded.policy  # a flagship_share threshold: every routing gauge
    PolicyFile(lambda: loaded).attach(metrics)  # the reload counter and the policy file's gauges
    live = start_live_threshold(None, "t:", lambda: policy, metrics)
    for i in range(policy.routing.threshold.min_samples):  # type: ignore[union-attr]
        ctx = RouteContext(tenant="t", requested_model=AUTO_MODEL, prompt_text="")
        live.observe(policy, ctx, RouteDecision("micro", "m", i / 1000, "threshold", "", "v"))
    await live.refresh()
    await live.aclose()
    metrics.observe_record(CostRecord("r", "t", "micro", "m", 1, 1, 1, 2, "threshold", "v", 1.8e9, 5.0, 9.0))
    metrics.itl.labels("micro", "0a1b2c3d").observe(0.01)
    metrics.first_byte.labels("micro", "0a1b2c3d").observe(0.1)
    metrics.limiter_decisions.labels("t", "admitted").inc()
    metrics.ledger_event("lost")
    metrics.loop_lag.observe(0.001)
    metrics.scoring.observe(0.001)
    metrics.overhead.observe(0.001)
    metrics.budget.labels("t", "soft").inc()
    metrics.ladder_changed({"step"}, set())
    text = metrics.render().decode()
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}


async def test_every_dashboard_query_uses_an_exported_metric() -> None:
    board = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"\bcascade_[a-z_]+", e)}
    exported = await _exported()
    assert used, "dashboard has no queries"
    missing = used - exported
    assert not missing, f"dashboard uses metrics the gateway does not export: {sorted(missing)}"
    assert len(board["panels"]) >= 10
