"""The semantic mode's rows and its nearest-neighbour scan (numpy, pure).

A row is what the vector hash keeps per cached prompt: the 8-byte context digest it must share with a request
(`keys.context_digest`), the UTC second it was stored, and the router's embedding of the prompt, normalised and
quantised to int8 (x 127). int8 keeps a row at ~400 bytes for a 384-wide embedder, so a lookup reads and scans a
thousand rows in about a millisecond (BENCHMARKS.md, "Response cache"); the quantisation moves a cosine by less
than 0.01 (measured there too: the threshold is set on the quantised similarity this scan computes).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

__all__ = ["Nearest", "encode_row", "nearest", "quantise", "similarity"]

_SCALE = 127.0


def quantise(vector: npt.NDArray[np.floating]) -> npt.NDArray[np.int8]:
    """`vector` normalised to unit length, as int8 (x 127). A zero vector stays zero (it matches nothing)."""
    v = np.asarray(vector, dtype=np.float32).ravel()
    norm = float(np.linalg.norm(v))
    unit = v / norm if norm > 0 else v
    out: npt.NDArray[np.int8] = np.clip(np.rint(unit * _SCALE), -127, 127).astype(np.int8)
    return out


def similarity(a: npt.NDArray[np.int8], b: npt.NDArray[np.int8]) -> float:
    """The cosine similarity the scan computes for two quantised vectors."""
    return float(np.dot(a.astype(np.float32), b.astype(np.float32)) / (_SCALE * _SCALE))


def encode_row(context: bytes, stored_at: float, vector: npt.NDArray[np.int8]) -> bytes:
    if len(context) != 8:
        raise ValueError("the context digest is 8 bytes")
    return context + int(stored_at).to_bytes(4, "little") + vector.tobytes()


class Nearest:
    """The best row found: its field (entry id) and its similarity."""

    __slots__ = ("field", "similarity")

    def __init__(self, field: bytes, similarity: float) -> None:
        self.field = field
        self.similarity = similarity


def nearest(rows: Mapping[bytes, bytes], query: npt.NDArray[np.int8], context: bytes,
            not_before: float) -> tuple[Nearest | None, int]:
    """The row most similar to `query` among those with this `context`, stored at or after `not_before` (UTC
    epoch s), and the number of rows that could not be read (wrong size: dropped by the caller). None: no row."""
    width = 12 + query.shape[0]
    fields = [f for f, row in rows.items() if len(row) == width]
    bad = len(rows) - len(fields)
    if not fields:
        return None, bad
    kind = np.dtype([("ctx", "<u8"), ("at", "<u4"), ("v", "i1", (query.shape[0],))])
    table = np.frombuffer(b"".join(rows[f] for f in fields), dtype=kind)
    live = (table["ctx"] == int.from_bytes(context, "little")) & (table["at"] >= int(not_before))
    if not live.any():
        return None, bad
    sims = table["v"][live].astype(np.float32) @ query.astype(np.float32) / (_SCALE * _SCALE)
    best = int(np.argmax(sims))
    return Nearest(np.asarray(fields, dtype=object)[live][best], float(sims[best])), bad
