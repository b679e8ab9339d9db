"""`cascade policy validate` and `explain` on a tiers policy: a placement file that cannot be loaded is named with
its line; explain prints every tier's quality, expected cost and trade (qualities given with --quality), and
refuses a negative --tradeoff or a missing tier's quality; against the gateways' Redis it trades with the tradeoff
they hold, and says where it came from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis

from gateway.control.adaptation.live_tradeoff import entry_of, trades_key
from policies.tiers import TierEstimate
from tests.conftest import SHARED_URL
from tests.gateway.cli.test_policy_cli import run
from tests.gateway.serving.tier_fakes import fake_the_map
from tests.policies.test_tiers import POOLS


@pytest.fixture
def policy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    fake_the_map(monkeypatch)
    for name in ("g", "c", "f"):
        (tmp_path / f"{name}.json").write_text(json.dumps({"base": 0.5, "code": 0.0, "hard": 0.0}))
    path = tmp_path / "three.yaml"
    path.write_text(f"version: 1\n{POOLS}routing:\n  tiers: [general, code, flagship]\n  tradeoff: 100\n")
    return path


def test_validate_names_a_placement_that_cannot_be_loaded(policy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run("validate", str(policy)) == 0
    (policy.parent / "c.json").unlink()
    assert run("validate", str(policy)) == 1
    err = capsys.readouterr().err
    assert f"{policy}:6: pools.code.placement: cannot load placement 'c.json': No such file or directory" in err


def test_explain_prints_every_tier_and_the_trade(policy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = run("explain", str(policy), "--prompt", "hello", "--score", "0.3",
               "--quality", "general=0.6,code=0.8,flagship=0.95")
    out = capsys.readouterr().out
    assert code == 0, out
    assert "decision: pool 'code' (model 'c'), rule 'trade'" in out
    assert "  code: quality 0.800, expected $0.000322, trade 0.7678  <- the trade" in out
    assert run("explain", str(policy), "--prompt", "hello", "--score", "0.3", "--tradeoff", "0",
               "--quality", "general=0.6,code=0.8,flagship=0.95") == 0
    assert "decision: pool 'flagship'" in capsys.readouterr().out  # 0: the best predicted quality


def test_explain_refuses_a_negative_tradeoff_and_a_missing_quality(policy: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert run("explain", str(policy), "--prompt", "hello", "--score", "0.3", "--tradeoff", "-1",
               "--quality", "general=0.6,code=0.8,flagship=0.95") == 1
    assert "--tradeoff -1.0 is negative" in capsys.readouterr().err
    assert run("explain", str(policy), "--prompt", "hello", "--score", "0.3", "--quality", "general=0.6") == 1
    assert "no quality for tier(s) ['code', 'flagship']" in capsys.readouterr().err


@pytest.mark.redis
def test_explain_trades_with_the_tradeoff_the_gateways_hold(policy: Path, prefix: str,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    policy.write_text(policy.read_text().replace("tradeoff: 100", "cost_per_1k: '2.00'"))
    args = ("explain", str(policy), "--prompt", "hello", "--score", "0.3",
            "--quality", "general=0.6,code=0.8,flagship=0.95")
    assert run(*args) == 0
    out = capsys.readouterr().out
    assert "decision: pool 'code'" in out  # alone, the flagship's ~$8 per 1k is over $2
    assert "which the gateway turns into a live tradeoff" in out and "--gateway URL" in out  # and says so
    cheap = (TierEstimate("general", 0.5, 0.00001), TierEstimate("code", 0.6, 0.0001),
             TierEstimate("flagship", 0.9, 0.0015))  # a window whose best qualities cost $1.50 per 1k: tradeoff 0
    client = redis.Redis.from_url(SHARED_URL)
    client.lpush(trades_key(prefix), *[entry_of(cheap)] * 120)
    client.close()
    assert run(*args, "--redis-url", SHARED_URL, "--prefix", prefix) == 0
    out = capsys.readouterr().out
    assert "decision: pool 'flagship'" in out, out  # traded at what the gateways hold
    assert "tradeoff in use: 0 (window-held: solved over the 120 latest trades to hold $2.00 per 1,000 requests)" \
        in out
    assert run(*args, "--redis-url", SHARED_URL, "--prefix", prefix + "none:") == 0
    out = capsys.readouterr().out
    assert "decision: pool 'code'" in out and "per-request" in out  # an empty window: each request alone
