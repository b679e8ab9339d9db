"""Which GenAI provider serves a pool, as the OpenTelemetry GenAI conventions name it (`gen_ai.provider.name`).

A local pool is served by vLLM engines the gateway starts: "vllm". A remote pool says so itself (`provider:`), else
its first URL's host decides for the well-known APIs (api.openai.com: "openai", *.openai.azure.com:
"azure.ai.openai", api.anthropic.com: "anthropic", ...); any other host gets "openai": the conventions name the
provider by what the client knows, and the gateway speaks the OpenAI API to it. Pure.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from policies.pools import LocalPool, RemotePool
from policies.schema import Policy

__all__ = ["LOCAL_PROVIDER", "pool_provider", "provider_name"]

LOCAL_PROVIDER = "vllm"
_BY_HOST = (  # (host suffix, provider): the conventions' well-known values
    ("api.openai.com", "openai"),
    (".openai.azure.com", "azure.ai.openai"),
    ("api.anthropic.com", "anthropic"),
    ("api.mistral.ai", "mistral_ai"),
    ("api.groq.com", "groq"),
    ("api.deepseek.com", "deepseek"),
    ("api.x.ai", "x_ai"),
    ("api.perplexity.ai", "perplexity"),
    ("generativelanguage.googleapis.com", "gcp.gemini"),
    ("aiplatform.googleapis.com", "gcp.vertex_ai"),
    (".amazonaws.com", "aws.bedrock"),
    ("api.cohere.com", "cohere"),
)


def provider_name(spec: LocalPool | RemotePool) -> str:
    """`gen_ai.provider.name` of the pool's engine calls (see the module docstring)."""
    if isinstance(spec, LocalPool):
        return LOCAL_PROVIDER
    if spec.provider is not None:
        return spec.provider
    host = (urlsplit(spec.urls[0]).hostname or "").lower()
    return next((name for suffix, name in _BY_HOST if host == suffix.lstrip(".") or host.endswith(suffix)), "openai")


def pool_provider(policy: Policy, pool: str) -> str | None:
    """`provider_name` of `policy`'s pool `pool`; None where it has no such pool."""
    spec = policy.pools.get(pool)
    return None if spec is None else provider_name(spec)
