"""The in-domain figure end to end: a real gateway with the shipped artifact and its domain reference, real prompts
of the public sources, the real Redis ledger. Each answer's header, its cost record, the rollups, `/metrics` and
the cost report carry the same figures."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import httpx
import pytest

from gateway.api.app import create_app
from gateway.costs.quality import with_quality
from gateway.settings import Settings
from loadtest.scenarios.chaos_figures import ledger_records
from policies.loader import load_policy
from router_models.training.outcomes import DEFAULT_ROUTING_DIR, load_outcomes
from tests.conftest import SHARED_URL, delete_prefix, report_recent
from tests.servers import serve


@pytest.mark.redis
@pytest.mark.skipif(not DEFAULT_ROUTING_DIR.is_dir(),
                    reason=f"shared routing data not found at {DEFAULT_ROUTING_DIR} (set CASCADE_ROUTING_DATA)")
def test_header_record_rollups_metrics_and_report_agree(
        policy_file: Path, upstreams: tuple[object, str, object, str], tmp_path: Path) -> None:
    prefix = f"test:{uuid.uuid4().hex[:8]}:"
    prompts = [ex.text for ex in load_outcomes(max_per_source=2)]
    settings = Settings(policy_path=policy_file, scorer="classifier", start_engines=False, ledger="redis",
                        redis_prefix=prefix, policy_watch_interval_s=0, home=tmp_path)
    try:
        with serve(create_app(settings)) as url:
            headers = []
            for text in prompts:
                reply = httpx.post(f"{url}/v1/chat/completions", timeout=30, json={
                    "model": "auto", "messages": [{"role": "user", "content": text}]})
                assert reply.status_code == 200, reply.text
                headers.append(reply.headers)
            metrics = httpx.get(f"{url}/metrics", timeout=10).text
        figures = {h["x-request-id"]: float(h["x-cascade-in-domain"]) for h in headers}
        assert all(0.0 <= f <= 1.0 for f in figures.values()) and len(set(figures.values())) > 1
        records = ledger_records(SHARED_URL, prefix)
        assert {r["request_id"]: float(r["in_domain"]) for r in records} == figures
        count = next(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                     if line.startswith("cascade_router_in_domain_count{"))
        assert count == len(prompts)
        report = asyncio.run(report_recent(prefix))
        total = report.total().counters
        below = sum(f < 0.3 for f in figures.values())
        assert (total.in_domain_scored, total.in_domain_below(0.3)) == (len(prompts), below)
        quality = with_quality(report, load_policy(policy_file).policy).quality
        assert quality is not None and quality.domain is not None and quality.domain.below == below
        assert any(f"of {len(prompts)} scored requests have an in-domain figure below 0.3" in line
                   for line in quality.lines())
    finally:
        delete_prefix(prefix)
