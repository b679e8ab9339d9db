"""The cost report per pool of a tiers policy: records carrying every tier's prediction, written through
RedisLedger to the shared Redis (unique key prefix, cleaned up), give per pool the spend, the savings against the
most capable tier (the flagship counterfactual) and the quality kept on the same map; the rollups reconcile with
the stream."""

from __future__ import annotations

from pathlib import Path

from gateway.costs.report import row_fields
from gateway.costs.view import render_text
from gateway.ledger.record import record_from_fields, record_to_fields, tier_counters
from gateway.ledger.store import CostRecord
from tests.gateway.costs.test_costs_report import DAY0
from tests.gateway.costs.test_report_endpoints import _written
from tests.gateway.ledger.test_ledger import make_record, sums

TIERS = ("general=0.700/$0.000050, code=0.800/$0.000300, flagship=0.950/$0.007000",
         "general=0.300/$0.000050, code=0.850/$0.000300, flagship=0.950/$0.007000")


def _records() -> list[CostRecord]:
    """60 requests: a third on each tier, every one with a prediction; one escalated probe that must not count."""
    pools = ("general", "code", "flagship")
    recs = [make_record(i, started_at=DAY0 + 600.0 * i + 1.0, pool=pools[i % 3], model=pools[i % 3],
                        tiers=TIERS[i % 2]) for i in range(60)]
    return [*recs, make_record(99, started_at=DAY0 + 7.0, pool="general", tiers=TIERS[0], status="escalated",
                               flagship_cost_micro_usd=0)]


def test_a_record_counts_its_pools_predicted_quality_and_the_top_tiers() -> None:
    rec = make_record(1, pool="code", tiers=TIERS[1])
    assert tier_counters(rec) == (1, 850, 950)
    assert tier_counters(make_record(1, pool="other", tiers=TIERS[1])) == (0, 0, 0)  # no prediction for its pool
    assert tier_counters(make_record(1, pool="code")) == (0, 0, 0)  # no tiers
    assert record_from_fields(record_to_fields(rec)).tiers == TIERS[1]  # the stream and the outbox keep it
    moved = make_record(1, pool="code", tiers="general=0.300/$0.000050, code=0.750/$0.000300 (memory -0.100), "
                                              "flagship=0.950/$0.007000")
    assert tier_counters(moved) == (1, 750, 950)  # a label memory's move rides along: the moved quality counts
    assert record_from_fields(record_to_fields(moved)).tiers == moved.tiers


def test_the_report_gives_per_pool_spend_savings_and_quality_kept(prefix: str, tmp_path: Path) -> None:
    recs = _records()
    report, reconciled = _written(prefix, tmp_path, recs)
    assert reconciled  # the record script's tier counters match the ones recomputed from the stream
    rows = {row.key: row_fields(row, report.pools) for row in report.rows("pool")}
    for pool in ("general", "code", "flagship"):
        mine = [r for r in recs if r.pool == pool]
        expected = sums(mine)
        row = rows[pool]
        assert (row["cost_micro_usd"], row["savings_micro_usd"]) == (expected.cost_micro_usd,
                                                                     expected.savings_micro_usd)
        assert row["tier_predicted"] == sum(r.status == "ok" for r in mine)
    # general: half at 0.700 and half at 0.300 of the flagship's 0.950 on the same requests
    assert rows["general"]["quality_kept"] == "52.6%"
    assert rows["code"]["quality_kept"] == "86.8%"  # (0.800 + 0.850) / (2 x 0.950)
    assert rows["flagship"]["quality_kept"] == "100.0%"
    assert "quality kept" in render_text(report, "pool")
