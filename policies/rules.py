"""Routing rules: `match` conditions (all must hold) and a target (`pool` or `threshold`).

Matching is pure. `RuleMatch.why_not` returns None when a request matches, or the first failing
condition in words (what `cascade policy explain` prints). Conditions:

- `tenants`, `models`: the tenant / requested model name is one of these;
- `metadata`: for every key, the request's `metadata[key]` is one of the listed values;
- `headers`: for every header name (case-insensitive), the header is present and the regex finds a match;
- `min/max_prompt_chars`, `min/max_prompt_tokens` (inclusive; tokens as `RouteContext.tokens`);
- `keywords`: any keyword occurs, case-insensitive; `regex`: any pattern finds a match (`re.search`,
  case-sensitive unless the pattern says ``(?i)``), compiled once when the policy loads;
- `has_tools`, `json_response`: the request has tools / asks for a JSON response format (or not, if false);
- `min_score`, `max_score` (inclusive): the classifier's score lies in the range. A request without a
  score never matches a rule with a score range.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, field_validator

from policies.context import RouteContext
from policies.frozen import Frozen

__all__ = ["Regex", "Rule", "RuleMatch"]


def _compile(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return re.compile(value)
    except re.error as exc:
        raise ValueError(f"bad regular expression {value!r}: {exc}; escape special characters with \\") from exc


Regex = Annotated[re.Pattern[str], BeforeValidator(_compile)]


def _not_in(what: str, value: object, allowed: tuple[str, ...] | None) -> str | None:
    return None if allowed is None or value in allowed else f"{what} {value!r} not in {list(allowed)}"


def _outside(what: str, value: float, low: float | None, high: float | None) -> str | None:
    if low is not None and value < low:
        return f"{what} {value} < min {low}"
    if high is not None and value > high:
        return f"{what} {value} > max {high}"
    return None


class RuleMatch(Frozen):
    """All given conditions must hold (AND). An empty match always matches (a catch-all)."""

    tenants: tuple[str, ...] | None = None
    models: tuple[str, ...] | None = Field(default=None, description="requested model names/aliases")
    metadata: dict[str, tuple[str, ...]] | None = Field(default=None, description="metadata key -> allowed values")
    headers: dict[str, Regex] | None = Field(default=None, description="header name -> regex the value must match")
    min_prompt_chars: int | None = Field(default=None, ge=0)
    max_prompt_chars: int | None = Field(default=None, ge=0)
    min_prompt_tokens: int | None = Field(default=None, ge=0, description="counted, or estimated as ceil(chars/4)")
    max_prompt_tokens: int | None = Field(default=None, ge=0)
    keywords: tuple[str, ...] | None = Field(default=None, description="any keyword, case-insensitive")
    regex: tuple[Regex, ...] | None = Field(default=None, description="any pattern matches (re.search)")
    has_tools: bool | None = None
    json_response: bool | None = Field(default=None, description="response_format json_object / json_schema")
    min_score: float | None = Field(default=None, ge=0, le=1)
    max_score: float | None = Field(default=None, ge=0, le=1)

    @field_validator("headers", mode="after")
    @classmethod
    def _lower_header_names(cls, value: dict[str, re.Pattern[str]] | None) -> dict[str, re.Pattern[str]] | None:
        return None if value is None else {k.lower(): v for k, v in value.items()}

    @property
    def is_catch_all(self) -> bool:
        """True when no condition is set: the rule matches every request."""
        return all(v is None for v in self.__dict__.values())

    @property
    def has_score_range(self) -> bool:
        return self.min_score is not None or self.max_score is not None

    def why_not(self, ctx: RouteContext, score: float | None, check_score: bool = True) -> str | None:
        """None when `ctx` (and `score`, if `check_score`) meets every condition, else the first failure."""
        for check in (self._who_fails, self._size_fails, self._content_fails):
            failure = check(ctx)
            if failure is not None:
                return failure
        if check_score and self.has_score_range:
            if score is None:
                return "no score (the rule has a score range)"
            return _outside("score", round(score, 4), self.min_score, self.max_score)
        return None

    def _who_fails(self, ctx: RouteContext) -> str | None:
        failure = _not_in("tenant", ctx.tenant, self.tenants) or _not_in("model", ctx.requested_model, self.models)
        if failure:
            return failure
        for key, allowed in (self.metadata or {}).items():
            failure = _not_in(f"metadata[{key!r}]", ctx.metadata.get(key), allowed)
            if failure:
                return failure
        for name, pattern in (self.headers or {}).items():
            value = ctx.headers.get(name)
            if value is None:
                return f"header {name!r} absent"
            if not pattern.search(value):
                return f"header {name!r} value {value!r} does not match /{pattern.pattern}/"
        return None

    def _size_fails(self, ctx: RouteContext) -> str | None:
        chars = _outside("prompt chars", len(ctx.prompt_text), self.min_prompt_chars, self.max_prompt_chars)
        return chars or _outside("prompt tokens", ctx.tokens, self.min_prompt_tokens, self.max_prompt_tokens)

    def _content_fails(self, ctx: RouteContext) -> str | None:
        if self.keywords is not None:
            lowered = ctx.prompt_text.lower()
            if not any(k.lower() in lowered for k in self.keywords):
                return f"none of the keywords {list(self.keywords)}"
        if self.regex is not None and not any(p.search(ctx.prompt_text) for p in self.regex):
            return f"no regex matches: {[p.pattern for p in self.regex]}"
        if self.has_tools is not None and ctx.has_tools != self.has_tools:
            return "request has tools" if ctx.has_tools else "request has no tools"
        if self.json_response is not None and ctx.json_response != self.json_response:
            return "JSON response format requested" if ctx.json_response else "no JSON response format"
        return None


class Rule(Frozen):
    """When `match` holds: send to `pool`, or route by score with `threshold` (exactly one of the two)."""

    name: str = Field(min_length=1)
    match: RuleMatch = RuleMatch()
    pool: str | None = Field(default=None, description="send matching requests to this pool")
    threshold: float | None = Field(default=None, ge=0, le=1, description="or route by score with this threshold")
