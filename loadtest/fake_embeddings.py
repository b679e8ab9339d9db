"""The fake upstream's `/v1/embeddings`, shaped as vLLM 0.32's pooling runner answers it.

One embedding per input (a string, a list of strings, a token array or a list of token arrays), `DIMENSIONS` floats
each unless `dimensions` asks for fewer, derived from the input's hash (the same input, the same vector), as a list
of floats or, with `encoding_format: base64`, their little-endian float32 bytes in base64; `usage` counts one token
per whitespace-separated word (at least one per input) or a token array's length, as `prompt_tokens` and
`total_tokens`. Refused as vLLM refuses them (400, the OpenAI envelope): no input, an empty list, `dimensions` above
`DIMENSIONS`.
"""

from __future__ import annotations

import base64
import hashlib
import struct
from typing import Any

import orjson

__all__ = ["DIMENSIONS", "embeddings_json", "vector_of"]

DIMENSIONS = 8


def _error(message: str) -> tuple[int, bytes]:
    return 400, orjson.dumps({"error": {"message": message, "type": "BadRequestError", "param": None, "code": 400}})


def vector_of(item: str | list[int], dimensions: int = DIMENSIONS) -> list[float]:
    """The fake's embedding of one input: `dimensions` floats in [-1, 1) from its SHA-256, each a multiple of 1/128
    (exact in float32: a base64 answer decodes to the same numbers)."""
    digest = hashlib.sha256(orjson.dumps(item)).digest()
    return [digest[i % len(digest)] / 128 - 1 for i in range(dimensions)]


def _tokens(item: str | list[int]) -> int:
    return max(1, len(item.split())) if isinstance(item, str) else len(item)


def embeddings_json(req: dict[str, Any], model: str) -> tuple[int, bytes]:
    """(status, body) of the fake's answer to the embeddings request `req`."""
    given = req.get("input")
    items = [given] if isinstance(given, str) or (isinstance(given, list) and given and isinstance(given[0], int)) \
        else given
    if not isinstance(items, list) or not items:
        return _error("You must pass at least one prompt")
    dimensions = req.get("dimensions") or DIMENSIONS
    if not isinstance(dimensions, int) or dimensions > DIMENSIONS:
        return _error(f"dimensions must be at most {DIMENSIONS}, got {dimensions!r}")
    data = []
    for index, item in enumerate(items):
        vector = vector_of(item, dimensions)
        encoded: list[float] | str = vector if req.get("encoding_format") != "base64" else (
            base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode())
        data.append({"index": index, "object": "embedding", "embedding": encoded})
    tokens = sum(_tokens(item) for item in items)
    return 200, orjson.dumps({"id": "embd-fake", "object": "list", "created": 0, "model": req.get("model", model),
                              "data": data, "usage": {"prompt_tokens": tokens, "total_tokens": tokens,
                                                      "completion_tokens": 0, "prompt_tokens_details": None}})
