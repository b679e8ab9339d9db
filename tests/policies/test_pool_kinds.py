"""Pools of kind `embedding`: what the kind implies (vLLM's pooling runner, an input-only price), what it forbids
(routing targets, ladder and shadow pools, generative engine features), and the decisions that keep generative
requests off them."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from backends.engines.args import engine_command
from policies.context import RouteContext
from policies.decide import EmbeddingModel, PoolNotAllowed, decide
from policies.loader import PolicyError, parse_policy
from policies.pools import LocalPool, RemotePool, as_remote_pool

_ENGINE = {"model": "demo:micro", "served_name": "micro-embed"}
_EMBED = {"type": "local", "kind": "embedding", "price": {"input_per_mtok": "0.02"}, "engine": _ENGINE}
_POLICY = """version: 1
pools:
  micro:
    type: remote
    urls: ["http://m"]
    model: m
    price: {input_per_mtok: "0.2", output_per_mtok: "0.2"}
  flagship:
    type: remote
    urls: ["http://f"]
    model: f
    price: {input_per_mtok: "3", output_per_mtok: "15"}
  embed:
    type: remote
    kind: embedding
    urls: ["http://e"]
    model: e
    price: {input_per_mtok: "0.02"}
routing:
  micro_pool: micro
  flagship_pool: flagship
"""


def test_a_local_embedding_pool_runs_the_pooling_runner_and_bills_input_only() -> None:
    pool = LocalPool.model_validate(_EMBED)
    assert pool.kind == "embedding" and pool.price.output_per_mtok == 0 and pool.price.input_per_mtok == 20_000
    command = engine_command(pool.engine, 9000)
    assert command[command.index("--runner") + 1] == "pooling"
    own = LocalPool.model_validate({**_EMBED, "engine": {**_ENGINE, "extra_args": ["--runner=pooling"]}})
    assert own.engine.extra_args == ("--runner=pooling",)  # the pool's own choice of runner is kept
    generative = LocalPool.model_validate({**_EMBED, "kind": "generative",
                                           "price": {"input_per_mtok": "0.2", "output_per_mtok": "0.2"}})
    assert "--runner" not in engine_command(generative.engine, 9000)
    remote = RemotePool.model_validate(as_remote_pool(_EMBED, ["http://e:8000"]))
    assert (remote.kind, remote.model, remote.price.output_per_mtok) == ("embedding", "micro-embed", 0)


def test_an_embedding_pool_priced_per_gpu_hour_needs_the_prefill_rate_alone() -> None:
    """1 USD an hour at 50,000 prompt tokens a second: 1e6 micro-USD x 1e6 / (50,000 x 3,600) = 5,556 micro-USD
    per million prompt tokens (rounded half up); completions cost nothing. A generative pool must give its decode
    rate, and a GPU-hour price without any rate is still refused."""
    hourly = {"gpu_hour_usd": "1.00", "prefill_tokens_per_second": 50000}
    pool = LocalPool.model_validate({**_EMBED, "price": hourly})
    assert (pool.price.form, pool.price.input_per_mtok, pool.price.output_per_mtok) == ("gpu_hour", 5_556, 0)
    assert pool.price.cost_micro_usd(1_000_000, 0) == 5_556
    with pytest.raises(ValidationError, match="needs decode_tokens_per_second"):
        LocalPool.model_validate({**_EMBED, "kind": "generative", "price": {**hourly, "output_per_mtok": 0}})
    with pytest.raises(ValidationError, match="give both"):
        LocalPool.model_validate({**_EMBED, "kind": "generative", "price": hourly})
    with pytest.raises(ValidationError, match="measured throughput"):
        LocalPool.model_validate({**_EMBED, "price": {"gpu_hour_usd": "1.00"}})


@pytest.mark.parametrize(("fields", "message"), [
    ({"engine": {**_ENGINE, "extra_args": ["--runner", "generate"]}}, "remove --runner generate"),
    ({"engine": {**_ENGINE, "speculative": {"method": "ngram", "num_speculative_tokens": 2}}}, "speculative"),
    ({"engine": {**_ENGINE, "tool_calling": {"parser": "pythonic"}}}, "tool_calling"),
    ({"output_checks": {"json": "flag"}}, "output_checks"),
    ({"kind": "generative", "price": {"input_per_mtok": "1", "output_per_mtok": "1"},
      "engine": {**_ENGINE, "extra_args": ["--runner", "pooling"]}}, "set kind: embedding"),
    ({"kind": "vectors"}, "kind"),
])
def test_what_an_embedding_pool_may_not_have(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        LocalPool.model_validate({**_EMBED, **fields})


@pytest.mark.parametrize(("edit", "where"), [
    (("  micro_pool: micro\n", "  micro_pool: embed\n"), "routing.micro_pool"),
    (("  flagship_pool: flagship\n", "  flagship_pool: flagship\n  rules:\n    - {name: r, match: {}, pool: embed}\n"),
     "routing.rules[0].pool"),
    (("routing:\n", "routing:\n  tiers: [micro, embed]\n"), "routing.tiers[1]"),
    (("routing:\n", "learning:\n  shadow: {judge_pool: embed}\nrouting:\n"), "learning.shadow.judge_pool"),
    (("routing:\n", "degradation:\n  steps:\n    - {name: s, pool: micro, signal: queue_depth, enter_above: 4, "
                    "exit_below: 1, action: {type: fallback_pool, to_pool: embed}}\nrouting:\n"),
     "degradation.steps[0].action.to_pool"),
])
def test_an_embedding_pool_is_never_a_generative_target(edit: tuple[str, str], where: str) -> None:
    with pytest.raises(PolicyError) as caught:
        parse_policy(_POLICY.replace(*edit))
    assert any(f"{where}: pool 'embed' is an embedding pool" in p for p in caught.value.problems), caught.value.problems


def test_a_generative_request_never_lands_on_an_embedding_pool() -> None:
    loaded = parse_policy(_POLICY + """tenants:
  vectors: {allowed_pools: [embed, flagship]}
  only-vectors: {allowed_pools: [embed]}
aliases: {vectors: embed}
""")
    policy = loaded.policy
    for model in ("embed", "e", "vectors"):  # the pool, its served name, an alias
        with pytest.raises(EmbeddingModel):
            decide(policy, loaded.version, RouteContext("default", model, "hi"), 0.1)
    moved = decide(policy, loaded.version, RouteContext("vectors", "auto", "hi"), 0.1)
    assert moved.pool == "flagship" and moved.route[-1].step == "tenant"  # its first generative allowed pool
    with pytest.raises(PoolNotAllowed):
        decide(policy, loaded.version, RouteContext("only-vectors", "auto", "hi"), 0.1)
