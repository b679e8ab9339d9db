"""`/v1/embeddings` end to end: the official openai SDK's `embeddings.create` through a served gateway (`cascade
serve`) to a real vLLM engine on its pooling runner (the demo micro model converted to embeddings, shared per
session), against the same call to the engine directly, with the ledger record on the real Redis."""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from policies.loader import load_policy
from policies.pools import LocalPool
from tests.conftest import Upstreams, delete_prefix, ledger_record, policy_yaml
from tests.engines import SharedEngines, gateway_on_shared_engines

pytestmark = [pytest.mark.engines, pytest.mark.redis]
EMBED_POOL = """  embed:
    type: local
    kind: embedding
    price: {input_per_mtok: "0.02"}
    engine:
      model: demo:micro
      served_name: micro-embed
      max_model_len: 512
      dtype: bfloat16
      kv_cache_space_gib: 1
      extra_args: ["--enforce-eager"]
"""
TEXTS = ["The cat sat on the mat.", "Embeddings map text to vectors.", "A third, longer sentence about routing."]


@pytest.fixture
def served(shared_engines: SharedEngines, upstreams: Upstreams, tmp_path: Path) -> Iterator[tuple[str, str, str]]:
    """(gateway URL, engine URL, Redis prefix): a gateway whose generative pools are fake engines on ports and whose
    embedding pool is the shared real engine."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_yaml(upstreams[1], upstreams[3]).replace("routing:\n", EMBED_POOL + "routing:\n", 1))
    spec = load_policy(policy).policy.pools["embed"]
    assert isinstance(spec, LocalPool) and "pooling" in spec.engine.extra_args
    started = time.monotonic()
    shared_engines.urls([spec.engine])  # started here unless running: its start-up time is in the test's output
    print(f"embedding engine (demo:micro on the pooling runner) ready after {time.monotonic() - started:.1f} s")
    prefix = f"test:e2e-embed:{uuid.uuid4().hex[:8]}:"
    try:
        with gateway_on_shared_engines(shared_engines, policy, prefix,
                                       ["--scorer", "length", "--home", str(tmp_path)]) as gateway:
            yield gateway.url, gateway.engines["embed"], prefix
    finally:
        delete_prefix(prefix)


def _close(a: list[float], b: list[float]) -> bool:
    """Equal within bfloat16's precision of one engine computing the same input twice (batched differently)."""
    return len(a) == len(b) and all(math.isclose(x, y, rel_tol=0.02, abs_tol=0.02) for x, y in zip(a, b, strict=True))


def test_the_sdk_embeddings_call_passes_through_the_gateway_to_the_pooling_engine(
        served: tuple[str, str, str]) -> None:
    gateway_url, engine_url, prefix = served
    through = openai.OpenAI(base_url=gateway_url + "/v1", api_key="unused", max_retries=0)
    direct = openai.OpenAI(base_url=engine_url + "/v1", api_key="unused", max_retries=0)
    raw = through.embeddings.with_raw_response.create(model="embed", input=TEXTS)
    answer = raw.parse()
    expected = direct.embeddings.create(model="micro-embed", input=TEXTS)
    assert [d.index for d in answer.data] == [0, 1, 2]
    assert len(answer.data[0].embedding) == 128  # the demo micro model's hidden size
    assert all(_close(a.embedding, b.embedding) for a, b in zip(answer.data, expected.data, strict=True))
    assert answer.usage.prompt_tokens == expected.usage.prompt_tokens > 0
    assert raw.headers["x-cascade-endpoint"] == "embeddings" and raw.headers["x-cascade-pool"] == "embed"
    record = ledger_record(prefix, raw.headers["x-request-id"])
    assert (record["endpoint"], record["pool"], record["model"], record["status"]) == (
        "embeddings", "embed", "micro-embed", "ok")
    assert (int(record["prompt_tokens"]), int(record["completion_tokens"])) == (answer.usage.prompt_tokens, 0)
    floats = through.embeddings.create(model="auto", input="one text", encoding_format="float")  # the one pool
    assert _close(floats.data[0].embedding, direct.embeddings.create(model="micro-embed", input="one text")
                  .data[0].embedding)
    tokens = through.embeddings.create(model="micro-embed", input=[[5, 6, 7]])
    assert tokens.usage.prompt_tokens == 3
    with pytest.raises(openai.BadRequestError, match="dimensions"):  # the model cannot shorten its vectors: vLLM's 400
        through.embeddings.create(model="embed", input="x", dimensions=16)
    with pytest.raises(openai.NotFoundError, match="embedding"):
        through.chat.completions.create(model="embed", messages=[{"role": "user", "content": "hi"}])
