"""Requests generated from the gateway's own request models' JSON Schemas (the ones `/openapi.json`
publishes: chat, Responses, completions), with every optional field also drawn absent or `null`: what a client
reading that schema may send.

`requests(overrides)` narrows named properties (at any depth) to values the test can afford, for example a
routable `model` and a small `max_tokens`; everything else follows the schema as written.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hypothesis import strategies as st
from pydantic import BaseModel

from gateway.serving.openai.schema import ChatRequest

__all__ = ["from_schema", "requests"]

Strategy = st.SearchStrategy[Any]
_KEYS = st.from_regex(r"[a-z]{1,8}", fullmatch=True)
_TEXT = st.text(max_size=24)


def _number(schema: Mapping[str, Any], integer: bool) -> Strategy:
    low, high = schema.get("minimum"), schema.get("maximum")
    if "exclusiveMinimum" in schema:
        low = schema["exclusiveMinimum"] + 1 if integer else schema["exclusiveMinimum"]
    if integer:
        return st.integers(low if low is not None else -64, high if high is not None else 64)
    return st.floats(low if low is not None else -64.0, high if high is not None else 64.0, allow_nan=False,
                     exclude_min="exclusiveMinimum" in schema)


def _object(schema: Mapping[str, Any], defs: Mapping[str, Any], overrides: Mapping[str, Strategy]) -> Strategy:
    props = schema.get("properties") or {}
    if not props:
        extra = schema.get("additionalProperties")
        values = from_schema(extra, defs, overrides) if isinstance(extra, dict) else _TEXT
        return st.dictionaries(_KEYS, values, max_size=3)
    required = set(schema.get("required") or ())

    def value(name: str, sub: Mapping[str, Any]) -> Strategy:
        return overrides[name] if name in overrides else from_schema(sub, defs, overrides)

    return st.fixed_dictionaries(
        {name: value(name, sub) for name, sub in props.items() if name in required},
        optional={name: value(name, sub) | st.none() for name, sub in props.items() if name not in required},
    )


def from_schema(schema: Mapping[str, Any], defs: Mapping[str, Any],
                overrides: Mapping[str, Strategy] | None = None) -> Strategy:
    """Values valid under `schema` (the subset of JSON Schema pydantic emits)."""
    overrides = overrides or {}
    if "$ref" in schema:
        return from_schema(defs[schema["$ref"].rsplit("/", 1)[-1]], defs, overrides)
    if "anyOf" in schema:
        return st.one_of([from_schema(s, defs, overrides) for s in schema["anyOf"]])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if "const" in schema:
        return st.just(schema["const"])
    kind = schema.get("type")
    if kind == "string":
        return st.text(min_size=schema.get("minLength", 0), max_size=24)
    if kind in ("integer", "number"):
        return _number(schema, kind == "integer")
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    if kind == "array":
        items = from_schema(schema.get("items") or {}, defs, overrides)
        return st.lists(items, min_size=schema.get("minItems", 0), max_size=max(3, schema.get("minItems", 0)))
    if kind == "object":
        return _object(schema, defs, overrides)
    return _TEXT


def requests(overrides: Mapping[str, Strategy] | None = None, model: type[BaseModel] = ChatRequest) -> Strategy:
    """Request bodies valid under `model`'s JSON Schema (a chat request unless said: `ResponsesRequest`,
    `CompletionsRequest`), optional fields absent, `null` or set."""
    schema = model.model_json_schema()
    return from_schema(schema, schema.get("$defs") or {}, overrides)
