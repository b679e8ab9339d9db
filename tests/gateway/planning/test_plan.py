"""`cascade plan`: the capacity model's arithmetic, replicas/GPU-hours/cost against the all-flagship baseline,
shares from a prompt sample through the policy, and the CLI's table, JSON and errors."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import pytest
import yaml

from gateway.cli.main import main
from gateway.planning.model import P95_FACTOR, PlanError, max_utilization, replicas_needed, saturation_rps
from gateway.planning.plan import make_plan, plan_json, render_table
from gateway.planning.schema import Capacity, Forecast, ForecastError, Slo, TokenClass, load_forecast
from gateway.planning.shares import read_prompts, shares_from_sample
from policies.loader import load_policy

ROOT = Path(__file__).resolve().parents[3]
GPU = ROOT / "policies" / "gpu.yaml"
EXAMPLE = ROOT / "deploy" / "forecast.yaml"
CAP = Capacity(prefill_tokens_per_s=10_000, decode_tokens_per_s=1_000, request_overhead_s=0.01)
MIX = (TokenClass(share=0.5, prompt_tokens=1000, output_tokens=100),
       TokenClass(share=0.5, prompt_tokens=3000, output_tokens=300))
LOOSE = Slo(ttft_s=1000, itl_s=0.05)


def test_service_time_and_throughput_knee() -> None:
    # s = 0.01 + 2000/10000 + 200/1000 = 0.41 replica-seconds per request
    assert saturation_rps(CAP, MIX, LOOSE) == pytest.approx(1 / 0.41, rel=1e-3)
    assert saturation_rps(CAP, MIX, LOOSE, ceiling=0.5) == pytest.approx(0.5 / 0.41, rel=1e-3)


def test_ttft_slo_lowers_the_utilization_it_allows() -> None:
    # prefill part f = 0.01 + 0.2 = 0.21 s; p95 under load = ln(20) * f / (1 - rho) <= 1.5 s
    slo = Slo(ttft_s=1.5, itl_s=0.05)
    assert max_utilization(CAP, MIX, slo) == pytest.approx(1 - P95_FACTOR * 0.21 / 1.5)
    with pytest.raises(PlanError, match="cannot be met"):
        max_utilization(CAP, MIX, Slo(ttft_s=0.5, itl_s=0.05))
    # a measured idle p95 TTFT replaces the prefill estimate: p95 TTFT = 0.3 / (1 - rho) <= 1.5 s
    measured = CAP.model_copy(update={"ttft_p95_idle_s": 0.3})
    assert max_utilization(measured, MIX, slo) == pytest.approx(0.8)
    assert saturation_rps(measured, MIX, slo) == pytest.approx(0.8 / 0.41, rel=1e-3)


def test_replicas_round_up_and_zero_traffic_needs_none() -> None:
    assert replicas_needed(0, CAP, MIX, LOOSE, 1.0) == 0
    assert replicas_needed(0.01, CAP, MIX, LOOSE, 1.0) == 1
    per_replica = 0.8 / 0.41
    assert replicas_needed(per_replica * 3, CAP, MIX, LOOSE, 0.8) == 3
    assert replicas_needed(per_replica * 3.01, CAP, MIX, LOOSE, 0.8) == 4


def forecast(**changes: object) -> Forecast:
    data = yaml.safe_load(EXAMPLE.read_text())
    data.update(changes)
    return Forecast.model_validate(data)


def test_example_plan_costs_gpu_hours_and_beats_all_flagship() -> None:
    policy = load_policy(GPU).policy
    f = forecast()
    plan = make_plan(policy, f, {"micro": 0.72, "flagship": 0.28})
    micro, flagship = plan.pools
    assert len(micro.replicas or ()) == 24
    for pool in (micro, flagship, plan.baseline):  # each hour: enough replicas, and not one too many
        cap = f.capacity[pool.name]
        for rps, n in zip(f.hourly_requests_per_s, pool.replicas or (), strict=True):
            need = rps * pool.share / saturation_rps(cap, f.token_mix, f.slo, f.utilization_ceiling)
            assert n == max(1, math.ceil(need))
    assert flagship.gpus_per_replica == 2  # tensor_parallel_size 2 in gpu.yaml
    assert flagship.gpu_hours == 2 * sum(flagship.replicas or ())
    assert micro.cost_micro_usd == 2_500_000 * sum(micro.replicas or ())  # $2.50 per replica-hour
    assert plan.baseline.cost_micro_usd == 5_000_000 * sum(plan.baseline.replicas or ())
    assert plan.cost_micro_usd < plan.baseline.cost_micro_usd
    data = plan_json(plan)
    assert data["savings_micro_usd"] == plan.baseline.cost_micro_usd - plan.cost_micro_usd
    table = render_table(plan)
    assert "all-flagship" in table and "saves $" in table


def test_remote_pools_pay_per_token_and_missing_capacity_falls_back_to_the_policy() -> None:
    policy = load_policy(GPU).policy
    plan = make_plan(policy, forecast(capacity={}, slo={"ttft_s": 10, "itl_s": 0.05}), {"micro": 0.5, "cloud": 0.5})
    micro, cloud = plan.pools
    assert cloud.replicas is None and cloud.gpu_hours == 0 and cloud.pricing == "per_token"
    tokens_per_request = {"prompt": 0.6 * 400 + 0.3 * 1800 + 0.1 * 6000, "output": 0.6 * 150 + 0.3 * 400 + 0.1 * 900}
    expected = (round(cloud.requests_per_day * tokens_per_request["prompt"]) * 2_500_000
                + round(cloud.requests_per_day * tokens_per_request["output"]) * 10_000_000 + 500_000) // 1_000_000
    assert cloud.cost_micro_usd == expected
    # micro's capacity comes from its price: prompts at 24,000 tokens/s, output at 2,400
    assert micro.saturation_rps_per_replica is not None
    s = (0.6 * 400 + 0.3 * 1800 + 0.1 * 6000) / 24_000 + (0.6 * 150 + 0.3 * 400 + 0.1 * 900) / 2400
    assert micro.saturation_rps_per_replica == pytest.approx(0.75 / s, rel=1e-6)
    flat = policy.pools["flagship-fp8"]  # the older single rate: prompt and output tokens alike
    slow_prefill = forecast(capacity={}, slo={"ttft_s": 60, "itl_s": 0.05})  # a TTFT that leaves the ceiling
    fp8, = make_plan(policy, slow_prefill, {"flagship-fp8": 1.0}).pools
    assert fp8.saturation_rps_per_replica == pytest.approx(
        0.75 / ((0.6 * 550 + 0.3 * 2200 + 0.1 * 6900) / (flat.price.tokens_per_second or 0)), rel=1e-6)


def test_unknown_pool_and_local_pool_without_any_capacity() -> None:
    policy = load_policy(GPU).policy
    with pytest.raises(PlanError, match="not in the policy"):
        make_plan(policy, forecast(), {"mikro": 1.0})
    default = load_policy(ROOT / "policies" / "default.yaml").policy  # per-token prices, no tokens_per_second
    with pytest.raises(PlanError, match="no per-replica throughput"):
        make_plan(default, forecast(capacity={}), {"micro": 1.0})


def test_forecast_errors_name_the_key(tmp_path: Path) -> None:
    bad = tmp_path / "f.yaml"
    data = yaml.safe_load(EXAMPLE.read_text())
    data["token_mix"][0]["share"] = 0.9
    data["slo"]["ttft"] = 1
    bad.write_text(yaml.safe_dump(data))
    with pytest.raises(ForecastError, match=r"slo\.ttft"):
        load_forecast(bad)
    data["slo"].pop("ttft")
    bad.write_text(yaml.safe_dump(data))
    with pytest.raises(ForecastError, match="add up to 1"):
        load_forecast(bad)


def test_shares_from_a_sample_follow_the_policy(tmp_path: Path) -> None:
    policy = load_policy(GPU).policy
    sample = tmp_path / "prompts.jsonl"
    sample.write_text('{"prompt": "hi"}\n{"messages": [{"role": "user", "content": "prove it"}]}\nplain text\n'
                      '{"prompt": "diff --git a/x b/x"}\n')
    prompts = read_prompts(sample)
    assert prompts == ["hi", "prove it", "plain text", "diff --git a/x b/x"]

    def score(texts: Sequence[str]) -> list[float]:
        return [{"hi": 0.1, "prove it": 0.9, "plain text": 0.25, "diff --git a/x b/x": 0.27}[t] for t in texts]

    # gpu.yaml routes by flagship share, starting at 0.28: 0.1 is clearly-easy (max_score 0.2) -> micro;
    # 0.9 -> flagship; 0.25 < 0.28 -> micro; 0.27 < 0.28, but the code-review rule's threshold 0.26 -> flagship
    assert shares_from_sample(policy, prompts, score) == {"flagship": 0.5, "micro": 0.5}


def test_cli_table_json_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--traffic", str(EXAMPLE), "--policy", str(GPU)]) == 0
    out = capsys.readouterr().out
    assert "replicas per pool per hour" in out and "cascade total" in out
    target = tmp_path / "plan.json"
    assert main(["plan", "--traffic", str(EXAMPLE), "--policy", str(GPU), "--format", "json",
                 "--out", str(target)]) == 0
    data = json.loads(target.read_text())
    assert [p["name"] for p in data["pools"]] == ["micro", "flagship"]
    assert data["baseline"]["name"] == "flagship"
    assert main(["plan", "--traffic", str(tmp_path / "missing.yaml"), "--policy", str(GPU)]) == 1
    assert "cannot read the forecast" in capsys.readouterr().err


def test_cli_shares_from_the_shipped_classifier_on_a_sample(capsys: pytest.CaptureFixture[str]) -> None:
    sampled = ROOT / "deploy" / "forecast-sampled.yaml"
    assert main(["plan", "--traffic", str(sampled), "--policy", str(GPU), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    shares = {p["name"]: p["share"] for p in data["pools"]}
    assert set(shares) == {"micro", "flagship"} and sum(shares.values()) == pytest.approx(1)
    assert 0.05 < shares["flagship"] < 0.95  # some of a synthetic traffic mix on each pool (no quality claim)
