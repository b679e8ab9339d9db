"""The quality kept beside the savings: the estimate, every report format, the CLI and GET /admin/costs."""

from __future__ import annotations

import csv
import io
import json
import time
import uuid
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from gateway.api.app import create_app
from gateway.costs.cli import render
from gateway.costs.quality import estimate_quality, label_estimate, with_quality
from gateway.costs.report import CostReport
from gateway.ledger.store import CostRecord
from gateway.settings import Settings
from policies.loader import parse_policy
from router_models.serving.artifact import DEFAULT_ARTIFACT, FAST_ARTIFACT
from router_models.training.quality_curve import QualityCurve, artifact_quality_curve
from tests.conftest import GatewayFactory, delete_prefix, policy_yaml
from tests.gateway.costs.test_costs_report import recorded, run_cli, sample_report
from tests.harness import Gateway
from tests.servers import serve

__all__ = ["recorded"]  # the fixture, used below

SHARES = [i / 20 for i in range(21)]
CURVE = {"flagship_share": SHARES, "pgr": [round(min(1.0, 1.5 * s), 4) for s in SHARES], "basis": "LOSO eval"}
POLICY = parse_policy(policy_yaml("http://127.0.0.1:9/v1", "http://127.0.0.1:9/v1")).policy


@pytest.fixture
def artifact(tmp_path: Path) -> Path:
    path = tmp_path / "router.json"
    path.write_text(json.dumps({"embedder": "x", "quality_curve": CURVE}))
    return path


def test_estimate_interpolates_at_the_realised_share() -> None:
    curve = QualityCurve(tuple(SHARES), tuple(CURVE["pgr"]), "LOSO eval")  # type: ignore[arg-type]
    est = estimate_quality({"micro": 69, "flagship": 31, "other": 50}, "micro", "flagship", curve)
    assert est.flagship_share == pytest.approx(0.31) and est.routed_requests == 100
    assert est.curve_kept == pytest.approx(0.465)
    (line,) = est.lines()
    assert line.startswith("quality kept: ~0.47 of the micro->flagship gap (router eval curve: LOSO eval, "
                           "realised flagship share 31%; pinned-model requests")
    missing = estimate_quality({"micro": 1}, "micro", "flagship", None)
    assert missing.lines() == ["quality estimate unavailable (artifact has no evaluation curve)"]


def test_requests_the_overflow_model_scored_are_weighed_at_its_curve() -> None:
    curve = QualityCurve(tuple(SHARES), tuple(CURVE["pgr"]), "LOSO eval")  # type: ignore[arg-type]
    lower = QualityCurve(tuple(SHARES), tuple(round(s, 4) for s in SHARES), "LOSO eval")
    est = estimate_quality({"micro": 60, "flagship": 40}, "micro", "flagship", curve, overflow_scored=25,
                           overflow_curve=lower)
    assert est.curve_kept == pytest.approx(0.75 * 0.6 + 0.25 * 0.4) and est.overflow_share == 0.25
    assert "25.0% scored by the router's overflow model, weighed at its curve" in est.lines()[0]
    unknown = estimate_quality({"micro": 60, "flagship": 40}, "micro", "flagship", curve, overflow_scored=25)
    assert unknown.curve_kept == pytest.approx(0.6)
    assert "counted at the primary's curve (none known)" in unknown.lines()[0]
    assert estimate_quality({"micro": 60, "flagship": 40}, "micro", "flagship", curve).lines()[0].count("%") == 1


def test_the_shipped_router_pairs_its_overflow_curve() -> None:
    """With the shipped artifact, a report whose rollups count overflow-scored requests weighs them at the
    fast artifact's curve (lower at every share: MODEL_CARD.md)."""
    base = sample_report()
    spilled = replace(base, cells=tuple(replace(c, counters=replace(c.counters, overflow_scored=c.counters.requests))
                                        for c in base.cells))
    primary, overflow = artifact_quality_curve(DEFAULT_ARTIFACT), artifact_quality_curve(FAST_ARTIFACT)
    assert primary is not None and overflow is not None
    share = 63 / 123
    kept = with_quality(spilled, POLICY, DEFAULT_ARTIFACT).quality
    assert kept is not None and kept.overflow_share == 1.0
    assert kept.curve_kept == pytest.approx(overflow.pgr_at(share))
    plain = with_quality(base, POLICY, DEFAULT_ARTIFACT).quality
    assert plain is not None and plain.curve_kept == pytest.approx(primary.pgr_at(share))
    assert plain.curve_kept is not None and kept.curve_kept is not None and plain.curve_kept > kept.curve_kept


def test_label_estimate_counts_micro_routed_labels_only() -> None:
    rows = [{"pool": "micro", "needs_flagship": 0.0}, {"pool": "micro", "needs_flagship": 1.0},
            {"pool": "micro", "needs_flagship": 0.2}, {"pool": "flagship", "needs_flagship": 1.0}]
    est = label_estimate(rows, "micro")
    assert est is not None and est.labelled == 3 and est.kept == pytest.approx(2 / 3)
    assert label_estimate(rows[3:], "micro") is None
    with_labels = estimate_quality({"micro": 1}, "micro", "flagship", None, labels=est)
    assert "labelled quality: 0.67 of 3 micro-routed labelled requests did not need the flagship" in \
        with_labels.lines()[1]


def _report(artifact: Path) -> CostReport:
    return with_quality(sample_report(), POLICY, artifact)  # 63 flagship of 123 requests: share 0.512


def test_every_format_shows_the_quality_line(artifact: Path) -> None:
    report = _report(artifact)
    kept = 1.5 * 63 / 123
    table = render(report, "tenant", "table", wide=True)  # wide: prose lines whole
    assert f"quality kept: ~{kept:.2f} of the micro->flagship gap (router eval curve: LOSO eval, realised " \
           "flagship share 51%" in table
    doc = json.loads(render(report, "tenant", "json"))
    assert doc["quality"]["quality_kept_pgr"] == pytest.approx(kept)
    assert doc["quality"]["realised_flagship_share"] == pytest.approx(63 / 123)
    rows = list(csv.DictReader(io.StringIO(render(report, "tenant", "csv"))))
    assert rows[-1]["tenant"] == "TOTAL" and float(rows[-1]["quality_kept_pgr"]) == pytest.approx(kept)
    assert rows[0]["quality_kept_pgr"] == ""
    html = render(report, "tenant", "html")
    ET.fromstring(html.split("\n", 1)[1])  # still well-formed XHTML
    assert "Quality kept by routing" in html and f"~{kept:.2f} of the micro-&gt;flagship gap" in html


def test_no_curve_and_no_policy_say_why(tmp_path: Path) -> None:
    bare = tmp_path / "bare.json"
    bare.write_text("{}")
    table = render(with_quality(sample_report(), POLICY, bare), "pool", "table")
    assert "quality estimate unavailable (artifact has no evaluation curve)" in table
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    assert "cannot read the artifact's evaluation curve" in render(with_quality(sample_report(), POLICY, broken),
                                                                   "pool", "table")
    no_policy = with_quality(sample_report(), None, policy_problem="p.yaml: bad")
    assert "no policy to tell the micro and flagship pools: p.yaml: bad" in render(no_policy, "pool", "table")


@pytest.mark.redis
def test_cli_report_shows_quality_from_the_ledger(recorded: list[CostRecord], prefix: str, tmp_path: Path,
                                                  artifact: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_yaml("http://127.0.0.1:9/v1", "http://127.0.0.1:9/v1"))
    out = tmp_path / "report.txt"
    assert run_cli("costs", "report", "--from", "2026-01-01", "--to", "2026-01-04", "--prefix", prefix,
                   "--policy", str(policy), "--artifact", str(artifact), "--out", str(out), "--wide") == 0
    flagship = sum(r.pool == "flagship" for r in recorded) / len(recorded)
    assert flagship > 0
    assert f"quality kept: ~{1.5 * flagship:.2f} of the micro->flagship gap" in out.read_text()
    assert f"realised flagship share {flagship:.0%}" in out.read_text()


@pytest.fixture
def gateway(make_gateway: GatewayFactory, fake_policy_file: Path, prefix: str) -> Gateway:
    return make_gateway(fake_policy_file, ledger="redis", redis_prefix=prefix, admin_key="k")


@pytest.mark.redis
def test_admin_cost_page_has_the_quality_section(gateway: Gateway) -> None:
    r = gateway.client.post("/v1/chat/completions", json={"model": "auto", "messages": [{"role": "user",
                                                                                         "content": "hi"}]})
    assert r.status_code == 200
    deadline = time.monotonic() + 5
    page = ""
    while time.monotonic() < deadline and "realised flagship share 0%" not in page and "unavailable" not in page:
        page = gateway.client.get("/admin/costs", headers={"authorization": "Bearer k"}).text
        time.sleep(0.1)
    assert "Quality kept by routing" in page
    assert "realised flagship share 0%" in page or "quality estimate unavailable (" in page


@pytest.mark.redis
def test_admin_cost_page_reads_the_curve_of_the_artifact_the_gateway_was_started_with(
        policy_file: Path, tmp_path: Path) -> None:
    named = tmp_path / "named-router.json"
    named.write_text(json.dumps({"embedder": "x", "quality_curve": {**CURVE, "basis": "named artifact eval"}}))
    prefix = f"test:{uuid.uuid4().hex[:8]}:"
    settings = Settings(policy_path=policy_file, scorer="length", start_engines=False, ledger="redis",
                        redis_prefix=prefix, admin_key="k", home=tmp_path, router_artifact=named)
    try:
        with serve(create_app(settings)) as url:
            body = {"model": "flagship", "messages": [{"role": "user", "content": "hi"}]}
            assert httpx.post(url + "/v1/chat/completions", json=body).status_code == 200
            deadline, page = time.monotonic() + 5, ""
            while time.monotonic() < deadline and "realised flagship share" not in page:
                page = httpx.get(url + "/admin/costs", headers={"authorization": "Bearer k"}).text
                time.sleep(0.1)
    finally:
        delete_prefix(prefix)
    assert "router eval curve: named artifact eval" in page, page
