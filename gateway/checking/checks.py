"""The output checks, one function each: does one choice of a chat.completion hold what the request asked for?

Pure: no I/O. Each returns True when the choice passes; a check that does not apply to the request passes
(`applies` says which apply). `policies.output_checks` says what each check means to ops.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from typing import Any

import orjson

from gateway.checking.schemas import response_schema, tool_schemas, validator
from policies.output_checks import Repetition

__all__ = ["TAIL_WORDS", "applies", "empty_ok", "json_ok", "repetition_ok", "tool_calls_ok"]

TAIL_WORDS = 200  # the repetition check looks at the last this many words of an answer
_WORD = re.compile(r"\S+")


def applies(check: str, raw: Mapping[str, Any]) -> bool:
    """Whether `check` judges answers to this request: json only when it asks for JSON, tool_calls only when it
    offers tools; empty and repetition always."""
    if check == "json":
        return response_schema(raw) is not None
    if check == "tool_calls":
        return bool(raw.get("tools"))
    return True


def json_ok(message: Mapping[str, Any], raw: Mapping[str, Any]) -> bool:
    """`json_object`: the content parses as a JSON object; `json_schema`: it parses and validates. An answer that
    is only tool calls is judged by the tool_calls check instead."""
    wanted = response_schema(raw)
    if wanted is None or (message.get("tool_calls") and not message.get("content")):
        return True
    content = message.get("content")
    if not isinstance(content, str):
        return False
    try:
        value = orjson.loads(content)
    except orjson.JSONDecodeError:
        return False
    if wanted[0] == "json_object":
        return isinstance(value, dict)
    return bool(validator(wanted[1]).is_valid(value))


def tool_calls_ok(message: Mapping[str, Any], raw: Mapping[str, Any]) -> bool:
    """Each tool call names a function tool of the request, and its arguments parse as a JSON object that
    validates against that tool's `parameters`."""
    calls = message.get("tool_calls") or ()
    if not calls:
        return True
    tools = tool_schemas(raw)
    for call in calls:
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or function.get("name") not in tools:
            return False
        arguments = function.get("arguments")
        try:
            value = orjson.loads(arguments) if isinstance(arguments, str) else None
        except orjson.JSONDecodeError:
            return False
        if not isinstance(value, dict) or not validator(tools[function["name"]]).is_valid(value):
            return False
    return True


def empty_ok(message: Mapping[str, Any]) -> bool:
    """Some text (not only whitespace) or a tool call."""
    content = message.get("content")
    return bool(message.get("tool_calls")) or (isinstance(content, str) and not content.isspace() and content != "")


def repetition_ok(message: Mapping[str, Any], finish_reason: str | None, loop: Repetition) -> bool:
    """False for an answer cut by its token limit whose last `TAIL_WORDS` words repeat one `loop.ngram`-word
    n-gram at least `loop.max_repeats` times. Answers that stopped by themselves pass: a loop the model left is
    no longer a loop."""
    content = message.get("content")
    if finish_reason != "length" or not isinstance(content, str):
        return True
    words = _WORD.findall(content)[-TAIL_WORDS:]
    if len(words) < 8 and len(content) >= 64:  # no spaces (CJK, a run of symbols): characters are the words
        words = list(content[-TAIL_WORDS:])
    n = loop.ngram
    grams = Counter(tuple(words[i:i + n]) for i in range(len(words) - n + 1))
    return not grams or grams.most_common(1)[0][1] < loop.max_repeats
