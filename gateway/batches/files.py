"""The bytes of batch files on disk: `<folder>/<file id>.jsonl`, written whole (a temporary file renamed in place,
fsynced), so a reader never sees half a file and a crash leaves none. Every gateway sharing a Redis prefix must see
the same folder (the policy's `batches.folder`). Blocking I/O: callers run it in a worker thread."""

from __future__ import annotations

import os
import re
from pathlib import Path

__all__ = ["FileStore"]

_ID = re.compile(r"file-[A-Za-z0-9-]{1,80}")


class FileStore:
    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def path(self, file_id: str) -> Path:
        if _ID.fullmatch(file_id) is None:  # ids are ours; a client's path never reaches the disk
            raise ValueError(f"not a file id: {file_id!r}")
        return self.folder / f"{file_id}.jsonl"

    def write(self, file_id: str, content: bytes) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        target = self.path(file_id)
        partial = target.with_suffix(".part")
        with open(partial, "wb") as out:
            out.write(content)
            out.flush()
            os.fsync(out.fileno())
        os.replace(partial, target)

    def read(self, file_id: str) -> bytes:
        """The file's bytes; FileNotFoundError when it is gone."""
        return self.path(file_id).read_bytes()

    def delete(self, file_id: str) -> None:
        self.path(file_id).unlink(missing_ok=True)
