"""The training embedding cache when several processes fill one file at once."""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from router_models.embedders.disk_cache import _save, embed_cached


class _Fake:
    name, dim, cache_tag = "fake:len", 2, ""

    def __init__(self, delay_s: float = 0.0) -> None:
        self._delay = delay_s

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        time.sleep(self._delay)  # a real model takes time: the processes overlap
        return np.asarray([[len(t), 1.0] for t in texts], dtype=np.float32)


def _fill(cache_dir: str, texts: list[str]) -> None:
    embed_cached(_Fake(delay_s=2.0), texts, Path(cache_dir))


def test_a_save_keeps_what_another_process_saved_after_this_one_read(tmp_path: Path) -> None:
    path = tmp_path / "fake_len.npz"
    late = {"bb": np.asarray([2.0, 1.0], dtype=np.float32)}  # read the cache while it was empty, then embedded
    embed_cached(_Fake(), ["a"], tmp_path)  # another process saves first
    _save(path, late)
    assert len(np.load(path)["keys"]) == 2  # "a" under its sha1 key, "bb" as saved


def test_processes_filling_one_cache_at_once_neither_crash_nor_lose_vectors(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    batches = [[f"{w}-{i}" for i in range(600)] for w in range(3)]  # several checkpoints each
    procs = [ctx.Process(target=_fill, args=(str(tmp_path), b)) for b in batches]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    every = [t for b in batches for t in b]
    assert len(np.load(tmp_path / "fake_len.npz")["keys"]) == len(every)
    assert np.array_equal(embed_cached(_Fake(), every, tmp_path)[:, 0], [len(t) for t in every])
    assert not list(tmp_path.glob("*.tmp.npz"))
