"""`cascade plan`'s capacity model against a real engine: calibrate one demo vLLM engine (the micro
model, batch capped at 16), predict the request rate at which it stops meeting a 2 s p95 TTFT SLO on a mixed
workload, ramp open-loop Poisson traffic through that point, and require the prediction within 25% of the
measured knee. About 4 minutes: one engine start, then ~3 minutes of load (see loadtest/bench/saturation.py).

It is a timing benchmark on a real engine, so it runs only when asked (CASCADE_BENCHMARKS=1), not in CI:
on a shared 2-core machine a neighbour's load moves the knee (seen: 4 runs within 17%, one off by 100% while
the machine's load average was 7-10). `python -m loadtest.bench.saturation` prints the same comparison."""

from __future__ import annotations

import os

import pytest

from backends.engines.supervisor import EngineSupervisor
from gateway.planning.schema import Slo
from loadtest.bench.saturation import run
from policies.schema import EngineSpec
from tests.servers import free_port

pytestmark = [
    pytest.mark.engines,
    pytest.mark.skipif(os.environ.get("CASCADE_BENCHMARKS") != "1",
                       reason="timing benchmark: set CASCADE_BENCHMARKS=1 or run "
                              "`python -m loadtest.bench.saturation`"),
]

BATCH = 16


async def test_predicted_saturation_within_25_percent_of_measured() -> None:
    spec = EngineSpec(model="demo:micro", served_name="micro", max_model_len=1024, dtype="bfloat16",
                      kv_cache_space_gib=1, base_port=free_port(),
                      extra_args=("--enforce-eager", "--max-num-seqs", str(BATCH)))
    async with EngineSupervisor("saturation", spec) as sup:
        result = await run(sup.urls[0], "micro", BATCH, Slo(ttft_s=2.0, itl_s=0.1), calib_s=6.0, step_s=15.0)
    steps = result["steps"]
    assert result["measured_rps"] is not None, steps
    assert not steps[-1]["passed"], steps  # the ramp went past the knee
    assert abs(result["relative_error"]) <= 0.25, result
