"""What the probe reads from an engine's /metrics: load gauges and the speculative-decoding counters, summed over
the engines of a data-parallel replica; look-alike series (per position, `_created`) ignored."""

from __future__ import annotations

import pytest

from backends.clients.pool import parse_vllm_metrics

# the shape prometheus_client gives vLLM's series (two engines of one data-parallel server)
SPECULATING = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="micro"} 2.0
vllm:num_requests_running{engine="1",model_name="micro"} 1.0
vllm:kv_cache_usage_perc{engine="0",model_name="micro"} 0.25
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="micro"} 40.0
# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="micro"} 160.0
vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="micro"} 40.0
vllm:spec_decode_num_draft_tokens_created{engine="0",model_name="micro"} 1.7646e+09
# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="micro"} 48.0
vllm:spec_decode_num_accepted_tokens_total{engine="1",model_name="micro"} 2.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="micro",position="0"} 30.0
"""


def test_speculative_counters_are_summed_over_engines() -> None:
    load = parse_vllm_metrics(SPECULATING)
    assert (load.running, load.kv_cache_usage) == (3.0, 0.25)
    assert load.speculative
    assert (load.draft_tokens, load.accepted_tokens) == (200.0, 50.0)
    assert load.acceptance == pytest.approx(0.25)


def test_an_engine_without_speculative_decoding_reports_none() -> None:
    plain = "\n".join(line for line in SPECULATING.splitlines() if "spec_decode" not in line)
    load = parse_vllm_metrics(plain)
    assert load.running == 3.0  # the same text, so the gauges still parse
    assert not load.speculative and load.acceptance is None


def test_before_any_draft_there_is_no_acceptance_yet() -> None:
    fresh = ('vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="micro"} 0.0\n'
             'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="micro"} 0.0\n')
    load = parse_vllm_metrics(fresh)
    assert load.speculative and load.draft_tokens == 0.0 and load.acceptance is None
