"""The saturation check's own machinery against a server of known capacity: the fake upstream with
`max_running` slots and a per-token delay serves at most max_running / (tokens x delay) requests/s, so the
calibration must find about that decode rate and the measured knee must land near it. (The real-engine
check, predicted vs measured within 25%, is `python -m loadtest.bench.saturation`.)"""

from __future__ import annotations

from gateway.planning.schema import Slo
from loadtest.bench.saturation import run
from loadtest.fake_upstream import FakeUpstream
from tests.servers import serve

SLOTS, DELAY_MS, TOKENS = 8, 10.0, 16  # the fake caps answers at 16 tokens: 8 / (16 x 10 ms) = 50 requests/s
CAPACITY = SLOTS / (TOKENS * DELAY_MS / 1000)


async def test_calibration_and_knee_match_a_known_capacity() -> None:
    with serve(FakeUpstream("fake", delay_ms=DELAY_MS, max_running=SLOTS)) as url:
        result = await run(url, "fake", SLOTS, Slo(ttft_s=0.5, itl_s=1.0), calib_s=1.0, step_s=3.0,
                           factors=(0.7, 0.9, 1.0, 1.1, 1.25, 1.5, 1.8))
    assert result["mixed"]["output_tokens"] == TOKENS
    decode = result["capacity"]["decode_tokens_per_s"]
    # overheads (and a busy machine: client and fake share one process) only lower it
    assert 0.6 * CAPACITY * TOKENS <= decode <= 1.05 * CAPACITY * TOKENS, result["capacity"]
    assert 0.6 * CAPACITY <= result["predicted_rps"] <= 1.05 * CAPACITY, result
    assert result["measured_rps"] is not None
    assert 0.6 * CAPACITY <= result["measured_rps"] <= 1.3 * CAPACITY, result["steps"]
    assert not result["steps"][-1]["passed"]  # the ramp went past the knee
