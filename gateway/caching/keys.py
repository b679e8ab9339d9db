"""What the response cache keys an answer by, which requests it may answer, and its Redis key names. Pure.

A request is eligible when its answer is determined by the request: temperature 0, or a `seed` (vLLM seeds the
request's own sampler), and no tools: a tool call may have side effects the client expects to happen again.
The key is the canonical request (every field but those that do not change the answer: `model`, `stream`,
`stream_options`, `user`, `metadata`; keys sorted) with the model that serves it, so a streamed and a plain request
share one entry. The semantic mode keys the same way with the latest user message's text left out (that text is
compared by embedding instead), and needs that text to be one the embedder reads whole.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from router_models.embedders.concat import part_names
from router_models.embedders.protocol import parse_name

__all__ = ["CacheKeys", "bypass_reason", "context_digest", "exact_digest", "latest_user_text", "reads_whole"]

_UNKEYED = frozenset({"model", "stream", "stream_options", "user", "metadata"})
_CHARS_PER_PIECE = 3  # a word piece of English text is 3-4 characters: below 3 the embedder would cut the text


def bypass_reason(raw: Mapping[str, Any]) -> str | None:
    """Why a request may not be answered from the cache ("tools", "not_deterministic"), or None."""
    if raw.get("tools") or raw.get("functions"):
        return "tools"
    temperature, seed = raw.get("temperature"), raw.get("seed")
    if temperature != 0 and (seed is None or isinstance(seed, bool) or not isinstance(seed, int)):
        return "not_deterministic"  # unset temperature is 1 in the OpenAI API and in vLLM
    return None


def _canonical(raw: Mapping[str, Any]) -> bytes:
    return orjson.dumps({k: v for k, v in raw.items() if k not in _UNKEYED}, option=orjson.OPT_SORT_KEYS)


def _digest(model: str, body: bytes) -> str:
    return hashlib.sha256(model.encode() + b"\x00" + body).hexdigest()


def exact_digest(model: str, raw: Mapping[str, Any]) -> str:
    """Hex SHA-256 of the model and the canonical request."""
    return _digest(model, _canonical(raw))


def _latest_user(messages: list[Any]) -> int | None:
    return next((i for i in range(len(messages) - 1, -1, -1)
                 if isinstance(messages[i], Mapping) and messages[i].get("role") == "user"), None)


def latest_user_text(raw: Mapping[str, Any]) -> str | None:
    """The text of the latest user message, or None when there is none or it is not plain text."""
    messages = raw.get("messages") or []
    index = _latest_user(messages)
    content = messages[index].get("content") if index is not None else None
    return content if isinstance(content, str) else None


def context_digest(model: str, raw: Mapping[str, Any]) -> bytes:
    """8 bytes of SHA-256 of the model and the canonical request without the latest user message's text: what a
    semantic hit must share exactly with the request it answers (system prompt, earlier turns, sampling)."""
    messages = list(raw.get("messages") or [])
    index = _latest_user(messages)
    if index is not None:
        messages[index] = {**messages[index], "content": None}
    return bytes.fromhex(_digest(model, _canonical({**raw, "messages": messages}))[:16])


def reads_whole(embedding_space: str, text: str) -> bool:
    """Whether the embedder named `embedding_space` reads all of `text` (it cuts at its max tokens): a text it cuts
    would match any other text with the same start. Judged by characters, about 3 per word piece it reads."""
    try:
        limits = [parse_name(part).max_tokens for part in part_names(embedding_space)]
    except ValueError:
        return False
    cut = min((n for n in limits if n > 0), default=0)
    return cut == 0 or len(text) <= _CHARS_PER_PIECE * (cut - 2)  # [CLS] and [SEP] take two of them


@dataclass(frozen=True, slots=True)
class CacheKeys:
    """Redis key names under the gateway's prefix. The tenant sits between literal braces (a Redis Cluster hash
    tag: a tenant's keys share one slot, so the store scripts may touch several)."""

    prefix: str = "cascade:"

    def exact(self, tenant: str, digest: str) -> str:
        return f"{self.prefix}cache:{{{tenant}}}:x:{digest}"

    def exact_prefix(self, tenant: str) -> str:
        return self.exact(tenant, "")

    def exact_index(self, tenant: str) -> str:
        """Sorted set of the tenant's exact digests by the time they were stored (ms): the size bound."""
        return f"{self.prefix}cache:{{{tenant}}}:xi"

    def vectors(self, tenant: str, model: str, space: str) -> str:
        """Hash of the tenant's semantic rows for `model` in the vector space `space`: entry id -> row."""
        digest = hashlib.sha256(space.encode()).hexdigest()[:12]
        return f"{self.prefix}cache:{{{tenant}}}:v:{model}:{digest}"

    def semantic(self, tenant: str, entry_id: str) -> str:
        return f"{self.prefix}cache:{{{tenant}}}:s:{entry_id}"

    def semantic_prefix(self, tenant: str) -> str:
        return self.semantic(tenant, "")
