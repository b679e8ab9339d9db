"""Files expire: each has an `expires_at` (its creation plus the policy's `batches.file_ttl_days`, or the upload's
shorter `expires_after`), after which its GET is a 404 and a sweep of any gateway deletes its object from Redis and
its bytes from disk. A file an open batch reads (its input: validated, and read again should the batch expire) is
kept until that batch ends (`BatchStore.hold`), then deleted by the next sweep.

Two steps, each safe to repeat: the object is deleted and the id marked for unlinking in one script, then the bytes
are deleted and the mark dropped; a gateway that dies between them leaves the mark, and the next sweep (of any
gateway) deletes the bytes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from gateway.batches.files import FileStore
from gateway.batches.store import BatchStore

__all__ = ["FileExpiry"]


class FileExpiry:
    """Shares, does not own, the store and the file store. `clock`: UTC epoch seconds. `recheck_s`: how long a file
    an open batch holds waits before the sweep looks at it again."""

    def __init__(self, store: BatchStore, files: FileStore, clock: Callable[[], float] = time.time,
                 recheck_s: float = 60.0) -> None:
        self._store = store
        self._files = files
        self._clock = clock
        self._recheck_s = recheck_s

    async def sweep(self, count: int = 100) -> int:
        """Delete at most `count` files expired now, and the bytes of those deleted before; how many were deleted."""
        now = self._clock()
        deleted = 0
        for file_id in await self._store.expiring(now, count):
            deleted += await self._store.expire(file_id, now, now + self._recheck_s)
        for file_id in await self._store.unlinked(count):
            await asyncio.to_thread(self._files.delete, file_id)
            await self._store.unlink_done(file_id)
        return deleted
