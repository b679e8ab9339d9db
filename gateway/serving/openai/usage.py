"""Token usage of one request, from the engine when it said so, else counted where the prompt already is.

A local pool's engines are the gateway's own: counting goes through the engine's `/tokenize` endpoint
(vLLM), so the gateway needs no copy of the tokenizer and counts exactly as the engine would. A remote
pool's servers are someone else's (a cloud API, say): the prompt is never sent to them a second time, to
`/tokenize` or anywhere. It is counted on the gateway's machine with the pool's `tokenizer` (a Hugging Face
tokenizer directory, chat template applied), else estimated (4 characters a token). `Usage.source` says
which ("engine", "tokenizer" or "estimate"); it becomes the ledger record's `usage_source`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from backends.clients.shared import EngineClient, EngineError
from policies.pools import LocalPool, RemotePool

__all__ = ["Usage", "count_usage", "estimate_usage", "usage_from_json"]

log = logging.getLogger("cascade.usage")


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    source: str = "engine"  # "engine" | "tokenizer" | "estimate"


def usage_from_json(obj: Mapping[str, Any]) -> Usage | None:
    """The `usage` object of an OpenAI response or chunk, if present and well-formed: chat and completions
    (`prompt_tokens` / `completion_tokens`), a Responses object (`input_tokens` / `output_tokens`) or a
    Responses stream event carrying its response (`response.completed`)."""
    usage = obj.get("usage")
    if usage is None and isinstance(obj.get("response"), Mapping):
        usage = obj["response"].get("usage")
    if not isinstance(usage, Mapping):
        return None
    prompt = usage.get("prompt_tokens", usage.get("input_tokens"))
    completion = usage.get("completion_tokens", usage.get("output_tokens"))
    if type(prompt) is not int or type(completion) is not int:
        return None
    return Usage(prompt, completion, "engine")


async def _tokenize_count(client: EngineClient, base_url: str, payload: dict[str, Any]) -> int:
    body = await client.post_json(base_url, "/tokenize", orjson.dumps(payload))
    count = orjson.loads(body).get("count")
    if not isinstance(count, int):
        raise EngineError("tokenize answered without a count")
    return count


async def count_usage(
    pool: LocalPool | RemotePool | None,
    client: EngineClient,
    base_url: str,
    model: str,
    messages: Sequence[Mapping[str, Any]],
    completion_text: str,
    prompt_text: str | None = None,
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> Usage:
    """Count prompt tokens (with the chat template) and completion tokens: with the engine's tokenizer at
    `base_url` for a local pool; on this machine for a remote one or an unknown one (`None`: nothing is sent
    to `base_url`). A `prompt_text` (a completions prompt) is counted as it is, without the chat template, in
    place of `messages`. `tools` (chat tools) are part of the prompt the template writes."""
    if prompt_text is not None:
        messages = [{"role": "user", "content": prompt_text}]
    if not isinstance(pool, LocalPool):
        return await _count_locally(pool.tokenizer if pool is not None else None, messages, completion_text,
                                    prompt_text, tools)
    chat: dict[str, Any] = {"model": model, "messages": list(messages), "add_generation_prompt": True}
    if tools:
        chat["tools"] = list(tools)
    try:
        prompt = await _tokenize_count(
            client, base_url, chat if prompt_text is None else {"model": model, "prompt": prompt_text}
        )
        completion = 0
        if completion_text:
            completion = await _tokenize_count(
                client, base_url, {"model": model, "prompt": completion_text, "add_special_tokens": False}
            )
        return Usage(prompt, completion, "tokenizer")
    except (EngineError, ValueError) as exc:
        log.warning("token count via engine failed, estimating", extra={"error": str(exc)})
        return estimate_usage(messages, completion_text)


def estimate_usage(messages: Sequence[Mapping[str, Any]], completion_text: str) -> Usage:
    """4 characters a token, marked as an estimate."""
    chars = sum(len(str(m.get("content") or "")) for m in messages)
    return Usage(max(1, chars // 4), len(completion_text) // 4, "estimate")


async def _count_locally(tokenizer: str | None, messages: Sequence[Mapping[str, Any]], completion_text: str,
                         prompt_text: str | None = None, tools: Sequence[Mapping[str, Any]] | None = None) -> Usage:
    if tokenizer is None:
        return estimate_usage(messages, completion_text)
    try:  # loading and encoding are CPU work: off the event loop
        return await asyncio.to_thread(_count_with, tokenizer, list(messages), completion_text, prompt_text,
                                       list(tools) if tools else None)
    except Exception as exc:  # a missing or broken tokenizer directory, a template that rejects the messages
        log.warning("token count with the pool's tokenizer failed, estimating",
                    extra={"tokenizer": tokenizer, "error": f"{type(exc).__name__}: {exc}"})
        return estimate_usage(messages, completion_text)


def _count_with(tokenizer_dir: str, messages: list[Mapping[str, Any]], completion_text: str,
                prompt_text: str | None = None, tools: list[Mapping[str, Any]] | None = None) -> Usage:
    tokenizer = _tokenizer(tokenizer_dir)
    if prompt_text is not None:
        ids = tokenizer.encode(prompt_text)
    else:
        ids = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True)
    if isinstance(ids, Mapping):  # transformers >= 5 answers a BatchEncoding
        ids = ids["input_ids"]
    completion = len(tokenizer.encode(completion_text, add_special_tokens=False)) if completion_text else 0
    return Usage(len(ids), completion, "tokenizer")


@functools.lru_cache(maxsize=8)
def _tokenizer(tokenizer_dir: str) -> Any:
    """Loaded once per directory per process (transformers is imported only when a pool names a tokenizer)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
