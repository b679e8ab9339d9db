"""The cost report states the rate each pool's cost was derived from, and the flagship counterfactual prices a
request's own prompt and completion tokens at the flagship's split rates."""

from __future__ import annotations

import json
import time
from datetime import date
from html import escape
from pathlib import Path

import pytest

from gateway.costs.formats import render_json
from gateway.costs.html import render_html
from gateway.costs.prices import PoolRate, price_basis
from gateway.costs.report import Cell, CostReport, Counters
from gateway.costs.view import render_text
from gateway.ledger.store import MemoryLedger
from gateway.serving.openai.usage import Usage
from gateway.serving.records.accounting import Accountant, RequestFacts
from policies.decide import RouteDecision
from policies.loader import load_policy
from policies.money import Price
from tests.gateway.costs.test_costs_report import run_cli, write_records
from tests.gateway.ledger.test_ledger import DAY0, make_record

ROOT = Path(__file__).resolve().parents[3]
GPU = ROOT / "policies" / "gpu.yaml"
MICRO_LINE = ("micro: $2.50/GPU-h, prefill 24,000 tok/s -> $0.0289/M prompt tokens, decode 2,400 tok/s -> "
              "$0.289/M completion tokens")


def _price(**fields: object) -> Price:
    return Price.model_validate(fields)


def test_each_form_is_stated_with_what_it_was_derived_from() -> None:
    split = _price(gpu_hour_usd="1.00", prefill_tokens_per_second=4000, decode_tokens_per_second=100)
    assert PoolRate("micro", split).line() == ("micro: $1.00/GPU-h, prefill 4,000 tok/s -> $0.0694/M prompt tokens, "
                                               "decode 100 tok/s -> $2.78/M completion tokens")
    flat = _price(gpu_hour_usd="2.50", tokens_per_second=1500)
    assert PoolRate("fp8", flat).line() == ("fp8: $2.50/GPU-h at 1,500 tok/s, prompt and completion alike (the "
                                            "single tokens_per_second) -> $0.463/M tokens")
    listed = _price(input_per_mtok="3.00", output_per_mtok="15.00")
    assert PoolRate("flagship", listed, flagship=True).line() == (
        "flagship: $3.00/M prompt tokens, $15.00/M completion tokens (per-token price) [flagship: the savings "
        "column prices the same tokens at these rates]")
    assert PoolRate("gone", None).line() == "gone: not in the policy, price unknown"
    fields = PoolRate("micro", split).fields()
    assert (fields["form"], fields["prompt_micro_usd_per_mtok"], fields["completion_micro_usd_per_mtok"]) == (
        "gpu_hour", 69_444, 2_777_778)


def _report() -> CostReport:
    cells = (Cell("2026-01-01", "acme", "micro", "qwen", Counters(3, 9_000, 300, 900, 8_000)),
             Cell("2026-01-01", "acme", "retired", "old", Counters(1, 10, 10, 5, 50)))
    return CostReport(date(2026, 1, 1), date(2026, 1, 1), cells)


def test_the_table_json_and_html_state_the_rates_under_the_figures() -> None:
    report = _report().with_prices(load_policy(GPU).policy, "policies/gpu.yaml")
    table = render_text(report, "pool", wide=True).splitlines()
    below = table[next(i for i, line in enumerate(table) if line.startswith("TOTAL")) + 1:]
    assert below[4].startswith("prices the costs were derived from (policy policies/gpu.yaml;")
    assert below[5:8] == [f"  {MICRO_LINE}", "  retired: not in the policy, price unknown",
                          "  flagship: $5.00/GPU-h, prefill 16,000 tok/s -> $0.0868/M prompt tokens, decode 1,800 "
                          "tok/s -> $0.772/M completion tokens [flagship: the savings column prices the same tokens "
                          "at these rates]"]
    doc = json.loads(render_json(report, "pool"))
    pools = {p["pool"]: p for p in doc["prices"]["pools"]}
    assert pools["flagship"]["flagship"] and pools["flagship"]["prompt_micro_usd_per_mtok"] == 86_806
    assert pools["micro"]["prefill_tokens_per_second"] == 24_000 and pools["retired"]["form"] is None
    page = render_html(report, "pool")
    assert "<h2>Prices</h2>" in page and escape(MICRO_LINE) in page


def test_the_flagship_counterfactual_uses_the_flagships_split_rates() -> None:
    policy = load_policy(GPU).policy
    accountant = Accountant(MemoryLedger())
    decision = RouteDecision("micro", "qwen2.5-7b-instruct", 0.1, "score", "easy", "v1")
    facts = RequestFacts("r1", "acme", decision, DAY0, time.monotonic(), None, "ok")
    rec = accountant.cost_record(policy, facts, Usage(8_000, 100))  # a long prompt, a short answer
    assert rec.cost_micro_usd == (8_000 * 28_935 + 100 * 289_352 + 500_000) // 1_000_000 == 260
    assert rec.flagship_cost_micro_usd == (8_000 * 86_806 + 100 * 771_605 + 500_000) // 1_000_000 == 772
    flat_flagship = _price(gpu_hour_usd="5.00", tokens_per_second=1800)  # the flagship's old price
    assert flat_flagship.cost_micro_usd(8_000, 100) == 6_250  # the savings it claimed: 8x what this request saves
    assert price_basis(["micro"], policy, "gpu.yaml").rates[-1].flagship


@pytest.mark.redis
def test_the_cli_report_states_the_policys_rates(prefix: str, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    write_records(prefix, tmp_path / "outbox", [make_record(i) for i in range(8)])
    argv = ["costs", "report", "--from", "2026-01-01", "--to", "2026-01-02", "--by", "pool", "--prefix", prefix]
    assert run_cli(*argv, "--policy", str(GPU), "--wide") == 0
    out = capsys.readouterr().out
    assert f"prices the costs were derived from (policy {GPU};" in out and f"  {MICRO_LINE}\n" in out
    broken = tmp_path / "broken.yaml"
    broken.write_text(GPU.read_text().replace("prefill_tokens_per_second: 24000, ", "", 1))
    assert run_cli(*argv, "--policy", str(broken), "--wide") == 0  # the report itself still comes out
    out = capsys.readouterr().out
    assert "prices unavailable (policy refused: " in out and "give both prefill_tokens_per_second" in out
