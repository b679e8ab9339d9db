"""The saturation check's own machinery against a server of known capacity: the fake upstream with
`max_running` slots and a per-token delay serves at most max_running / (tokens x delay) requests/s, so the
calibration must find about that decode rate and the measured knee must land near it. (The real-engine
check, predicted vs measured within 25%, is `python -m loadtest.bench.saturation`.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.planning.schema import Capacity, Slo
from loadtest.bench.saturation import price_block, run
from policies.loader import parse_policy
from tests.conftest import with_fixed_threshold
from tests.servers import fake_upstream_process

ROOT = Path(__file__).resolve().parents[3]

SLOTS, DELAY_MS, TOKENS = 8, 40.0, 16  # the fake caps answers at 16 tokens: 8 / (16 x 40 ms) = 12.5 requests/s
CAPACITY = SLOTS / (TOKENS * DELAY_MS / 1000)
# The SLO, the calibration and the steps in the fake's time: 40 ms tokens (10 ms until 2026-12-07) need a quarter of
# the client's CPU for the same claim, so a process the suite starves for a moment moves the figures a quarter as much
SLO = Slo(ttft_s=2.0, itl_s=4.0)
CALIB_S, STEP_S = 4.0, 8.0


def _misses(result: dict[str, Any]) -> list[str]:
    """What of the run does not match the fake's capacity (empty: all does)."""
    decode, predicted, steps = result["capacity"]["decode_tokens_per_s"], result["predicted_rps"], result["steps"]
    checks = [
        ("answers of the fake's 16 tokens", result["mixed"]["output_tokens"] == TOKENS),
        # overheads (and a busy machine: client and fake share one process) lower the rates; the fit of three terms
        # can lend some of a starved run's time to the overhead and prefill terms (decode 1.04x under 12 busy loops)
        (f"decode rate {decode:.0f} tokens/s", 0.6 * CAPACITY * TOKENS <= decode <= 1.1 * CAPACITY * TOKENS),
        (f"prediction {predicted:.1f} requests/s", 0.6 * CAPACITY <= predicted <= 1.05 * CAPACITY),
        (f"knee {result['measured_rps']} requests/s",
         result["measured_rps"] is not None and 0.6 * CAPACITY <= result["measured_rps"] <= 1.3 * CAPACITY),
        ("the ramp went past the knee", not steps[-1]["passed"])]
    return [f"{what} (steps {steps})" for what, held in checks if not held]


@pytest.mark.slow
@pytest.mark.timing
async def test_calibration_and_knee_match_a_known_capacity() -> None:
    """Two runs at most: a machine starved by the suite's engines (chaos, int8) once served the in-process fake at 5
    requests/s for seconds after a calibration of 46 (fc3 of 2026-12-06: its knee steps' p95 TTFT 0.57 and 7.2 s),
    which no calibration can foresee; broken machinery misses in both runs. The fake paces its tokens on the answer's
    own clock: when it slept a fixed delay per token, a starved loop's late wake-ups added up (12 busy loops beside it:
    decode 0.61-0.64 of capacity, prediction 0.53-0.58, every run missed; paced: 1.04, 0.84-0.85, none missed). In
    the suite on four workers both runs missed with 10 ms tokens (decode 290 and 438 tokens/s of 800, fc4 of
    2026-12-07): the fake now paces 40 ms tokens, in a process of its own as an engine is (measured during a suite on
    four workers, two runs: decode 1.02-1.03 of capacity, knee 1.21x; 10 ms tokens beside them 0.91-0.99); its client
    keeps idle connections less long than the fake's server (a request on one it was closing:
    ServerDisconnectedError, fc6). In fc8, on four workers, it still needed its second run, and in a clone on three
    (fc1 of 2026-12-07, 08:00) too, started beside the engine starts: a `timing` test, it now runs on the engines'
    worker after them (`tests/conftest.py`)."""
    misses: list[str] = []
    for _ in range(2):
        with fake_upstream_process("fake", delay_ms=DELAY_MS, max_running=SLOTS) as url:
            # four steps: below, at and past the knee, and well past it
            result = await run(url, "fake", SLOTS, SLO, calib_s=CALIB_S, step_s=STEP_S,
                               factors=(0.7, 1.0, 1.25, 1.8))
        if not (misses := _misses(result)):
            return
        print(f"missed: {misses}")
    pytest.fail(f"two runs missed the fake's capacity: {misses}")


async def test_the_calibrated_rates_print_a_price_block_the_policy_loads() -> None:
    """The block prices the decode rate the calibration measured, whatever it was: how close that rate comes to the
    fake's capacity is the knee test's claim (a `timing` test), so this one can run beside anything."""
    with fake_upstream_process("fake", delay_ms=DELAY_MS, max_running=SLOTS) as url:
        result = await run(url, "fake", SLOTS, SLO, calib_s=CALIB_S, step_s=STEP_S, gpu_hour_usd="2.50",
                           price_only=True)
    assert "steps" not in result, "price_only stops after the calibration"
    block = result["price_block"]
    decode = result["capacity"]["decode_tokens_per_s"]
    assert decode > 0, result["capacity"]
    policy_text = with_fixed_threshold((ROOT / "policies" / "default.yaml").read_text())
    pasted = parse_policy(policy_text.replace('price: {input_per_mtok: "0.20", output_per_mtok: "0.20"}', block, 1))
    price = pasted.policy.pools["micro"].price
    assert price.form == "gpu_hour" and price.decode_tokens_per_second == pytest.approx(decode, rel=0.01)
    assert price.output_per_mtok == pytest.approx(2_500_000 * 10**6 / (decode * 3600), rel=0.01)


def test_a_price_block_is_refused_for_a_price_the_policy_would_refuse() -> None:
    cap = Capacity(prefill_tokens_per_s=23_874.3, decode_tokens_per_s=2_412.9)
    assert price_block(cap, "2.50") == ('price: {gpu_hour_usd: "2.50", prefill_tokens_per_second: 23900, '
                                        "decode_tokens_per_second: 2410}")
    with pytest.raises(ValueError, match="not a price in USD"):
        price_block(cap, "two fifty")
