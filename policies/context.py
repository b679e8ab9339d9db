"""`RouteContext`: the facts about one request that routing rules may match on. Pure, no HTTP.

Prompt tokens are either counted by the caller (`prompt_tokens`) or estimated by `estimate_tokens`:
``ceil(chars / 4)``, the usual rule of thumb for English text with BPE tokenizers. Rules written against
token counts are therefore approximate unless the gateway passes a real count.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["AUTO_MODEL", "CHARS_PER_TOKEN", "RouteContext", "estimate_tokens", "prompt_text_of"]

AUTO_MODEL = "auto"
CHARS_PER_TOKEN = 4


def estimate_tokens(text: str) -> int:
    """Estimated token count of `text`: ``ceil(len(text) / 4)``; 0 for the empty string."""
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts: keep the text parts only
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def prompt_text_of(messages: Any) -> str:
    """The text of every message of a chat body, in order, joined by newlines (non-text parts dropped)."""
    if not isinstance(messages, list):
        return ""
    texts = (_content_text(m.get("content")) for m in messages if isinstance(m, dict))
    return "\n".join(t for t in texts if t)


@dataclass(frozen=True, slots=True)
class RouteContext:
    """The facts about a request that rules may match on.

    `headers` names are lower-case. `metadata` is the request's `metadata` object (string values).
    `prompt_tokens` is a real count when the caller has one; None means "estimate from prompt_text".
    """

    tenant: str
    requested_model: str
    prompt_text: str
    metadata: Mapping[str, str] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)
    prompt_tokens: int | None = None
    has_tools: bool = False
    json_response: bool = False

    @property
    def tokens(self) -> int:
        """`prompt_tokens` if given, else `estimate_tokens(prompt_text)`."""
        return self.prompt_tokens if self.prompt_tokens is not None else estimate_tokens(self.prompt_text)

    @classmethod
    def from_request(
        cls,
        body: Mapping[str, Any],
        tenant: str,
        headers: Mapping[str, str] | None = None,
        prompt_tokens: int | None = None,
    ) -> RouteContext:
        """Facts of an OpenAI chat-completions body (a parsed JSON object; not validated here).

        `model` defaults to "auto"; `tools` (or legacy `functions`) non-empty sets has_tools; a
        `response_format.type` of json_object or json_schema sets json_response.
        """
        fmt = body.get("response_format")
        fmt_type = fmt.get("type") if isinstance(fmt, dict) else None
        meta = body.get("metadata")
        return cls(
            tenant=tenant,
            requested_model=str(body.get("model") or AUTO_MODEL),
            prompt_text=prompt_text_of(body.get("messages")),
            metadata={str(k): str(v) for k, v in meta.items()} if isinstance(meta, dict) else {},
            headers={k.lower(): v for k, v in (headers or {}).items()},
            prompt_tokens=prompt_tokens,
            has_tools=bool(body.get("tools") or body.get("functions")),
            json_response=fmt_type in ("json_object", "json_schema"),
        )
