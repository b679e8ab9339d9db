"""A batch's end: its output file (the lines answered 2xx, in input order), its error file (the others, and on expiry
every line not answered, with OpenAI's `batch_expired` error), and its last status: "completed" (every line answered),
"expired" (the completion window passed first) or "cancelled" (cancelled: what was answered is kept).

One finalizer at a time per batch (a lock in Redis with a time to live): a finalizer that dies leaves the batch
"finalizing", and the next sweep of any worker finishes it again; the files' ids are the batch's, so a second try
rewrites the same files instead of leaving orphans.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import replace

import orjson

from gateway.batches.files import FileStore
from gateway.batches.input import check_input
from gateway.batches.objects import FINISHED, Batch, BatchFile
from gateway.batches.queue import LineQueue
from gateway.batches.store import BatchStore
from gateway.control.policy.policy_holder import PolicyHolder

__all__ = ["Finalizer", "ending_of"]


def ending_of(batch: Batch, now: float) -> str | None:
    """The status `batch` ends in now, or None while it still runs."""
    if batch.status == "cancelling":
        return "cancelled"
    if batch.status in ("in_progress", "finalizing") and batch.answered >= batch.total:
        return "completed"
    if batch.status in ("in_progress", "finalizing") and now >= batch.expires_at:
        return "expired"
    return None


class Finalizer:
    """Shares, does not own, the store, queue and file store. `holder` names this process on the lock; the output
    and error files expire `batches.file_ttl_days` after they are written."""

    def __init__(self, store: BatchStore, queue: LineQueue, files: FileStore, policies: PolicyHolder, holder: str,
                 clock: Callable[[], float] = time.time) -> None:
        self._store = store
        self._queue = queue
        self._files = files
        self._policies = policies
        self._holder = holder
        self._clock = clock

    async def finish(self, batch_id: str) -> Batch | None:
        """End the batch if it is due (`ending_of`) and no other process is ending it; the batch after."""
        if not await self._store.lock_final(batch_id, self._holder):
            return None
        try:
            batch = await self._store.batch(batch_id)
            if batch is None or batch.status in FINISHED:
                await self._store.closed(batch_id, batch.input_file_id if batch is not None else "")
                return batch
            now = self._clock()
            ending = "cancelled" if batch.status == "cancelling" else ending_of(batch, now)
            if ending is None:
                return batch
            if batch.status == "in_progress":
                batch = batch.moved("finalizing", int(now))
                await self._store.set_status(batch)
            batch = await self._write(batch, ending)
            await self._store.set_status(batch.moved(ending, int(self._clock())))
            await self._store.closed(batch_id, batch.input_file_id)
            await self._queue.drop(batch_id)
            return await self._store.batch(batch_id)
        finally:
            await self._store.unlock_final(batch_id)

    async def _write(self, batch: Batch, ending: str) -> Batch:
        answers = await self._store.answers(batch.id)
        ok = [line[1:] for _, line in sorted(answers.items()) if line[:1] == b"1"]
        failed = {index: line[1:] for index, line in answers.items() if line[:1] != b"1"}
        if ending == "expired":
            failed |= await self._expired_lines(batch, set(answers))
        output = await self._file(batch, "output", ok) if ok else ""
        errors = await self._file(batch, "errors", [failed[i] for i in sorted(failed)]) if failed else ""
        return replace(batch, output_file_id=output, error_file_id=errors)

    async def _expired_lines(self, batch: Batch, answered: set[int]) -> dict[int, bytes]:
        content = await asyncio.to_thread(self._files.read, batch.input_file_id)
        lines = (await asyncio.to_thread(check_input, content, batch.endpoint, max(batch.total, 1))).lines
        error = {"code": "batch_expired", "message": "This request could not be executed before the completion "
                 "window expired."}
        return {line.index: orjson.dumps({"id": f"batch_req_{batch.id.removeprefix('batch_')}_{line.index}",
                                          "custom_id": line.custom_id, "response": None, "error": error})
                for line in lines if line.index not in answered}

    async def _file(self, batch: Batch, kind: str, lines: list[bytes]) -> str:
        file_id = f"file-{batch.id.removeprefix('batch_')}-{kind}"
        content = b"".join(line + b"\n" for line in lines)
        await asyncio.to_thread(self._files.write, file_id, content)
        now = int(self._clock())
        ttl_s = self._policies.current.policy.batches.file_ttl_days * 86_400
        await self._store.put_file(BatchFile(file_id, batch.tenant, len(content), now, f"{batch.id}_{kind}.jsonl",
                                             "batch_output", now + ttl_s))
        return file_id
