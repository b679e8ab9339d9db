"""A batch input or output file and a batch, as the OpenAI API shows them, and as Redis keeps them (flat strings).

Statuses are OpenAI's: validating -> in_progress -> finalizing -> completed; failed (the input did not validate);
expired (the completion window passed first); cancelling -> cancelled. Times are UTC epoch seconds (int).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

import orjson

__all__ = ["BATCH_URLS", "COMPLETION_WINDOW_S", "FINISHED", "OPEN", "Batch", "BatchFile", "new_batch_id",
           "new_file_id"]

BATCH_URLS = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings")
"""The urls OpenAI's batches take, each served here as an interactive request to it is (`/v1/embeddings` by the
tenant's embedding pool: `gateway.batches.runner`)."""
COMPLETION_WINDOW_S = {"24h": 86_400}
FINISHED = frozenset({"completed", "failed", "expired", "cancelled"})
OPEN = frozenset({"validating", "in_progress", "finalizing", "cancelling"})


def new_file_id() -> str:
    return "file-" + os.urandom(12).hex()


def new_batch_id() -> str:
    return "batch_" + os.urandom(12).hex()


@dataclass(frozen=True, slots=True)
class BatchFile:
    """A file of the Files API. `tenant` owns it (never shown); its bytes live at `FileStore.path(id)`. It is gone
    once `expires_at` passes (UTC epoch s; 0: a file written before files expired, which never does)."""

    id: str
    tenant: str
    size: int  # bytes
    created_at: int
    filename: str
    purpose: str  # "batch" (an upload) or "batch_output" (a batch's output or error file)
    expires_at: int = 0

    def expired(self, now: float) -> bool:
        return 0 < self.expires_at <= now

    def public(self) -> dict[str, Any]:
        return {"id": self.id, "object": "file", "bytes": self.size, "created_at": self.created_at,
                "filename": self.filename, "purpose": self.purpose, "status": "processed", "status_details": None,
                "expires_at": self.expires_at or None}

    def to_fields(self) -> dict[str, str]:
        return {f.name: str(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_fields(cls, raw: Mapping[bytes, bytes]) -> BatchFile:
        text = {k.decode(): v.decode() for k, v in raw.items()}
        return cls(text["id"], text["tenant"], int(text["size"]), int(text["created_at"]), text["filename"],
                   text["purpose"], int(text.get("expires_at", "0")))


@dataclass(frozen=True, slots=True)
class Batch:
    """A batch. `total`, `completed` and `failed` are its request counts (lines answered 2xx, and otherwise);
    `errors` the input's validation errors (OpenAI's `{code, message, param, line}`), `metadata` the client's."""

    id: str
    tenant: str
    endpoint: str
    input_file_id: str
    completion_window: str
    created_at: int
    expires_at: int
    status: str = "validating"
    total: int = 0
    completed: int = 0
    failed: int = 0
    input_tokens: int = 0  # of the lines answered 2xx, as their answers' usage says
    output_tokens: int = 0
    output_file_id: str = ""
    error_file_id: str = ""
    in_progress_at: int = 0  # to cancelled_at: when the batch reached that status (UTC epoch seconds); 0: not reached
    finalizing_at: int = 0
    completed_at: int = 0
    failed_at: int = 0
    expired_at: int = 0
    cancelling_at: int = 0
    cancelled_at: int = 0
    errors: tuple[dict[str, Any], ...] = ()
    metadata: dict[str, str] | None = field(default=None, hash=False)
    key_id: str = ""  # the API key that created it (never shown): its limits and budget apply to the lines too
    key_source: str = ""  # that key's `ApiKey.source`: "policy" or "issued" ("" without a key)

    @property
    def answered(self) -> int:
        return self.completed + self.failed

    def public(self) -> dict[str, Any]:
        """The OpenAI batch object."""
        times = {name: getattr(self, name) or None for name in (
            "in_progress_at", "finalizing_at", "completed_at", "failed_at", "expired_at", "cancelling_at",
            "cancelled_at")}
        errors = {"object": "list", "data": list(self.errors)} if self.errors else None
        return {"id": self.id, "object": "batch", "endpoint": self.endpoint, "errors": errors,
                "input_file_id": self.input_file_id, "completion_window": self.completion_window,
                "status": self.status, "output_file_id": self.output_file_id or None,
                "error_file_id": self.error_file_id or None, "created_at": self.created_at,
                "expires_at": self.expires_at, **times,
                "request_counts": {"total": self.total, "completed": self.completed, "failed": self.failed},
                "usage": {"input_tokens": self.input_tokens, "input_tokens_details": {"cached_tokens": 0},
                          "output_tokens": self.output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                          "total_tokens": self.input_tokens + self.output_tokens},
                "metadata": self.metadata}

    def moved(self, status: str, at: int) -> Batch:
        """This batch in `status` since `at` (its `<status>_at` time set, where OpenAI's object has one)."""
        stamp = f"{status}_at"
        changes: dict[str, Any] = {"status": status}
        if stamp in _TIMES:
            changes[stamp] = at
        return replace(self, **changes)

    def to_fields(self) -> dict[str, str]:
        out = {f.name: str(getattr(self, f.name)) for f in fields(self) if f.name not in ("errors", "metadata")}
        out["errors"] = orjson.dumps(list(self.errors)).decode()
        out["metadata"] = orjson.dumps(self.metadata).decode()
        return out

    @classmethod
    def from_fields(cls, raw: Mapping[bytes, bytes]) -> Batch:
        text = {k.decode(): v.decode() for k, v in raw.items()}
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name == "errors":
                values[f.name] = tuple(orjson.loads(text.get("errors", "[]")))
            elif f.name == "metadata":
                values[f.name] = orjson.loads(text.get("metadata", "null"))
            elif f.name in _INTS:
                values[f.name] = int(text.get(f.name, "0"))
            else:
                values[f.name] = text.get(f.name, "")
        return cls(**values)


_INTS = frozenset(f.name for f in fields(Batch) if f.type == "int")
_TIMES = frozenset(name for name in _INTS if name.endswith("_at") and name not in ("created_at", "expires_at"))
