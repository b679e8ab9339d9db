"""The capacity model behind `cascade plan`: how many requests/s one engine replica takes within the SLOs.

A replica is treated as one server whose work per request is measured in replica-seconds (`Capacity`):

    s(request) = request_overhead_s + prompt_tokens / prefill_tokens_per_s + output_tokens / decode_tokens_per_s

where the throughputs are those of a replica at the batch size that keeps inter-token latency within the ITL
SLO (that is how `capacity` is measured: `loadtest/bench/saturation.py` caps the engine's batch, `--max-num-seqs`).
At an arrival rate lam the replica is busy a fraction rho = lam*s_mean of the time (s_mean: mean over the token mix).

- Throughput bound: rho < 1, so one replica saturates at 1/s_mean requests/s.
- TTFT bound: a request's first token needs its prefill work f = overhead + prompt/prefill_rate, stretched by
  queueing. As in an M/M/1 queue the response time is exponential with mean f/(1-rho), whose 95th percentile is
  T0/(1-rho) with T0 = ln(20)*f; keeping that within the TTFT SLO gives rho <= 1 - T0/ttft_s. T0 (the p95
  TTFT as load goes to zero) can also be measured and given as `ttft_p95_idle_s`: real engines add scheduling
  and streaming delays to the bare prefill work.
- Headroom: ops' `utilization_ceiling` (bursts within the hour, failover) caps rho further.

So `max_utilization = min(ceiling, 1 - T0/ttft_s)`, one replica takes `max_utilization / s_mean` requests/s,
and a pool at lam requests/s needs `ceil(lam*s_mean / max_utilization)` replicas. Deliberately simple: the engine's own
batching is folded into the measured throughputs, and hours are planned independently (no warm-up).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from gateway.planning.schema import Capacity, Slo, TokenClass

__all__ = ["P95_FACTOR", "PlanError", "idle_ttft_p95_s", "max_utilization", "mean_service_s", "replicas_needed",
           "saturation_rps"]

P95_FACTOR = math.log(20)  # p95 / mean of an exponential distribution


class PlanError(Exception):
    """The inputs cannot give a plan (e.g. an SLO no load can meet); the message says which and why."""


def mean_service_s(cap: Capacity, mix: Sequence[TokenClass]) -> float:
    """Mean replica-seconds of one request of the mix."""
    return sum(c.share * (cap.request_overhead_s + c.prompt_tokens / cap.prefill_tokens_per_s
                          + c.output_tokens / cap.decode_tokens_per_s) for c in mix)


def _mean_prefill_s(cap: Capacity, mix: Sequence[TokenClass]) -> float:
    return sum(c.share * (cap.request_overhead_s + c.prompt_tokens / cap.prefill_tokens_per_s) for c in mix)


def idle_ttft_p95_s(cap: Capacity, mix: Sequence[TokenClass]) -> float:
    """T0: the measured `ttft_p95_idle_s`, else ln(20) x the mean prefill work of the mix."""
    return cap.ttft_p95_idle_s if cap.ttft_p95_idle_s is not None else P95_FACTOR * _mean_prefill_s(cap, mix)


def max_utilization(cap: Capacity, mix: Sequence[TokenClass], slo: Slo, ceiling: float = 1.0) -> float:
    """The highest busy fraction that keeps the TTFT SLO (and stays under `ceiling`). Raises PlanError when
    even an idle replica would miss the TTFT SLO."""
    t0 = idle_ttft_p95_s(cap, mix)
    if t0 >= slo.ttft_s:
        raise PlanError(f"a TTFT SLO of {slo.ttft_s} s cannot be met: the p95 TTFT of an idle replica is "
                        f"already {t0:.3f} s")
    return min(ceiling, 1 - t0 / slo.ttft_s)


def saturation_rps(cap: Capacity, mix: Sequence[TokenClass], slo: Slo, ceiling: float = 1.0) -> float:
    """Requests/s at which one replica stops meeting the SLOs (ceiling 1: the SLO/throughput knee)."""
    return max_utilization(cap, mix, slo, ceiling) / mean_service_s(cap, mix)


def replicas_needed(rps: float, cap: Capacity, mix: Sequence[TokenClass], slo: Slo, ceiling: float) -> int:
    """Replicas for `rps` requests/s (0 when there is no traffic)."""
    if rps <= 0:
        return 0
    load = rps * mean_service_s(cap, mix) / max_utilization(cap, mix, slo, ceiling)
    return max(1, math.ceil(load - 1e-9))
