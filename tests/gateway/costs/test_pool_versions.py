"""`cascade pool compare`: a pool's engine versions side by side from the ledger (records written by the real
`RedisLedger` into the shared Redis, feedback under the learning loop's keys); `cascade pool promote | rollback`
on a policy file: only that pool's lines change, the result validates, and a pool without a canary is refused."""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

import pytest
import redis

from gateway.cli.pool import register
from gateway.costs.versions import compare_versions, figures, render_comparison
from gateway.ledger.store import CostRecord, RedisLedger
from policies.loader import load_policy
from policies.pools import engine_version
from router_models.training.ledger_labels import LabelKeys
from tests.conftest import SHARED_URL


def _rec(i: int, version: str, *, ttft: float | None = 40.0, status: str = "ok", tokens: int = 11) -> CostRecord:
    return CostRecord(f"req-{version}-{i}", "acme", "micro", f"model-{version}", 10, tokens, 100, 1500, "pinned",
                      "p1", time.time() - 60, ttft, 140.0, status, pool_version=version)


def test_figures_per_version() -> None:
    records = [_rec(i, "aaaa1111") for i in range(18)] + [_rec(18, "aaaa1111", status="upstream_error"),
                                                          _rec(19, "aaaa1111", status="escalated")]
    records += [_rec(i, "bbbb2222", ttft=90.0) for i in range(5)]
    rows = figures(records, "micro", {"req-bbbb2222-0": 1.0, "req-bbbb2222-1": 0.5})
    assert [r.version for r in rows] == ["aaaa1111", "bbbb2222"]
    old, new = rows
    assert (old.requests, old.errors, old.escalated) == (20, 1, 1)
    assert new.itl_ms == [5.0] * 5  # (140 - 90) / (11 - 1)
    text = render_comparison("micro", rows, {"aaaa1111": "pool", "bbbb2222": "canary 5%"}, 24)
    assert "canary 5%" in text and "0.75 (2)" in text and "5.0%" in text  # errors and escalations of 20


@pytest.mark.redis
def test_compare_reads_the_ledger_and_the_feedback(prefix: str, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(_POLICY)
    loaded = load_policy(policy)
    own = engine_version(loaded.policy.pools["micro"].engine)  # type: ignore[union-attr]
    canary = engine_version(loaded.policy.pools["micro"].canary.engine)  # type: ignore[union-attr]

    async def write() -> None:
        ledger = RedisLedger(SHARED_URL, tmp_path / "outbox", key_prefix=prefix)
        await ledger.start()
        try:
            for i in range(6):
                await ledger.record(_rec(i, own))
            for i in range(3):
                await ledger.record(_rec(i, canary, ttft=70.0))
        finally:
            await ledger.aclose()

    asyncio.run(write())
    redis.Redis.from_url(SHARED_URL).hset(LabelKeys(prefix).feedback(f"req-{canary}-0"), "score", "0.9")

    async def read() -> list[str]:
        client = redis.asyncio.Redis.from_url(SHARED_URL)
        try:
            return [f"{r.version}:{r.requests}:{r.feedback}" for r in await compare_versions(client, prefix,
                                                                                           "micro", 1.0)]
        finally:
            await client.aclose()

    assert asyncio.run(read()) == [f"{own}:6:[]", f"{canary}:3:[0.9]"]
    assert _cli("compare", "micro", "--policy", str(policy), "--prefix", prefix, "--hours", "1") == 0
    out = capsys.readouterr().out
    assert f"{own}  pool" in out and f"{canary}  canary 10%" in out


def test_promote_and_rollback_edit_the_policy_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(_POLICY)
    canary_engine = load_policy(policy).policy.pools["micro"].canary.engine  # type: ignore[union-attr]
    assert _cli("promote", "micro", "--policy", str(policy)) == 0
    promoted = load_policy(policy).policy.pools["micro"]
    assert promoted.engine == canary_engine and promoted.canary is None  # type: ignore[union-attr]
    assert "# the shipped model" not in policy.read_text() and "# flagship stays" in policy.read_text()
    assert _cli("rollback", "micro", "--policy", str(policy)) == 1
    assert "has no canary" in capsys.readouterr().err

    policy.write_text(_POLICY)
    assert _cli("rollback", "micro", "--policy", str(policy)) == 0
    rolled_back = load_policy(policy).policy.pools["micro"]
    assert rolled_back.canary is None and rolled_back.engine.served_name == "micro"  # type: ignore[union-attr]
    assert _cli("promote", "nope", "--policy", str(policy)) == 1
    assert "no pool 'nope'" in capsys.readouterr().err


def _cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="cascade")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["pool", *argv])
    return int(args.func(args))


_POLICY = """version: 1
pools:
  micro:
    type: local
    price: {input_per_mtok: "0.20", output_per_mtok: "0.20"}
    engine:
      model: demo:micro  # the shipped model
      served_name: micro
      base_port: 8101
    canary:
      weight: 0.1
      engine:
        model: demo:micro
        served_name: micro-v2
        max_model_len: 2048
        base_port: 8111
  # flagship stays
  flagship:
    type: remote
    urls: ["http://127.0.0.1:9"]
    model: flagship
    price: {input_per_mtok: "3.00", output_per_mtok: "15.00"}
routing:
  micro_pool: micro
  flagship_pool: flagship
"""
