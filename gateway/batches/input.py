"""A batch input file's lines, checked as OpenAI checks them when a batch is created.

A file fails validation as a whole (the batch's status "failed", its `errors` OpenAI's `{code, message, param, line}`,
line numbers from 1) for: a line that is not a JSON object (`invalid_json_line`), one without `custom_id`, `method`,
`url` or an object `body` (`missing_required_parameter`), a method other than POST (`invalid_method`), a url the Batch
API does not take (`invalid_url`) or other than the batch's endpoint (`url_mismatch`), a `custom_id` seen before
(`duplicate_custom_id`), no line at all (`empty_file`), more lines than the policy allows (`too_many_tasks`). A body
the endpoint would refuse is not checked here: that line is answered in the error file and the batch goes on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from gateway.batches.objects import BATCH_URLS

__all__ = ["MAX_ERRORS", "BatchLine", "InputCheck", "check_input"]

MAX_ERRORS = 100
"""Validation errors kept on a failed batch (the first ones)."""


@dataclass(frozen=True, slots=True)
class BatchLine:
    """One request of a batch: its 0-based `index` in the input file and what the client sent."""

    index: int
    custom_id: str
    url: str
    body: dict[str, Any]

    def to_bytes(self) -> bytes:
        return orjson.dumps({"i": self.index, "c": self.custom_id, "u": self.url, "b": self.body})

    @classmethod
    def from_bytes(cls, raw: bytes) -> BatchLine:
        data = orjson.loads(raw)
        return cls(int(data["i"]), str(data["c"]), str(data["u"]), dict(data["b"]))


@dataclass(frozen=True, slots=True)
class InputCheck:
    lines: tuple[BatchLine, ...]
    errors: tuple[dict[str, Any], ...]


def _error(code: str, message: str, line: int | None, param: str | None = None) -> dict[str, Any]:
    return {"code": code, "message": message, "param": param, "line": line}


def _line_error(number: int, raw: bytes, endpoint: str) -> tuple[BatchLine | None, dict[str, Any] | None]:
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        data = None
    if not isinstance(data, dict):
        return None, _error("invalid_json_line", "This line is not parseable as valid JSON.", number)
    for name in ("custom_id", "method", "url", "body"):
        if name not in data:
            return None, _error("missing_required_parameter", f"This line is missing the required parameter "
                                f"'{name}'.", number, name)
    custom_id, url, body = data["custom_id"], data["url"], data["body"]
    if not isinstance(custom_id, str) or not custom_id or not isinstance(body, dict):
        name = "body" if isinstance(custom_id, str) and custom_id else "custom_id"
        return None, _error("invalid_request", f"'{name}' must be a non-empty string (custom_id) or an object "
                            "(body).", number, name)
    if data["method"] != "POST":
        return None, _error("invalid_method", "The method of a batch request must be POST.", number, "method")
    if url not in BATCH_URLS:
        return None, _error("invalid_url", f"The url {url!r} is not one the Batch API takes: "
                            f"{', '.join(BATCH_URLS)}.", number, "url")
    if url != endpoint:
        return None, _error("url_mismatch", f"The url {url!r} of this request does not match the batch's "
                            f"endpoint {endpoint!r}.", number, "url")
    return BatchLine(number - 1, custom_id, url, body), None


def check_input(content: bytes, endpoint: str, max_lines: int) -> InputCheck:
    """The file's lines (blank lines skipped, numbers kept), or its first `MAX_ERRORS` errors."""
    lines: list[BatchLine] = []
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()
    for number, raw in enumerate(content.split(b"\n"), start=1):
        if not raw.strip():
            continue
        line, error = _line_error(number, raw, endpoint)
        if line is not None and line.custom_id in seen:
            line, error = None, _error("duplicate_custom_id", "The custom_id for this request is a duplicate of "
                                       "another request. The custom_id parameter must be unique for each request "
                                       "in a batch.", number, "custom_id")
        if error is not None:
            errors.append(error)
            if len(errors) >= MAX_ERRORS:
                break
        elif line is not None:
            seen.add(line.custom_id)
            lines.append(line)
    if not lines and not errors:
        errors.append(_error("empty_file", "The input file has no requests.", None))
    if len(lines) > max_lines:
        errors.append(_error("too_many_tasks", f"The input file has {len(lines)} requests; a batch takes at most "
                             f"{max_lines}.", None))
    return InputCheck(tuple(lines) if not errors else (), tuple(errors))
