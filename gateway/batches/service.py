"""The Files and Batch APIs' operations, HTTP-free: each takes the caller's tenant and raises the gateway's errors
(`gateway.errors`), which the routes render as OpenAI's error envelope.

Every file and batch belongs to the tenant whose key created it; another tenant's id is a 404, as an unknown id is
(nothing says it exists). A batch is validated when it is created (`input.check_input`): a file that does not validate
makes a batch "failed" with its errors, as OpenAI's does; one that does has its lines put on the shared queue and is
"in_progress" (the workers answer them).

A file expires `batches.file_ttl_days` after it was created, or sooner where its upload's `expires_after` says (OpenAI's
bounds: an hour to 30 days); an expired file is a 404, as a deleted one is, and the workers' sweep deletes it
(`expiry`), never while a batch still open reads it: a batch holds its input file from before it reads it to its end.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

from gateway.batches.files import FileStore
from gateway.batches.input import InputCheck, check_input
from gateway.batches.objects import (
    BATCH_URLS,
    COMPLETION_WINDOW_S,
    OPEN,
    Batch,
    BatchFile,
    new_batch_id,
    new_file_id,
)
from gateway.batches.queue import LineQueue
from gateway.batches.store import BatchStore
from gateway.control.policy.policy_holder import PolicyHolder
from gateway.errors import BadRequest, BodyTooLarge, NotFound, TooManyRequests
from gateway.tenancy.api_keys import ApiKey

__all__ = ["EXPIRES_AFTER_S", "BatchService"]

EXPIRES_AFTER_S = (3600, 2_592_000)
"""The bounds OpenAI sets on an upload's `expires_after[seconds]` (an hour, 30 days), inclusive."""

_Owned = TypeVar("_Owned", Batch, BatchFile)


def _owned(found: _Owned | None, tenant: str, missing: str, param: str) -> _Owned:
    """`found` when `tenant` owns it; otherwise the 404 `missing`, the same as for an id that does not exist."""
    if found is None or found.tenant != tenant:
        raise NotFound(missing, param=param)
    return found


class BatchService:
    """Shares, does not own, its parts. `clock`: UTC epoch seconds."""

    def __init__(self, store: BatchStore, queue: LineQueue, files: FileStore, policies: PolicyHolder,
                 clock: Callable[[], float] = time.time) -> None:
        self._store = store
        self._queue = queue
        self._files = files
        self._policies = policies
        self._clock = clock

    @property
    def max_file_bytes(self) -> int:
        return self._policies.current.policy.batches.max_file_bytes

    async def upload(self, tenant: str, filename: str, purpose: str, content: bytes,
                     expires_after_s: int | None = None) -> BatchFile:
        """`expires_after_s`: the client's `expires_after[seconds]` (anchored at its creation); the file expires
        then, or after the policy's `file_ttl_days` if that is sooner."""
        if expires_after_s is not None and not EXPIRES_AFTER_S[0] <= expires_after_s <= EXPIRES_AFTER_S[1]:
            raise BadRequest(f"expires_after[seconds] must be between {EXPIRES_AFTER_S[0]} and {EXPIRES_AFTER_S[1]}",
                             param="expires_after[seconds]")
        if purpose != "batch":
            raise BadRequest(f"purpose {purpose!r} is not served here: this gateway keeps files for batches only "
                             "(purpose \"batch\")", param="purpose")
        if len(content) > self.max_file_bytes:
            raise BodyTooLarge(f"the file is {len(content)} bytes; the limit is {self.max_file_bytes}", param="file")
        try:
            content.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BadRequest("Invalid file format for Batch API. Must be .jsonl (UTF-8 text, one JSON request a "
                             "line)", param="file") from exc
        now = int(self._clock())
        ttl_s = self._policies.current.policy.batches.file_ttl_days * 86_400
        file = BatchFile(new_file_id(), tenant, len(content), now, filename or "input.jsonl", purpose,
                         now + min(ttl_s, expires_after_s or ttl_s))
        await asyncio.to_thread(self._files.write, file.id, content)
        await self._store.put_file(file)
        return file

    async def file(self, tenant: str, file_id: str) -> BatchFile:
        found = await self._store.file(file_id) if file_id.startswith("file-") else None
        if found is not None and found.expired(self._clock()):
            found = None  # an expired file is gone, whether or not the sweep has deleted it yet
        return _owned(found, tenant, f"No such File object: {file_id}", "file_id")

    async def content(self, tenant: str, file_id: str) -> bytes:
        file = await self.file(tenant, file_id)
        try:
            return await asyncio.to_thread(self._files.read, file.id)
        except FileNotFoundError as exc:
            raise NotFound(f"the content of {file_id} is no longer on this gateway's disk", param="file_id") from exc

    async def delete_file(self, tenant: str, file_id: str) -> dict[str, Any]:
        file = await self.file(tenant, file_id)
        await self._store.delete_file(file.id)
        await asyncio.to_thread(self._files.delete, file.id)
        return {"id": file.id, "object": "file", "deleted": True}

    async def create(self, tenant: str, input_file_id: str, endpoint: str, completion_window: str,
                     metadata: dict[str, str] | None = None, key: ApiKey | None = None) -> Batch:
        """`key`: the caller's API key; its own limits and budget apply to the batch's lines as to its requests."""
        if endpoint not in BATCH_URLS:
            raise BadRequest(f"endpoint must be one of {', '.join(BATCH_URLS)}", param="endpoint")
        if completion_window not in COMPLETION_WINDOW_S:
            raise BadRequest("completion_window must be \"24h\"", param="completion_window")
        file = await self.file(tenant, input_file_id)
        if file.purpose != "batch":
            raise BadRequest(f"{input_file_id} was not uploaded with purpose \"batch\"", param="input_file_id")
        bounds = self._policies.current.policy.batches
        batches, lines = await self._open(tenant)
        if batches >= bounds.max_open_batches:
            raise TooManyRequests(f"this tenant has {bounds.max_open_batches} batches open, the most it may; retry "
                                  "when one has finished", 60, code="batch_limit_exceeded")
        batch_id, now = new_batch_id(), int(self._clock())
        check = await self._read_held(file, batch_id, endpoint, now + bounds.claim_after_s)
        if not check.errors and lines + len(check.lines) > bounds.max_open_lines:
            await self._store.release(file.id, batch_id)
            raise TooManyRequests(f"this tenant's open batches hold {lines} lines; {len(check.lines)} more would "
                                  f"pass the {bounds.max_open_lines} it may have; retry when one has finished", 60,
                                  code="batch_limit_exceeded")
        batch = Batch(batch_id, tenant, endpoint, file.id, completion_window, now,
                      now + COMPLETION_WINDOW_S[completion_window], metadata=metadata,
                      key_id=key.id if key is not None else "", key_source=key.source if key is not None else "")
        await self._store.put_batch(batch, index=True)
        await self._store.validating(batch.id, now)
        if check.errors:
            failed = replace(batch, errors=check.errors).moved("failed", int(self._clock()))
            await self._store.put_batch(failed)
            await self._store.validated(batch.id)
            await self._store.release(file.id, batch.id)
            return failed
        await self._queue.put(batch.id, check.lines)
        started = replace(batch, total=len(check.lines)).moved("in_progress", int(self._clock()))
        await self._store.put_batch(started)
        await self._store.opened(batch.id, file.id)
        await self._store.validated(batch.id)
        return started

    async def _read_held(self, file: BatchFile, batch_id: str, endpoint: str, until: float) -> InputCheck:
        """The input file's lines, checked, read under a hold of `batch_id` until `until` (so no sweep deletes the
        file meanwhile; the caller keeps or releases it). A file deleted or expired meanwhile is a 404."""
        gone = NotFound(f"No such File object: {file.id}", param="input_file_id")
        if not await self._store.hold(file.id, batch_id, until):
            raise gone
        try:
            content = await asyncio.to_thread(self._files.read, file.id)
            return await asyncio.to_thread(check_input, content, endpoint,
                                           self._policies.current.policy.batches.max_lines)
        except BaseException as exc:
            await self._store.release(file.id, batch_id)
            if isinstance(exc, FileNotFoundError):
                raise gone from exc
            raise

    async def get(self, tenant: str, batch_id: str) -> Batch:
        found = await self._store.batch(batch_id) if batch_id.startswith("batch_") else None
        return _owned(found, tenant, f"No such Batch object: {batch_id}", "batch_id")

    async def list(self, tenant: str, after: str | None, limit: int) -> tuple[list[Batch], bool]:
        """The tenant's batches, newest first, those after the batch `after` (a cursor: the last id of a page);
        whether more follow."""
        if not 1 <= limit <= 100:
            raise BadRequest("limit must be between 1 and 100", param="limit")
        ids = await self._store.batch_ids(tenant)
        if after is not None:
            ids = ids[ids.index(after) + 1:] if after in ids else []
        page = [b for b in [await self._store.batch(i) for i in ids[:limit]] if b is not None]
        return page, len(ids) > limit

    async def cancel(self, tenant: str, batch_id: str) -> Batch:
        """A batch in progress moves to "cancelling" (its workers stop taking its lines; the next sweep ends it as
        "cancelled" once none is in flight); a finished one is refused (400), as OpenAI refuses it."""
        await self.get(tenant, batch_id)
        before = await self._store.cancel(batch_id, int(self._clock()))
        if before not in ("validating", "in_progress", "cancelling"):
            raise BadRequest(f"Cannot cancel a batch with status '{before}'.", param="batch_id",
                             code="batch_not_cancellable")
        return await self.get(tenant, batch_id)

    async def _open(self, tenant: str, scan: int = 1000) -> tuple[int, int]:
        """The tenant's unfinished batches among its newest `scan`, and the lines they hold."""
        ids = (await self._store.batch_ids(tenant))[:scan]
        found = [b for b in [await self._store.batch(i) for i in ids] if b is not None and b.status in OPEN]
        return len(found), sum(b.total for b in found)
