"""A directory built aside and put in place whole: builds of it take turns across processes
(`exclusive_lock`), and the finished build is renamed over the old copy (`replace_dir`), so that a reader
finds the old directory whole, none, or the new one whole, never a part.

Used for the cached demo models (`backends.models.demo`) and quantized checkpoints (`backends.quantization.quantize`).
"""

from __future__ import annotations

import fcntl
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["exclusive_lock", "replace_dir"]


@contextmanager
def exclusive_lock(lock_file: Path) -> Iterator[None]:
    """Hold an advisory exclusive lock (`flock`) on `lock_file` for the block, waiting until no other process
    holds it. The file and its folder are created when missing and left in place; the lock goes with the
    process if it dies."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with lock_file.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def replace_dir(built: Path, dest: Path) -> None:
    """Rename `built` to `dest` (the same file system). An existing `dest`, or a link there, is first renamed
    aside to `.<name>.old-<random>` beside it and removed afterwards; a crash in between leaves that copy,
    which the caller's next build sweeps away (`.<name>.old-*`)."""
    old = dest.with_name(f".{dest.name}.old-{uuid.uuid4().hex[:8]}")
    if dest.exists() or dest.is_symlink():
        dest.rename(old)
    built.rename(dest)
    if old.is_symlink():
        old.unlink()  # rmtree refuses a link (and ignore_errors would hide that, leaving the link behind)
    else:
        shutil.rmtree(old, ignore_errors=True)
