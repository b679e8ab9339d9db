"""The completion limit the gateway sets on engine calls (`gateway.serving.routing.completion_limit`): counted with the
engine's `/tokenize` only where the prompt's JSON-size bound does not show it fits; a local engine that stops at the
context left by itself is sent nothing and not asked to count."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from gateway.serving.openai.endpoints import CHAT, COMPLETIONS, RESPONSES
from gateway.serving.routing.completion_limit import ENGINE_LIMIT, CompletionLimits, SetLimit
from policies.schema import Policy
from tests.gateway.serving.test_context_fit import PRICE, _fit

CONTEXT = 1024


def _loaded(default: int | None = None, remote: bool = False) -> Any:
    micro: dict[str, Any] = {"type": "local", "price": PRICE, "engine": {
        "model": "demo:micro", "served_name": "micro", "max_model_len": CONTEXT, "base_port": 8101}}
    if remote:
        micro = {"type": "remote", "price": PRICE, "urls": ["http://micro"], "model": "micro",
                 "context_tokens": CONTEXT}
    flagship = {"type": "local", "price": PRICE, "engine": {"model": "demo:flagship", "served_name": "flagship",
                                                            "max_model_len": 4096, "base_port": 8201}}
    policy = Policy.model_validate({"pools": {"micro": micro, "flagship": flagship}, "default_max_tokens": default,
                                    "routing": {"micro_pool": "micro", "flagship_pool": "flagship", "threshold": 0.5}})
    return SimpleNamespace(policy=policy)


def _apply(text: str, endpoint: str = CHAT.name, count: int = 0, **policy: Any) -> tuple[dict[str, Any], SetLimit,
                                                                                            int]:
    """(the engine body, the limit set, /tokenize calls) for one call of `text` on micro without a client limit."""
    fit, client = _fit({"http://micro": count})
    body: dict[str, Any] = {"model": "micro", "messages": [{"role": "user", "content": text}]}
    if endpoint != CHAT.name:
        body = {"model": "micro", "prompt" if endpoint == COMPLETIONS.name else "input": text}
    sent, limit = asyncio.run(CompletionLimits(fit).apply(_loaded(**policy), "micro", None, body, endpoint))
    return sent, limit, len(client.calls)


@pytest.mark.parametrize("endpoint", [CHAT.name, RESPONSES.name])
def test_a_short_prompt_to_a_local_engine_is_not_counted_and_left_to_the_engine(endpoint: str) -> None:
    body, limit, calls = _apply("hello there", endpoint)
    assert calls == 0  # no /tokenize round trip per request
    assert limit == ENGINE_LIMIT and not {"max_tokens", "max_completion_tokens", "max_output_tokens"} & set(body)


def test_a_prompt_near_the_context_is_counted_and_sent_the_room_left() -> None:
    body, limit, calls = _apply("word " * 300, count=700)  # 1,500 bytes: the bound does not show it fits
    assert calls == 1 and limit == SetLimit(CONTEXT - 700, "context")
    assert body["max_completion_tokens"] == CONTEXT - 700


def test_a_completions_prompt_is_still_counted_whose_engine_default_is_sixteen_tokens() -> None:
    body, limit, calls = _apply("hello there", COMPLETIONS.name, count=3)
    assert calls == 1 and limit == SetLimit(CONTEXT - 3, "context") and body["max_tokens"] == CONTEXT - 3


def test_a_remote_pool_with_a_context_gets_the_room_left_counted_on_this_machine() -> None:
    body, limit, calls = _apply("hello there", remote=True)
    assert calls == 0 and limit.by == "context" and 0 < body["max_completion_tokens"] < CONTEXT


def test_a_default_that_fits_is_sent_without_counting() -> None:
    body, limit, calls = _apply("hello there", default=300)
    assert calls == 0 and limit == SetLimit(300, "default") and body["max_completion_tokens"] == 300
