"""A capacity plan: replicas per pool per hour, GPU-hours and cost per day, against an all-flagship deployment.

Costs (integer micro-USD): a local pool priced per GPU-hour pays `gpu_hour_usd` for every replica-hour it is
up, busy or not; any other pool (remote, or priced per token) pays its per-token price on the tokens routed to
it. Remote pools get no replica count (someone else runs them). See `gateway.planning.model` for the model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from gateway.planning.model import PlanError, replicas_needed, saturation_rps
from gateway.planning.schema import Capacity, Forecast, TokenClass
from policies.schema import LocalPool, Policy, RemotePool

__all__ = ["Plan", "PoolPlan", "make_plan", "plan_json", "render_table"]


@dataclass(frozen=True, slots=True)
class PoolPlan:
    """One pool's day. `replicas` is None for a remote pool; `gpu_hours` 0 there."""

    name: str
    share: float
    requests_per_day: int
    saturation_rps_per_replica: float | None
    gpus_per_replica: int
    replicas: tuple[int, ...] | None
    gpu_hours: float
    cost_micro_usd: int
    pricing: str


@dataclass(frozen=True, slots=True)
class Plan:
    hourly_requests_per_s: tuple[float, ...]
    pools: tuple[PoolPlan, ...]
    baseline: PoolPlan

    @property
    def cost_micro_usd(self) -> int:
        return sum(p.cost_micro_usd for p in self.pools)

    @property
    def gpu_hours(self) -> float:
        return sum(p.gpu_hours for p in self.pools)


def _gpus(spec: LocalPool) -> int:
    e = spec.engine
    return e.tensor_parallel_size * e.pipeline_parallel_size * e.data_parallel_size


def _capacity(name: str, spec: LocalPool | RemotePool, forecast: Forecast) -> Capacity | None:
    if name in forecast.capacity:
        return forecast.capacity[name]
    prefill, decode = spec.price.prefill_rate, spec.price.decode_rate
    if prefill is not None and decode is not None:  # the policy price's declared throughputs
        return Capacity(prefill_tokens_per_s=prefill, decode_tokens_per_s=decode)
    if isinstance(spec, LocalPool):
        raise PlanError(f"pool {name!r}: no per-replica throughput; add `capacity: {{{name}: ...}}` to the "
                        "forecast (measure it with `python -m loadtest.bench.saturation`)")
    return None


def _token_cost(spec: LocalPool | RemotePool, requests: int, mix: Sequence[TokenClass]) -> int:
    prompt = round(requests * sum(c.share * c.prompt_tokens for c in mix))
    output = round(requests * sum(c.share * c.output_tokens for c in mix))
    return spec.price.cost_micro_usd(prompt, output)


def _pool_plan(name: str, spec: LocalPool | RemotePool, share: float, forecast: Forecast) -> PoolPlan:
    rates = [rps * share for rps in forecast.hourly_requests_per_s]
    requests = round(sum(rates) * 3600)  # the day's requests: each hour's rate (per second) held for its 3600 s
    cap, mix, slo = _capacity(name, spec, forecast), forecast.token_mix, forecast.slo
    sat = None if cap is None else saturation_rps(cap, mix, slo, forecast.utilization_ceiling)
    if isinstance(spec, RemotePool) or cap is None:
        return PoolPlan(name, share, requests, sat, 0, None, 0.0, _token_cost(spec, requests, mix), "per_token")
    replicas = tuple(replicas_needed(r, cap, mix, slo, forecast.utilization_ceiling) for r in rates)
    gpus = _gpus(spec)
    gpu_hour = spec.price.gpu_hour_usd
    if gpu_hour is not None:
        cost, pricing = sum(replicas) * gpu_hour, "gpu_hour"
    else:
        cost, pricing = _token_cost(spec, requests, mix), "per_token"
    return PoolPlan(name, share, requests, sat, gpus, replicas, float(sum(replicas) * gpus), cost, pricing)


def make_plan(policy: Policy, forecast: Forecast, shares: Mapping[str, float]) -> Plan:
    """Plan every pool with a share (and the all-flagship baseline). Raises PlanError for unknown pools."""
    unknown = sorted(set(shares) - set(policy.pools))
    baseline = forecast.baseline_pool or policy.routing.flagship_pool
    if unknown or baseline not in policy.pools:
        raise PlanError(f"pools not in the policy: {unknown or [baseline]}; it has {sorted(policy.pools)}")
    pools = tuple(_pool_plan(name, policy.pools[name], share, forecast)
                  for name, share in shares.items() if share > 0)
    return Plan(forecast.hourly_requests_per_s, pools, _pool_plan(baseline, policy.pools[baseline], 1.0, forecast))


def _usd(micro: int) -> str:
    return f"${micro / 1_000_000:,.2f}"


def render_table(plan: Plan) -> str:
    """Replicas per hour, then the day per pool, the total and the all-flagship comparison."""
    local = [p for p in plan.pools if p.replicas is not None]
    base = plan.baseline
    head = f"{'hour':>4}  {'req/s':>8}" + "".join(f"  {p.name:>12}" for p in local) + f"  | {'all-' + base.name:>14}"
    lines = ["replicas per pool per hour (UTC)", head]
    for h, rps in enumerate(plan.hourly_requests_per_s):
        row = f"{h:>4}  {rps:>8.2f}" + "".join(f"  {p.replicas[h]:>12}" for p in local if p.replicas is not None)
        lines.append(row + f"  | {base.replicas[h] if base.replicas else '-':>14}")
    lines += ["", f"{'pool':<16}{'share':>7}{'req/day':>12}{'sat. req/s':>12}{'GPUs':>6}{'peak':>6}"
              f"{'GPU-h/day':>11}{'cost/day':>14}  pricing"]
    for p in (*plan.pools, base):
        label = f"all-{p.name}" if p is base else p.name
        sat = "-" if p.saturation_rps_per_replica is None else f"{p.saturation_rps_per_replica:.2f}"
        peak = max(p.replicas) if p.replicas else "-"
        lines.append(f"{label:<16}{p.share:>7.1%}{p.requests_per_day:>12,}{sat:>12}{p.gpus_per_replica or '-':>6}"
                     f"{peak:>6}{p.gpu_hours:>11.1f}{_usd(p.cost_micro_usd):>14}  {p.pricing}")
    saving = 1 - plan.cost_micro_usd / base.cost_micro_usd if base.cost_micro_usd else 0.0
    lines += [f"{'cascade total':<16}{'':>49}{plan.gpu_hours:>11.1f}{_usd(plan.cost_micro_usd):>14}",
              f"saves {_usd(base.cost_micro_usd - plan.cost_micro_usd)} a day ({saving:.1%}) against everything on "
              f"{base.name!r}; 'sat. req/s' is one replica's load at the utilization ceiling"]
    return "\n".join(lines) + "\n"


def plan_json(plan: Plan) -> dict[str, Any]:
    """The plan as JSON-ready data (money in integer micro-USD)."""
    return {"hourly_requests_per_s": list(plan.hourly_requests_per_s),
            "pools": [asdict(p) for p in plan.pools], "baseline": asdict(plan.baseline),
            "total": {"gpu_hours": plan.gpu_hours, "cost_micro_usd": plan.cost_micro_usd},
            "savings_micro_usd": plan.baseline.cost_micro_usd - plan.cost_micro_usd}
