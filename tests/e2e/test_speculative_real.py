"""Speculative decoding on a real vLLM engine: the demo micro model with n-gram prompt lookup, started by the
real supervisor, answering the official openai SDK; the gateway's probe scrapes its draft/accepted counters and
/metrics shows the pool's acceptance. One engine start (about a minute on 2 cores)."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from backends.clients.pool import Pool
from backends.clients.shared import make_engine_client
from backends.engines.supervisor import EngineSupervisor
from gateway.control.metrics import GatewayMetrics
from loadtest.processes import free_port
from policies.schema import EngineSpec
from policies.speculative import NgramSpeculation

pytestmark = [pytest.mark.engines]

# input-echoing work, where prompt lookup has something to find
PROMPTS = (
    "Copy this list exactly: alpha beta gamma delta, alpha beta gamma delta, alpha beta gamma delta.",
    "Rewrite without changing a word: the quick brown fox jumps over the lazy dog near the river bank.",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\nRename add to plus in this code.",
)


def _engine_counters(text: str) -> tuple[float, float]:
    """(drafted, accepted) from an engine's exposition, read with prometheus_client's own parser (not ours)."""
    totals = {"vllm:spec_decode_num_draft_tokens": 0.0, "vllm:spec_decode_num_accepted_tokens": 0.0}
    for family in text_string_to_metric_families(text):
        if family.name in totals:
            totals[family.name] += sum(s.value for s in family.samples if s.name.endswith("_total"))
    return totals["vllm:spec_decode_num_draft_tokens"], totals["vllm:spec_decode_num_accepted_tokens"]


async def test_ngram_speculation_serves_and_its_acceptance_is_exposed(tmp_path: Path) -> None:
    spec = EngineSpec(model="demo:micro", served_name="micro", max_model_len=512, dtype="bfloat16",
                      kv_cache_space_gib=1, base_port=free_port(), startup_timeout_s=600,
                      speculative=NgramSpeculation(method="ngram", num_speculative_tokens=4),
                      extra_args=("--enforce-eager",))
    started = time.monotonic()
    async with EngineSupervisor("micro", spec, home=tmp_path, check_interval_s=1) as supervisor:
        print(f"engine healthy in {time.monotonic() - started:.0f} s")
        (url,) = supervisor.ready_urls
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        for prompt in PROMPTS:
            answer = await client.chat.completions.create(
                model="micro", messages=[{"role": "user", "content": prompt}], max_tokens=48, temperature=0)
            assert answer.choices[0].message.content and answer.usage and answer.usage.completion_tokens > 0
        await client.close()

        engines = make_engine_client()
        pool = Pool("micro", [url], engines)
        try:
            await pool.probe_once()
            async with httpx.AsyncClient() as http:
                raw = (await http.get(url + "/metrics")).text
        finally:
            await engines.aclose()
        load = pool.replicas[0].load
        drafted, accepted = _engine_counters(raw)
        print(f"drafted {drafted:.0f}, accepted {accepted:.0f} tokens")
        assert load.speculative and drafted > 0  # three answers of up to 48 tokens: the proposer ran
        assert (load.draft_tokens, load.accepted_tokens) == (drafted, accepted)  # no request since the probe

        text = GatewayMetrics(lambda: {"micro": pool}).render().decode()
        (line,) = [ln for ln in text.splitlines() if ln.startswith("cascade_pool_spec_decode_acceptance{")]
        assert line == f'cascade_pool_spec_decode_acceptance{{pool="micro"}} {accepted / drafted!r}'
        assert f'cascade_replica_spec_decode_draft_tokens_total{{pool="micro",replica="{url}"}} {drafted!r}' in text
