"""A tenant's `cache:` section: answers kept in Redis and served again, at no engine cost.

Off unless a tenant sets it. Two modes:

- `exact`: the same request (messages and sampling fields) to the same model gets the same answer back. Only
  requests whose answer is determined by the request are kept: temperature 0, or a `seed`, and no tools (a tool
  call may have side effects the client expects to happen again).
- `semantic`: the latest user message may differ, the rest of the request not; the nearest kept prompt by the
  router's own embedding answers when its cosine similarity reaches `min_similarity`. Per tenant and model,
  never across tenants. The same requests are eligible as in `exact` mode.

Cached answers are the tenant's users' data: keep them only where that is allowed, for a TTL you can promise.
"""

from __future__ import annotations

from typing import Literal, Self

from pydantic import Field, model_validator

from policies.frozen import Frozen

__all__ = ["SEMANTIC_MAX_ENTRIES", "ResponseCache"]

SEMANTIC_MAX_ENTRIES = 4096
"""Bound of a semantic cache: every lookup reads and scans all of its tenant's vectors for the model."""


class ResponseCache(Frozen):
    """Where the answers of one tenant are kept and for how long. Times in seconds."""

    mode: Literal["exact", "semantic"] = Field(description="exact: the same request; semantic: the nearest "
                                               "latest user message by the router's embedding, the rest the same")
    ttl_s: int = Field(default=3600, ge=1, le=30 * 86_400, description="seconds an answer is served again")
    max_entries: int | None = Field(default=None, ge=1, le=1_000_000, description="answers kept per tenant "
                                    "(semantic: per tenant and model); the oldest go first. Default 10,000 "
                                    f"(exact), 1,024 (semantic, at most {SEMANTIC_MAX_ENTRIES})")
    min_similarity: float | None = Field(default=None, gt=0, le=1, description="semantic only, required: the "
                                         "cosine similarity a kept prompt needs to answer (BENCHMARKS.md, "
                                         "'Response cache', measures false hits against it)")

    @model_validator(mode="after")
    def _mode_fields(self) -> Self:
        if self.mode == "semantic":
            if self.min_similarity is None:
                raise ValueError("a semantic cache needs min_similarity (e.g. 0.99: see BENCHMARKS.md, "
                                 "'Response cache')")
            if self.max_entries is not None and self.max_entries > SEMANTIC_MAX_ENTRIES:
                raise ValueError(f"max_entries of a semantic cache is at most {SEMANTIC_MAX_ENTRIES} (each lookup "
                                 "scans them all)")
        elif self.min_similarity is not None:
            raise ValueError("min_similarity applies to mode: semantic only")
        return self

    @property
    def entries(self) -> int:
        """`max_entries`, or the mode's default."""
        if self.max_entries is not None:
            return self.max_entries
        return 10_000 if self.mode == "exact" else 1024
