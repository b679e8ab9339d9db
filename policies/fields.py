"""The keys a policy model accepts at a YAML path, for "did you mean" hints on misspelt keys. Pure.

Paths are pydantic error locations, discriminator tags included (``("pools", "micro", "local", "engine")``):
a tag picks the member of a tagged union whose `type` (or, for speculative decoding, `method`) is that tag.
"""

from __future__ import annotations

import difflib
import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, Tag

__all__ = ["did_you_mean", "keys_at"]

_TAG_FIELDS = ("type", "method")


def _member_with_tag(members: tuple[Any, ...], tag: str) -> Any:
    for member in members:
        if get_origin(member) is Annotated and any(isinstance(m, Tag) and m.tag == tag for m in get_args(member)):
            return get_args(member)[0]  # a member of a callable-discriminated union (pydantic `Tag`)
        fields = member.model_fields if isinstance(member, type) and issubclass(member, BaseModel) else {}
        for field in (fields.get(name) for name in _TAG_FIELDS):
            if field is not None and get_origin(field.annotation) is Literal and tag in get_args(field.annotation):
                return member
    return None


def _child(node: Any, part: int | str) -> tuple[Any, bool]:
    """(the type one step down `part`, whether `part` was consumed); (None, True) when there is none."""
    origin = get_origin(node)
    if origin is Annotated:
        return get_args(node)[0], False
    if origin in (Union, types.UnionType):
        members = tuple(a for a in get_args(node) if a is not type(None))
        tagged = _member_with_tag(members, part) if isinstance(part, str) else None
        if tagged is not None:
            return tagged, True
        return (members[0], False) if len(members) == 1 else (None, True)
    if origin is dict:
        return get_args(node)[1], True
    if origin is tuple and isinstance(part, int):
        return get_args(node)[0], True
    if isinstance(node, type) and issubclass(node, BaseModel) and isinstance(part, str) and part in node.model_fields:
        return node.model_fields[part].annotation, True
    return None, True


def keys_at(model: type[BaseModel], loc: tuple[int | str, ...]) -> list[str]:
    """The keys the mapping at `loc` (under `model`) accepts; empty when `loc` is not a model."""
    node: Any = model
    parts = list(loc)
    while parts:
        node, consumed = _child(node, parts[0])
        if node is None:
            return []
        if consumed:
            parts.pop(0)
    while get_origin(node) in (Annotated, Union, types.UnionType):
        node, _ = _child(node, "")
    return list(node.model_fields) if isinstance(node, type) and issubclass(node, BaseModel) else []


def did_you_mean(name: str, keys: list[str]) -> str | None:
    """The key closest to a misspelt `name`, or None when none is close."""
    close = difflib.get_close_matches(name, keys, n=1, cutoff=0.6)
    return close[0] if close else None
