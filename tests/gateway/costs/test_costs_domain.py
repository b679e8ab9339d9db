"""Traffic unlike the router's training data in the cost report: the share below the policy's bound, the
quality-kept range that widens with it (from the held-out sources' spread in the artifact), drifting tenants named,
in every format; and what the report says when there is nothing to say."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path

import pytest

from gateway.costs.cli import render
from gateway.costs.domain import lift_spread
from gateway.costs.quality import with_quality
from gateway.costs.report import Cell, CostReport, Counters
from policies.loader import parse_policy
from policies.schema import Policy
from router_models.serving.artifact import DEFAULT_ARTIFACT
from tests.conftest import policy_yaml

SHARES = [i / 20 for i in range(21)]
CURVE = {"flagship_share": SHARES, "pgr": [round(s + 0.5 * s * (1 - s), 4) for s in SHARES], "basis": "LOSO eval"}
# lifts over random routing (APGR - 0.5): 0.05 and 0.25 around a mean of 0.15, i.e. 1/3 and 5/3 of the mean's
EVALUATION = {"per_source": {"chat": {"apgr": 0.55}, "exam": {"apgr": 0.75}, "mid": {"apgr": 0.65}}}


def _policy(extra: str = "") -> Policy:
    return parse_policy(policy_yaml("http://127.0.0.1:9/v1", "http://127.0.0.1:9/v1", extra)).policy


def _counters(requests: int, tenths: dict[int, int]) -> Counters:
    """`requests` requests, `tenths[k]` of them with an in-domain figure in tenth k."""
    fields = {f"in_domain_t{k}": n for k, n in tenths.items()}
    return Counters(requests=requests, in_domain_scored=sum(tenths.values()), **fields)


def _report() -> CostReport:
    day = "2026-01-01"
    cells = (Cell(day, "acme", "micro", "m", _counters(70, {8: 60, 9: 10})),  # like the training data
             Cell(day, "acme", "flagship", "f", _counters(30, {5: 30})),
             Cell(day, "newco", "micro", "m", _counters(70, {0: 50, 2: 10, 7: 10})),  # 60 of 70 below 0.3
             Cell(day, "newco", "flagship", "f", _counters(30, {1: 30})))
    return CostReport(date(2026, 1, 1), date(2026, 1, 1), cells)


@pytest.fixture
def artifact(tmp_path: Path) -> Path:
    path = tmp_path / "router.json"
    path.write_text(json.dumps({"embedder": "x", "quality_curve": CURVE, "evaluation": EVALUATION}))
    return path


def test_the_lift_spread_reads_the_held_out_sources() -> None:
    low, high, note = lift_spread({"evaluation": EVALUATION}) or (0.0, 0.0, "")
    assert (low, high) == pytest.approx((1 / 3, 5 / 3))
    assert "0.550 (chat) .. 0.750 (exam)" in note
    assert lift_spread({}) is None and lift_spread({"evaluation": {"per_source": {"a": {"apgr": 0.5}}}}) is None
    shipped = lift_spread(json.loads(DEFAULT_ARTIFACT.read_text()))
    assert shipped is not None and shipped[0] < 1 < shipped[1]


def test_share_below_the_bound_widens_the_quality_range(artifact: Path) -> None:
    quality = with_quality(_report(), _policy(), artifact).quality
    assert quality is not None and quality.curve_kept is not None and quality.domain is not None
    domain = quality.domain
    assert (domain.scored, domain.below) == (200, 90)  # below 0.3: tenths 0, 1, 2
    share, kept, unlike = 0.3, quality.curve_kept, 90 / 200
    lift = kept - share
    assert domain.kept_low == pytest.approx((1 - unlike) * kept + unlike * (share + lift / 3))
    assert domain.kept_high == pytest.approx((1 - unlike) * kept + unlike * (share + lift * 5 / 3))
    assert domain.drifting == (("newco", 90, 100),)  # acme: none below, not drifting
    narrower = with_quality(_report(), _policy("learning:\n  in_domain: {bound: 0.1}\n"), artifact).quality
    assert narrower is not None and narrower.domain is not None and narrower.domain.below == 50
    assert narrower.domain.kept_high is not None and domain.kept_high is not None
    assert kept < narrower.domain.kept_high < domain.kept_high  # fewer unlike requests: a narrower range


@pytest.mark.parametrize("fmt", ["table", "html", "json", "csv"])
def test_every_format_states_the_share_the_range_and_the_drift(artifact: Path, fmt: str) -> None:
    text = render(with_quality(_report(), _policy(), artifact), "tenant", fmt)
    if fmt == "json":
        quality = json.loads(text)["quality"]
        assert quality["unlike_share"] == 0.45 and quality["in_domain_bound"] == 0.3
        assert quality["quality_kept_low"] < quality["quality_kept_pgr"] < quality["quality_kept_high"]
        assert quality["drifting_tenants"] == [{"tenant": "newco", "below": 90, "scored": 100}]
    elif fmt == "csv":
        assert "unlike_share" in text.splitlines()[0] and "quality_kept_low" in text.splitlines()[0]
    else:
        assert "45.0% of 200 scored requests have an in-domain figure below 0.3" in text
        assert "quality kept, range:" in text
        assert "newco" in text and "drifts from the training data: 90.0% of its 100" in text


def test_without_figures_or_spread_the_report_says_why(tmp_path: Path, artifact: Path) -> None:
    bare = CostReport(date(2026, 1, 1), date(2026, 1, 1), (Cell("2026-01-01", "a", "micro", "m", Counters(5)),))
    lines = with_quality(bare, _policy(), artifact).quality.lines()  # type: ignore[union-attr]
    assert any("no scored request carries one" in line and "domain build" in line for line in lines)
    no_spread = tmp_path / "old.json"
    no_spread.write_text(json.dumps({"embedder": "x", "quality_curve": CURVE}))
    lines = with_quality(_report(), _policy(), no_spread).quality.lines()  # type: ignore[union-attr]
    assert any("range unavailable (the artifact stores no per-source" in line for line in lines)
