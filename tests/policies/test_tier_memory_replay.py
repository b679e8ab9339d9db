"""A label memory's move shifts a tiers trade consistently (`policies.tiers.remembered`), its labels per pool move each
tier alone (`moved`), the cost record's tier predictions read back with each tier's move (`parse_estimates`), and
`policies.replay` decides a tiers policy by the trade on the predictions a log line carries, at the policy's
tradeoff or the one holding its cost target on the log.

The predictions and prices are made up to make routing visible; they back no quality claim."""

from __future__ import annotations

import json

import pytest

from policies.loader import LoadedPolicy, parse_policy
from policies.replay import LogError, parse_log, render_replay, replay
from policies.tiers import TierEstimate, choose, estimates_text, moved, parse_estimates, remembered

POOLS = """
pools:
  general: {type: remote, urls: ["http://g"], model: g, placement: g.json,
            price: {input_per_mtok: "0.20", output_per_mtok: "0.20"}}
  code: {type: remote, urls: ["http://c"], model: c, placement: c.json,
         price: {input_per_mtok: "0.80", output_per_mtok: "0.80"}}
  flagship: {type: remote, urls: ["http://f"], model: f, placement: f.json,
             price: {input_per_mtok: "10.00", output_per_mtok: "30.00"}}
"""
ROW = (TierEstimate("general", 0.60, 0.0001), TierEstimate("code", 0.70, 0.0004), TierEstimate("flagship", 0.90, 0.01))


def _policy(routing: str) -> LoadedPolicy:
    return parse_policy(f"version: 1\n{POOLS}routing:\n  tiers: [general, code, flagship]\n  {routing}\n",
                        "three.yaml")


def test_a_memorys_move_lowers_the_bottom_tier_raises_the_top_and_keeps_the_middle() -> None:
    moved = remembered(ROW, 0.05)
    assert [e.quality for e in moved] == pytest.approx([0.55, 0.70, 0.95])
    assert [e.cost_usd for e in moved] == [e.cost_usd for e in ROW]
    assert remembered(ROW, 0.0) == ROW and remembered(ROW[:1], 0.3) == ROW[:1]
    assert [e.quality for e in remembered(ROW, -0.7)] == pytest.approx([1.0, 0.70, 0.2])  # kept in [0, 1]
    two = remembered((ROW[0], ROW[2]), 0.1)  # two tiers: the gap moves by twice the move, as the score's target
    assert two[1].quality - two[0].quality == pytest.approx(ROW[2].quality - ROW[0].quality + 0.2)


def test_labels_per_pool_move_each_tier_alone_and_the_record_carries_each_move() -> None:
    row = moved(ROW, [0.0, -0.2, 0.0])
    assert [e.quality for e in row] == pytest.approx([0.60, 0.50, 0.90])
    assert row[0] is ROW[0] and row[2] is ROW[2] and row[1].memory == pytest.approx(-0.2)
    text = estimates_text(row)
    assert text == "general=0.600/$0.000100, code=0.500/$0.000400 (memory -0.200), flagship=0.900/$0.010000"
    assert [(e.pool, round(e.quality, 3), round(e.memory, 3)) for e in parse_estimates(text)] == \
        [("general", 0.6, 0.0), ("code", 0.5, -0.2), ("flagship", 0.9, 0.0)]
    top = moved(ROW, [0.5, 0.0, 0.0])[0]  # kept in [0, 1]: the move recorded is the one made
    assert top.quality == 1.0 and top.memory == pytest.approx(0.4)
    assert remembered(ROW, 0.05)[0].memory == pytest.approx(-0.05)  # a gap move is recorded as well
    with pytest.raises(ValueError, match="1 memory moves for 3 tiers"):
        moved(ROW, [0.1])
    with pytest.raises(ValueError, match="is not pool=quality"):
        parse_estimates("code=0.500/$0.000400 (memory -0.200")


@pytest.mark.parametrize("tradeoff", [0.0, 10.0, 30.0, 100.0, 1000.0])
def test_a_move_towards_needing_more_never_picks_a_cheaper_tier(tradeoff: float) -> None:
    order = [e.pool for e in ROW]
    picks = [order.index(choose(remembered(ROW, gap / 100), tradeoff).pool) for gap in range(-40, 41)]
    assert picks == sorted(picks)


def test_the_records_tier_predictions_read_back_and_bad_ones_are_refused() -> None:
    text = estimates_text(ROW)
    assert [(e.pool, round(e.quality, 3), round(e.cost_usd, 6)) for e in parse_estimates(text)] == \
        [(e.pool, e.quality, e.cost_usd) for e in ROW]
    assert parse_estimates("") == ()
    for bad in ("general=1.5/$0.1", "general=0.5", "=0.5/$0.1", "general=0.5/$-1"):
        with pytest.raises(ValueError, match="is not pool=quality/\\$cost"):
            parse_estimates(bad)


def _line(score: float, tiers: str, pool: str = "general") -> str:
    return json.dumps({"request": {"model": "auto", "messages": [{"role": "user", "content": "hello there"}]},
                       "tenant": "acme", "score": score, "pool": pool, "prompt_tokens": 100,
                       "completion_tokens": 50, "tiers": tiers})


def test_replay_decides_a_tiers_policy_by_the_trade_on_the_recorded_predictions() -> None:
    recorded = estimates_text(ROW)
    entries = parse_log([_line(0.1, recorded), _line(0.9, ""), _line(0.1, "general=0.100/$0.000100")])
    result = replay(entries, _policy("tradeoff: 0"))
    # the first: best predicted quality (a score split would keep 0.1 on the bottom tier); the second has no
    # prediction and splits by score; the third lacks two tiers' predictions and splits by score too
    assert result.moves == {("general", "flagship"): 2, ("general", "general"): 1}
    assert (result.traded, result.tradeoff) == (1, 0.0)
    assert "1 requests decided by the trade on their recorded tier predictions (tradeoff 0" in \
        "\n".join(render_replay(result, "recorded", "three.yaml"))
    cheap = replay(entries[:1], _policy("tradeoff: 1000000"))  # quality is worth little against cost: the bottom
    assert cheap.moves == {("general", "general"): 1}


def test_replay_holds_a_cost_target_over_the_logs_predictions() -> None:
    lines = [_line(0.5, estimates_text(remembered(ROW, gap / 100))) for gap in range(0, 41)]
    entries = parse_log(lines)
    loose = replay(entries, _policy('cost_per_1k: "100.00"'))  # every request may take the flagship
    assert loose.tradeoff == 0.0 and loose.moves == {("general", "flagship"): len(lines)}
    tight = replay(entries, _policy('cost_per_1k: "1.00"'))
    assert tight.tradeoff is not None and tight.tradeoff > 0
    assert tight.candidate_micro_usd < loose.candidate_micro_usd and tight.traded == len(lines)


def test_a_bad_tier_prediction_in_the_log_names_its_line() -> None:
    with pytest.raises(LogError, match=r"<log>:2: tier prediction 'general=2/\$0.1'"):
        parse_log([_line(0.1, ""), _line(0.1, "general=2/$0.1")])
