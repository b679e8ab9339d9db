"""`backends.models.atomic_dir` on the real file system and kernel locks: a replaced directory is whole afterwards
with nothing set aside left behind, and the lock keeps out another process until the block ends."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from backends.models.atomic_dir import exclusive_lock, replace_dir

# exit 0 when the lock could be taken now, 1 when another process holds it
_TRY_LOCK = """
import fcntl, sys
with open(sys.argv[1], "a") as handle:
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        sys.exit(1)
"""


def _built(root: Path, name: str, text: str) -> Path:
    path = root / name
    path.mkdir()
    (path / "weights").write_text(text)
    return path


def test_replace_dir_puts_the_build_in_place_of_a_dir_a_link_or_nothing(tmp_path: Path) -> None:
    dest = tmp_path / "model"
    replace_dir(_built(tmp_path, ".build-1", "one"), dest)
    assert (dest / "weights").read_text() == "one"
    replace_dir(_built(tmp_path, ".build-2", "two"), dest)
    assert (dest / "weights").read_text() == "two"
    dest.rename(tmp_path / "elsewhere")
    dest.symlink_to(tmp_path / "elsewhere")
    replace_dir(_built(tmp_path, ".build-3", "three"), dest)
    assert not dest.is_symlink() and (dest / "weights").read_text() == "three"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere", "model"]  # nothing set aside is left


def test_the_lock_keeps_another_process_out_until_the_block_ends(tmp_path: Path) -> None:
    lock = tmp_path / "cache" / ".lock"  # its folder does not exist yet

    def other_process_gets_it() -> bool:
        return subprocess.run([sys.executable, "-c", _TRY_LOCK, str(lock)]).returncode == 0

    with exclusive_lock(lock):
        assert not other_process_gets_it()
    assert other_process_gets_it()
