"""`cascade router route` and `cascade router pools` on the three-pool example policy (shared-model placements on
the shipped pool map, the shipped router's embedder): routes, the tradeoff and its refusals."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gateway.cli.main import main
from gateway.cli.router_tiers import RouteError, route_rows
from policies.loader import load_policy

POLICY = Path(__file__).resolve().parents[3] / "policies" / "examples" / "three-pools.yaml"
PROMPTS = [{"id": "a", "prompt": "hi"},
           {"id": "b", "prompt": "Write a Python function that merges overlapping intervals, with tests."},
           {"id": "c", "messages": [{"role": "user", "content": "Prove there are infinitely many primes 4k+3."}]}]


@pytest.fixture
def prompts(tmp_path: Path) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    return path


def _routes(path: Path) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_route_writes_every_tiers_prediction_and_the_best_trade(prompts: Path, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "routes.jsonl"
    assert main(["router", "route", "--policy", str(POLICY), "--in", str(prompts), "--out", str(out),
                 "--tradeoff", "0"]) == 0
    routes = _routes(out)
    assert [r["id"] for r in routes] == ["a", "b", "c"]
    for r in routes:
        assert set(r["predicted"]) == set(r["expected_cost_usd"]) == {"general", "code", "flagship"}
        assert r["pool"] == max(r["predicted"], key=r["predicted"].get)  # tradeoff 0: best predicted quality
    cheap = tmp_path / "cheap.jsonl"
    assert main(["router", "route", "--policy", str(POLICY), "--in", str(prompts), "--out", str(cheap),
                 "--cost-per-1k", "0.2"]) == 0
    spent = [r["expected_cost_usd"][r["pool"]] for r in _routes(cheap)]
    assert 1000 * sum(spent) / len(spent) <= 0.2
    assert "routed 3 rows at tradeoff" in capsys.readouterr().out


@pytest.mark.parametrize(("extra", "words"), [
    (["--tradeoff", "-1"], "--tradeoff -1.0 is negative"),
    (["--cost-per-1k", "0.00001"], "is below what the cheapest tier of every request costs"),
])
def test_route_refuses_a_bad_tradeoff(prompts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                      extra: list[str], words: str) -> None:
    assert main(["router", "route", "--policy", str(POLICY), "--in", str(prompts), "--out",
                 str(tmp_path / "r.jsonl"), *extra]) == 2
    assert words in capsys.readouterr().err


def test_route_refuses_a_bad_line_with_its_number(prompts: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    prompts.write_text(prompts.read_text() + '{"id": "d"}\n')
    assert main(["router", "route", "--policy", str(POLICY), "--in", str(prompts), "--out",
                 str(tmp_path / "r.jsonl")]) == 2
    assert f"{prompts}:4: expected \"prompt\"" in capsys.readouterr().err


def test_route_rows_solve_the_cost_target_on_the_input() -> None:
    loaded = load_policy(POLICY)
    quality = np.asarray([[0.5, 0.6, 0.9]] * 10)
    rows, tradeoff = route_rows(loaded, quality, [100] * 10, 0.0, None)
    assert tradeoff == 0.0 and len(rows) == 10 and rows[0][2].cost_usd > rows[0][0].cost_usd
    assert loaded.policy.routing.cost_per_1k is not None  # without flags: solved for the policy's own target
    assert route_rows(loaded, quality, [100] * 10, None, None)[1] == \
        route_rows(loaded, quality, [100] * 10, None, loaded.policy.routing.cost_per_1k / 1e6)[1]
    floor = 1000 * rows[0][0].cost_usd
    _, solved = route_rows(loaded, quality, [100] * 10, None, 2 * floor)
    assert solved > 0
    with pytest.raises(RouteError, match="below what the cheapest tier"):
        route_rows(loaded, quality, [100] * 10, None, floor / 2)


def test_pools_shows_every_tier_on_the_map(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["router", "pools", "--policy", str(POLICY)]) == 0
    out = capsys.readouterr().out
    for pool in ("general", "code", "flagship"):
        assert f"pool {pool!r} on pool-map@" in out
    assert "domain-1" in out and "overall" in out
